"""Single-turn code tracing: run a small generated Python program in your head, report a variable."""

import random
import re

NAMES = ("a", "b", "c")
CMPS = ("<", ">", "==", "!=")
# Answers the validator's constant probes would hit: 42, and the 9 its random text ends in.
SHUNNED = (9, 42)
OPERATORS = {"+": ["+"], "+-": ["+", "-"], "all": ["+", "+", "-", "-", "*", "//", "%"]}


def _resolve(specs, given):
    """The knob values of one episode: the given ones, the defaults for the rest, in range."""
    given = given if isinstance(given, dict) else {}
    out = {}
    for key, spec in specs.items():
        value = given.get(key, spec["default"])
        if spec["type"] == "int":
            value = min(spec["max"], max(spec["min"], int(value)))
        elif spec["type"] == "float":
            value = min(spec["max"], max(spec["min"], float(value)))
        elif spec["type"] == "bool":
            value = bool(value)
        elif value not in spec["choices"]:
            value = spec["default"]
        out[key] = value
    return out


def _last_int(text):
    found = re.findall(r"-?\d+", text)
    if not found or len(found[-1]) > 30:
        return None
    return int(found[-1])


def _operand(rng, in_loop, target, names):
    roll = rng.random()
    if in_loop and roll < 0.25:
        return ("var", "i")
    if roll < 0.65:
        return ("var", rng.choice([n for n in names if n != target] or list(names)))
    return ("const", rng.randint(1, 9))


def _assign(rng, in_loop, names, operators):
    target = rng.choice(names)
    op = rng.choice(operators)
    left = ("var", target) if rng.random() < 0.6 else _operand(rng, in_loop, target, names)
    if op == "*":
        right = ("const", rng.randint(2, 3))
    elif op in ("//", "%"):
        right = ("const", rng.randint(2, 5))
    else:
        right = _operand(rng, in_loop, target, names)
        while right == left:
            right = ("const", rng.randint(1, 9))
    return ("assign", target, left, op, right)


def _cond(rng, names):
    var = rng.choice(names)
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

    params = {
        "loop": {"type": "int", "min": 0, "max": 5, "default": 5,
                 "description": "most loop iterations (0: no loop, straight-line code)"},
        "statements": {"type": "int", "min": 1, "max": 3, "default": 2,
                       "description": "most assignments in the loop body (besides the if)"},
        "branch": {"type": "bool", "default": True, "description": "an if/else in the body"},
        "operators": {"type": "choice", "choices": ["+", "+-", "all"], "default": "all",
                      "description": "arithmetic used: +; + and -; also *, //, %"},
        "variables": {"type": "int", "min": 1, "max": 3, "default": 3,
                      "description": "variables in the program"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        names = NAMES[:knobs["variables"]]
        operators = OPERATORS[knobs["operators"]]
        looped = knobs["loop"] > 0
        while True:
            init = [("assign", n, ("const", rng.randint(1, 9)), "+", ("const", 0)) for n in names]
            body = [_assign(rng, looped, names, operators)
                    for _ in range(rng.randint(1, knobs["statements"]))]
            if knobs["branch"]:
                other = [_assign(rng, looped, names, operators)] if rng.random() < 0.7 else []
                body.insert(rng.randint(0, len(body)), ("if", _cond(rng, names),
                                                        [_assign(rng, looped, names, operators)],
                                                        other))
            ask = None
            if looped:
                code = [("for", rng.randint(min(3, knobs["loop"]), knobs["loop"]), body)]
                ask = rng.choice(names)
                src = [n for n in names if n != ask] or [ask]
                signs = ["+", "-"] if "-" in operators else ["+"]
                final = [("assign", ask, ("var", ask), rng.choice(signs),
                          ("var", rng.choice(src)))]
            else:  # straight-line code; the hint shows the values before its last line
                code, final = body[:-1], body[-1:]
                ask = rng.choice(names)
            env = {}
            try:
                _run(init, env)
                start = {n: env[n] for n in names}
                _run(code, env)
                before = {n: env[n] for n in names}
                _run(final, env)
            except OverflowError:
                continue
            answer = env[ask]
            if abs(answer) < 3 or answer in SHUNNED or answer == start[ask]:
                continue
            shown = before if looped or len(body) > 1 else {}
            if answer in shown.values():  # the hint must not hold the answer
                continue
            if looped and knobs["branch"] and len(set(env["seen"])) < 2:
                continue  # the if must go both ways during the loop
            break
        lines = [f"{n} = {s[2][1]}" for n, s in zip(names, init)] + _render(code + final)
        self._program = "\n".join(lines)
        self._ask, self._answer, self._shown, self._looped = ask, answer, shown, looped
        self._obs = (f"Program:\n{self._program}\n\nWhat is the value of {ask} after the program "
                     "finishes? Reply 'ANSWER: <integer>'.")
        self._turns = 0
        self._done = False
        return self._obs, {"variable": ask, "lines": len(lines), "knobs": knobs}

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
        vals = ", ".join(f"{n}={v}" for n, v in self._shown.items())
        if self._looped:
            return f"Right after the for loop finishes: {vals}. Only the last line remains."
        if vals:
            return f"Just before the last statement runs: {vals}."
        return (f"Only the last line changes a variable: put the values set above it into it "
                f"and compute {self._ask}.")

    def solution(self):
        return [f"ANSWER: {self._answer}"]
