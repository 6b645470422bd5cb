"""Single-turn linear algebra: solve a 3x3 integer linear system with a unique integer solution."""

import random
import re

VARS = ("x", "y", "z")


def _det3(m):
    return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))


def _equation(row, rhs):
    text = ""
    for coef, var in zip(row, VARS):
        if coef == 0:
            continue
        mag = "" if abs(coef) == 1 else str(abs(coef))
        if not text:
            text = ("-" if coef < 0 else "") + mag + var
        else:
            text += (" - " if coef < 0 else " + ") + mag + var
    return f"{text} = {rhs}"


def _parse(text):
    named = {}
    for var in VARS:
        hits = re.findall(var + r"\s*=\s*(-?\d{1,12})(?!\d)", text, flags=re.IGNORECASE)
        if hits:
            named[var] = int(hits[-1])
    if len(named) == 3:
        return tuple(named[v] for v in VARS)
    nums = re.findall(r"-?\d+", text)
    if len(nums) < 3 or any(len(n) > 12 for n in nums[-3:]):
        return None
    return tuple(int(n) for n in nums[-3:])


class Environment:
    name = "linear_system"
    description = (
        "A single-turn algebra task: solve a system of three linear equations in x, y and z. The "
        "system has exactly one solution and it is made of integers. Reply in the form "
        "'x=<int>, y=<int>, z=<int>' (if those labels are missing, the last three integers of "
        "your reply are read as x, y, z). You get one attempt."
    )
    max_turns = 1
    tools = []

    _done = True
    _turns = 0

    def reset(self, seed):
        rng = random.Random(seed)
        while True:
            sol = [rng.randint(-9, 9) for _ in VARS]
            if sum(1 for v in sol if v in (0, 1)) > 1:
                continue
            mat = [[rng.randint(-6, 6) for _ in VARS] for _ in VARS]
            if any(all(c == 0 for c in row) for row in mat):
                continue
            if _det3(mat) != 0:
                break
        rhs = [sum(c * v for c, v in zip(row, sol)) for row in mat]
        self._sol, self._mat, self._rhs = tuple(sol), mat, rhs
        eqs = [_equation(row, r) for row, r in zip(mat, rhs)]
        self._obs = ("Solve the system:\n" + "\n".join(f"  ({i + 1}) {e}" for i, e in enumerate(eqs))
                     + "\nReply with x=<int>, y=<int>, z=<int>.")
        self._turns = 0
        self._done = False
        return self._obs, {"equations": eqs}

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
        got = _parse(action)
        if got is None:
            return "Could not read x, y and z from your reply.", 0.0, False, {"correct": False}
        if got == self._sol:
            return "Correct!", 1.0, True, {"correct": True}
        bad = [v for v, g, s in zip(VARS, got, self._sol) if g != s]
        return f"Incorrect ({', '.join(bad)} wrong).", 0.0, True, {"correct": False}

    def hint(self):
        return (f"x = {self._sol[0]}. Substitute it into two of the equations to get a 2x2 system "
                "in y and z.")

    def solution(self):
        x, y, z = self._sol
        return [f"x={x}, y={y}, z={z}"]
