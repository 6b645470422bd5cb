"""Single-turn linear algebra: solve an integer linear system of 1 to 3 unknowns (unique solution)."""

import random
import re

VARS = ("x", "y", "z")
# A lone unknown never takes a value the validator's constant probes would hit: 0, 1, and the 9
# its random text ends in.
SHUNNED = (0, 1, 9)


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


def _det3(m):
    return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))


def _det(m):
    if len(m) == 1:
        return m[0][0]
    if len(m) == 2:
        return m[0][0] * m[1][1] - m[0][1] * m[1][0]
    return _det3(m)


def _equation(row, rhs, offset=0):
    text = ""
    for coef, var in zip(row, VARS):
        if coef == 0:
            continue
        mag = "" if abs(coef) == 1 else str(abs(coef))
        if not text:
            text = ("-" if coef < 0 else "") + mag + var
        else:
            text += (" - " if coef < 0 else " + ") + mag + var
    if offset:
        text += (" - " if offset < 0 else " + ") + str(abs(offset))
    return f"{text} = {rhs}"


def _parse(text, n):
    named = {}
    for var in VARS[:n]:
        hits = re.findall(var + r"\s*=\s*(-?\d{1,12})(?!\d)", text, flags=re.IGNORECASE)
        if hits:
            named[var] = int(hits[-1])
    if len(named) == n:
        return tuple(named[v] for v in VARS[:n])
    nums = re.findall(r"-?\d+", text)
    if len(nums) < n or any(len(m) > 12 for m in nums[-n:]):
        return None
    return tuple(int(m) for m in nums[-n:])


class Environment:
    name = "linear_system"
    description = (
        "A single-turn algebra task: solve a system of linear equations in x, y and z (the task "
        "may have fewer unknowns: one equation in x, or two in x and y). The system has exactly "
        "one solution and it is made of integers. Reply in the form 'x=<int>, y=<int>, z=<int>' "
        "with the unknowns the task has (if those labels are missing, the last integers of your "
        "reply are read in order). You get one attempt."
    )
    max_turns = 1
    tools = []

    params = {
        "unknowns": {"type": "int", "min": 1, "max": 3, "default": 3,
                     "description": "unknowns and equations (1: one equation a*x + b = c)"},
        "coef_max": {"type": "int", "min": 1, "max": 6, "default": 6,
                     "description": "largest coefficient size"},
        "value_max": {"type": "int", "min": 5, "max": 9, "default": 9,
                      "description": "largest size of a solution value"},
        "negatives": {"type": "bool", "default": True,
                      "description": "negative coefficients and solution values may appear"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        n, c, v = knobs["unknowns"], knobs["coef_max"], knobs["value_max"]
        names = VARS[:n]
        low_c, low_v = (-c, -v) if knobs["negatives"] else (0, 0)
        while True:
            sol = [rng.randint(low_v, v) for _ in names]
            if (n > 1 and sum(1 for x in sol if x in (0, 1)) > 1) or (n == 1 and sol[0] in SHUNNED):
                continue
            mat = [[rng.randint(low_c, c) for _ in names] for _ in names]
            if any(all(x == 0 for x in row) for row in mat):
                continue
            if _det(mat) != 0:
                break
        offset = 0
        while n == 1:  # one equation a*x + b = c: the constant gives it a step to undo
            offset = rng.choice([-1, 1]) * rng.randint(1, 9)
            if knobs["negatives"] or mat[0][0] * sol[0] + offset > 0:
                break
        rhs = [sum(a * x for a, x in zip(row, sol)) + offset for row in mat]
        self._sol, self._mat, self._rhs, self._n = tuple(sol), mat, rhs, n
        eqs = [_equation(row, r, offset) for row, r in zip(mat, rhs)]
        ask = ", ".join(f"{x}=<int>" for x in names)
        if n == 1:
            self._obs = f"Solve for x:\n  {eqs[0]}\nReply with {ask}."
        else:
            self._obs = ("Solve the system:\n" + "\n".join(f"  ({i + 1}) {e}"
                                                           for i, e in enumerate(eqs))
                         + f"\nReply with {ask}.")
        spread = max(3, v // 2)
        self._bracket = (sol[0] - rng.randint(2, spread), sol[0] + rng.randint(2, spread))
        self._turns = 0
        self._done = False
        return self._obs, {"equations": eqs, "knobs": knobs}

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
        got = _parse(action, self._n)
        if got is None:
            return (f"Could not read {', '.join(VARS[:self._n])} from your reply.", 0.0, False,
                    {"correct": False})
        if got == self._sol:
            return "Correct!", 1.0, True, {"correct": True}
        bad = [v for v, g, s in zip(VARS, got, self._sol) if g != s]
        return f"Incorrect ({', '.join(bad)} wrong).", 0.0, True, {"correct": False}

    def hint(self):
        if self._n == 3:
            return (f"x = {self._sol[0]}. Substitute it into two of the equations to get a 2x2 "
                    "system in y and z.")
        if self._n == 2:
            return (f"x = {self._sol[0]}. Substitute it into either equation to find y.")
        low, high = self._bracket
        return (f"Undo the constant first, then divide by the coefficient of x; x lies strictly "
                f"between {low} and {high}.")

    def solution(self):
        return [", ".join(f"{x}={val}" for x, val in zip(VARS, self._sol))]
