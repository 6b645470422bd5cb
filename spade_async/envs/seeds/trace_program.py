"""Single-turn code tracing: run a small generated Python program in your head, report a variable."""

import random
import re

NAMES = ("a", "b", "c")
CMPS = ("<", ">", "==", "!=")


def _last_int(text):
    found = re.findall(r"-?\d+", text)
    if not found or len(found[-1]) > 30:
        return None
    return int(found[-1])


def _operand(rng, in_loop, target):
    roll = rng.random()
    if in_loop and roll < 0.25:
        return ("var", "i")
    if roll < 0.65:
        return ("var", rng.choice([n for n in NAMES if n != target] or list(NAMES)))
    return ("const", rng.randint(1, 9))


def _assign(rng, in_loop):
    target = rng.choice(NAMES)
    op = rng.choice(["+", "+", "-", "-", "*", "//", "%"])
    left = ("var", target) if rng.random() < 0.6 else _operand(rng, in_loop, target)
    if op == "*":
        right = ("const", rng.randint(2, 3))
    elif op in ("//", "%"):
        right = ("const", rng.randint(2, 5))
    else:
        right = _operand(rng, in_loop, target)
        while right == left:
            right = ("const", rng.randint(1, 9))
    return ("assign", target, left, op, right)


def _cond(rng):
    var = rng.choice(NAMES)
    if rng.random() < 0.4:
        return (var, "mod2")
    return (var, rng.choice(CMPS), rng.randint(0, 12))


def _value(term, env):
    return env[term[1]] if term[0] == "var" else term[1]


def _run(stmts, env):
    for s in stmts:
        if s[0] == "assign":
            _, target, left, op, right = s
            x, y = _value(left, env), _value(right, env)
            env[target] = {"+": x + y, "-": x - y, "*": x * y,
                           "//": x // y if y else 0, "%": x % y if y else 0}[op]
        elif s[0] == "if":
            _, cond, then, other = s
            v = env[cond[0]]
            if cond[1] == "mod2":
                ok = v % 2 == 0
            else:
                ok = {"<": v < cond[2], ">": v > cond[2], "==": v == cond[2],
                      "!=": v != cond[2]}[cond[1]]
            env.setdefault("seen", []).append(ok)
            _run(then if ok else other, env)
        else:  # for
            _, count, body = s
            for i in range(count):
                env["i"] = i
                _run(body, env)
        if any(abs(env.get(n, 0)) > 100000 for n in NAMES):
            raise OverflowError("values too large")


def _render(stmts, depth=0):
    pad = "    " * depth
    lines = []
    for s in stmts:
        if s[0] == "assign":
            _, target, left, op, right = s
            lines.append(f"{pad}{target} = {left[1]} {op} {right[1]}")
        elif s[0] == "if":
            _, cond, then, other = s
            test = f"{cond[0]} % 2 == 0" if cond[1] == "mod2" else f"{cond[0]} {cond[1]} {cond[2]}"
            lines.append(f"{pad}if {test}:")
            lines += _render(then, depth + 1)
            if other:
                lines.append(f"{pad}else:")
                lines += _render(other, depth + 1)
        else:
            lines.append(f"{pad}for i in range({s[1]}):")
            lines += _render(s[2], depth + 1)
    return lines


class Environment:
    name = "trace_program"
    description = (
        "A single-turn code-tracing task. You are shown a short Python program that uses only "
        "integers, +, -, *, // (floor division), % (modulo, Python semantics), if/else and a for "
        "loop. Work out the value of the asked variable when the program ends. Reply with the "
        "integer, e.g. 'ANSWER: -17'; the last integer in your reply is taken as the answer. You "
        "get one attempt."
    )
    max_turns = 1
    tools = []

    _done = True
    _turns = 0

    def reset(self, seed):
        rng = random.Random(seed)
        while True:
            init = [("assign", n, ("const", rng.randint(1, 9)), "+", ("const", 0)) for n in NAMES]
            body = [_assign(rng, True) for _ in range(rng.randint(1, 2))]
            other = [_assign(rng, True)] if rng.random() < 0.7 else []
            body.insert(rng.randint(0, len(body)), ("if", _cond(rng), [_assign(rng, True)], other))
            loop = ("for", rng.randint(3, 5), body)
            ask = rng.choice(NAMES)
            src = [n for n in NAMES if n != ask]
            final = [("assign", ask, ("var", ask), rng.choice(["+", "-"]), ("var", rng.choice(src)))]
            env = {}
            try:
                _run(init, env)
                _run([loop], env)
                after_loop = {n: env[n] for n in NAMES}
                _run(final, env)
            except OverflowError:
                continue
            answer = env[ask]
            if abs(answer) < 3 or answer == 42 or after_loop[ask] == answer:
                continue
            if len(set(env["seen"])) < 2:  # the if must go both ways during the loop
                continue
            break
        lines = [f"{n} = {s[2][1]}" for n, s in zip(NAMES, init)] + _render([loop] + final)
        self._program = "\n".join(lines)
        self._ask, self._answer, self._after = ask, answer, after_loop
        self._obs = (f"Program:\n{self._program}\n\nWhat is the value of {ask} after the program "
                     "finishes? Reply 'ANSWER: <integer>'.")
        self._turns = 0
        self._done = False
        return self._obs, {"variable": ask, "lines": len(lines)}

    def step(self, action):
        if self._done:
            return "episode is over", 0.0, True, False, {}
        self._turns += 1
        try:
            obs, reward, term, info = self._act(str(action))
        except Exception as exc:  # step must never raise
            obs, reward, term, info = "internal error: " + str(exc)[:200], 0.0, False, {}
        trunc = (not term) and self._turns >= self.max_turns
        self._done = term or trunc
        return obs, float(reward), term, trunc, info

    def _act(self, action):
        guess = _last_int(action)
        if guess is None:
            return "No integer found in your reply.", 0.0, False, {"correct": False}
        if guess == self._answer:
            return "Correct!", 1.0, True, {"correct": True}
        return f"Incorrect: {self._ask} is not {guess} at the end.", 0.0, True, {"correct": False}

    def hint(self):
        vals = ", ".join(f"{n}={self._after[n]}" for n in NAMES)
        return f"Right after the for loop finishes: {vals}. Only the last line remains."

    def solution(self):
        return [f"ANSWER: {self._answer}"]
