"""Single-turn modular arithmetic word problem (a Chinese remainder puzzle about a coin chest)."""

import itertools
import math
import random
import re

MODULI = [3, 4, 5, 7, 8, 9, 11, 13]
GROUPS = ["pirates", "sailors", "knights", "merchants", "monks", "thieves", "dwarves"]


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
        "several sizes, and a lower bound on the total. Find the smallest number of coins that "
        "fits every fact. Reply with that number; the last integer in your reply is taken as your "
        "answer, e.g. 'ANSWER: 1234'. You get one attempt."
    )
    max_turns = 1
    tools = []

    _done = True
    _turns = 0

    def reset(self, seed):
        rng = random.Random(seed)
        while True:
            mods = rng.sample(MODULI, 3)
            if all(math.gcd(a, b) == 1 for a, b in itertools.combinations(mods, 2)):
                break
        rems = [rng.randint(1, m - 1) for m in mods]
        groups = rng.sample(GROUPS, 3)
        big = mods[0] * mods[1] * mods[2]
        residue = next(x for x in range(big) if all(x % m == r for m, r in zip(mods, rems)))
        pair = mods[0] * mods[1]
        self._pair_residue = next(x for x in range(pair) if x % mods[0] == rems[0]
                                  and x % mods[1] == rems[1])
        bound = rng.randint(200, 5000)
        self._answer = bound + 1 + (residue - (bound + 1)) % big
        self._mods, self._rems, self._residue, self._big = mods, rems, residue, big
        lines = ["A chest holds an unknown number of gold coins."]
        for g, m, r in zip(groups, mods, rems):
            word = "coin is" if r == 1 else "coins are"
            lines.append(f"If the coins are shared equally among {m} {g}, {r} {word} left over.")
        lines.append(f"The chest holds more than {bound} coins.")
        lines.append("What is the smallest possible number of coins in the chest?")
        self._obs = " ".join(lines)
        self._turns = 0
        self._done = False
        return self._obs, {"moduli": list(mods), "lower_bound": bound}

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
        m0, m1, _ = self._mods
        return (f"The first two facts together mean N = {self._pair_residue} (mod {m0 * m1}); all "
                f"three facts mean N = {self._residue} (mod {self._big}). Take the smallest such "
                "N above the bound.")

    def solution(self):
        return [f"ANSWER: {self._answer}"]
