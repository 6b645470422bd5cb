"""Single-turn modular arithmetic word problem (a Chinese remainder puzzle about a coin chest)."""

import itertools
import math
import random
import re

MODULI = [3, 4, 5, 7, 8, 9, 11, 13]
# Answers the validator's constant probes would hit: 42, and the 9 its random text ends in.
SHUNNED = (9, 42)
GROUPS = ["pirates", "sailors", "knights", "merchants", "monks", "thieves", "dwarves"]


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


class Environment:
    name = "modular_coins"
    description = (
        "A single-turn modular arithmetic word problem. A chest holds an unknown number of coins. "
        "You are told how many coins are left over when they are shared equally among groups of "
        "one or more sizes, and a lower bound on the total. Find the smallest number of coins that "
        "fits every fact. Reply with that number; the last integer in your reply is taken as your "
        "answer, e.g. 'ANSWER: 1234'. You get one attempt."
    )
    max_turns = 1
    tools = []

    params = {
        "facts": {"type": "int", "min": 1, "max": 3, "default": 3,
                  "description": "remainder facts (group sizes), pairwise coprime"},
        "moduli_max": {"type": "int", "min": 5, "max": 13, "default": 13,
                       "description": "largest group size"},
        "bound_max": {"type": "int", "min": 20, "max": 5000, "default": 5000,
                      "description": "largest lower bound on the total (bounds run from "
                                     "bound_max/25)"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        facts = knobs["facts"]
        moduli = [m for m in MODULI if m <= knobs["moduli_max"]]
        while True:
            while True:
                mods = rng.sample(moduli, facts)
                if all(math.gcd(a, b) == 1 for a, b in itertools.combinations(mods, 2)):
                    break
            rems = [rng.randint(1, m - 1) for m in mods]
            groups = rng.sample(GROUPS, facts)
            big = math.prod(mods)
            residue = next(x for x in range(big) if all(x % m == r for m, r in zip(mods, rems)))
            pair = math.prod(mods[:2])
            self._pair_residue = next(x for x in range(pair) if all(
                x % m == r for m, r in zip(mods[:2], rems[:2])))
            bound = rng.randint(max(1, knobs["bound_max"] // 25), knobs["bound_max"])
            self._answer = bound + 1 + (residue - (bound + 1)) % big
            if self._answer not in SHUNNED:
                break
        self._mods, self._rems, self._residue, self._big = mods, rems, residue, big
        self._bound = bound
        lines = ["A chest holds an unknown number of gold coins."]
        for g, m, r in zip(groups, mods, rems):
            word = "coin is" if r == 1 else "coins are"
            lines.append(f"If the coins are shared equally among {m} {g}, {r} {word} left over.")
        lines.append(f"The chest holds more than {bound} coins.")
        lines.append("What is the smallest possible number of coins in the chest?")
        self._obs = " ".join(lines)
        self._turns = 0
        self._done = False
        return self._obs, {"moduli": list(mods), "lower_bound": bound, "knobs": knobs}

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
            return "No integer found in your reply, so no answer was given.", 0.0, False, {
                "correct": False}
        if guess == self._answer:
            return "Correct!", 1.0, True, {"correct": True}
        return f"Incorrect: {guess} is not the smallest number that fits.", 0.0, True, {
            "correct": False}

    def hint(self):
        # Never a residue that is the answer itself (when it already lies above the bound).
        mods, answer = self._mods, self._answer
        parts = []
        if len(mods) >= 2 and self._pair_residue != answer:
            parts.append(f"The first two facts together mean N = {self._pair_residue} (mod "
                         f"{mods[0] * mods[1]})")
        if len(mods) == 3 and self._residue != answer:
            parts.append(f"all three facts mean N = {self._residue} (mod {self._big})")
        if not parts:
            return (f"Try the numbers above {self._bound} one by one and check every fact; the "
                    f"answer is below {self._bound + self._big + 1}.")
        return "; ".join(parts) + ". Take the smallest such N above the bound."

    def solution(self):
        return [f"ANSWER: {self._answer}"]
