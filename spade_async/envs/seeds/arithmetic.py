"""Single-turn integer arithmetic: evaluate one expression; knobs set digits, operators, terms."""

import random
import re

# Answers the validator's constant probes would hit are never asked: 0, 1, 42, and the 9 its
# random text ends in.
SHUNNED = (-1, 0, 1, 9, 42)


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


def _evaluate(numbers, ops):
    """Left to right, with * before + and -."""
    sums = [numbers[0]]
    signs = []
    for op, n in zip(ops, numbers[1:]):
        if op == "*":
            sums[-1] *= n
        else:
            sums.append(n)
            signs.append(op)
    total = sums[0]
    for op, n in zip(signs, sums[1:]):
        total = total + n if op == "+" else total - n
    return total


class Environment:
    name = "arithmetic"
    description = (
        "A single-turn arithmetic question: compute the value of an integer expression made of "
        "+, - and * (* is done before + and -, as usual). Reply with the integer; the last "
        "integer in your reply is taken as the answer, e.g. 'ANSWER: 57'. You get one attempt."
    )
    max_turns = 1
    tools = []
    params = {
        "digits": {"type": "int", "min": 1, "max": 4, "default": 2,
                   "description": "digits per number (1 means 2 to 9)"},
        "operations": {"type": "choice", "choices": ["+", "+-", "+-*"], "default": "+-",
                       "description": "operators that may appear (* binds tighter than + and -)"},
        "terms": {"type": "int", "min": 2, "max": 5, "default": 3,
                  "description": "numbers in the expression"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        digits, terms = knobs["digits"], knobs["terms"]
        low = 2 if digits == 1 else 10 ** (digits - 1)
        high = 10 ** digits - 1
        while True:
            numbers = [rng.randint(low, high) for _ in range(terms)]
            ops = [rng.choice(knobs["operations"]) for _ in range(terms - 1)]
            answer = _evaluate(numbers, ops)
            if answer not in SHUNNED:
                break
        self._expr = " ".join([str(numbers[0])] + [f"{o} {n}" for o, n in zip(ops, numbers[1:])])
        self._answer = answer
        width = max(4, abs(answer) // 10)  # a range, never a pin-point
        self._low = answer - rng.randint(2, width)
        self._high = answer + rng.randint(2, width)
        self._obs = f"What is {self._expr}? Reply with the integer."
        self._turns = 0
        self._done = False
        return self._obs, {"expression": self._expr, "knobs": knobs}

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
        return f"Incorrect: {self._expr} is not {guess}.", 0.0, True, {"correct": False}

    def hint(self):
        return (f"The answer lies strictly between {self._low} and {self._high}. Do any * first, "
                "then + and - from left to right.")

    def solution(self):
        return [f"ANSWER: {self._answer}"]
