"""Single-turn logic puzzle: who sits where in a row of five seats, from clues with a unique answer."""

import itertools
import random
import re

POOL = ["Ava", "Ben", "Cleo", "Dan", "Eve", "Finn", "Gia", "Hugo", "Iris", "Jack", "Kara", "Leo"]
KINDS = ["left_of", "imm_left", "adjacent", "not_adjacent", "one_between", "end", "not_end",
         "not_seat", "left_of", "adjacent", "not_seat", "seat"]


def _holds(clue, pos):
    kind = clue[0]
    if kind == "seat":
        return pos[clue[1]] == clue[2]
    if kind == "not_seat":
        return pos[clue[1]] != clue[2]
    if kind == "end":
        return pos[clue[1]] in (1, 5)
    if kind == "not_end":
        return pos[clue[1]] not in (1, 5)
    a, b = pos[clue[1]], pos[clue[2]]
    if kind == "left_of":
        return a < b
    if kind == "imm_left":
        return a + 1 == b
    if kind == "adjacent":
        return abs(a - b) == 1
    if kind == "not_adjacent":
        return abs(a - b) != 1
    return abs(a - b) == 2  # one_between


def _text(clue):
    kind, x = clue[0], clue[1]
    y = clue[2] if len(clue) > 2 else None
    return {
        "seat": f"{x} sits in seat {y}.",
        "not_seat": f"{x} does not sit in seat {y}.",
        "end": f"{x} sits at one end of the row.",
        "not_end": f"{x} does not sit at either end of the row.",
        "left_of": f"{x} sits somewhere to the left of {y}.",
        "imm_left": f"{x} sits immediately to the left of {y}.",
        "adjacent": f"{x} and {y} sit next to each other.",
        "not_adjacent": f"{x} and {y} do not sit next to each other.",
        "one_between": f"Exactly one person sits between {x} and {y}.",
    }[kind]


def _positions(order):
    return {name: i + 1 for i, name in enumerate(order)}


class Environment:
    name = "seating_logic"
    description = (
        "A single-turn logic puzzle. Five people sit in a row of seats numbered 1 (leftmost) to 5 "
        "(rightmost). From the clues, work out who sits in each seat; exactly one arrangement fits "
        "all clues. Reply with 'ANSWER: ' followed by the five names from seat 1 to seat 5, "
        "separated by commas, e.g. 'ANSWER: Ann, Bob, Cy, Di, Ed'. Nothing may follow the names. "
        "You get one attempt."
    )
    max_turns = 1
    tools = []

    _done = True
    _turns = 0

    def reset(self, seed):
        rng = random.Random(seed)
        people = rng.sample(POOL, 5)
        secret = people[:]
        rng.shuffle(secret)
        secret_pos = _positions(secret)
        cands = [_positions(p) for p in itertools.permutations(people)]
        clues = []
        while len(cands) > 1:
            kind = rng.choice(KINDS)
            if kind in ("seat", "not_seat"):
                clue = (kind, rng.choice(people), rng.randint(1, 5))
            elif kind in ("end", "not_end"):
                clue = (kind, rng.choice(people))
            else:
                x, y = rng.sample(people, 2)
                clue = (kind, x, y)
            if not _holds(clue, secret_pos):
                continue
            kept = [c for c in cands if _holds(clue, c)]
            if len(kept) < len(cands):
                clues.append(clue)
                cands = kept
        everyone = [_positions(p) for p in itertools.permutations(people)]
        for clue in list(clues):
            rest = [c for c in clues if c != clue]
            if sum(1 for p in everyone if all(_holds(c, p) for c in rest)) == 1:
                clues = rest
        rng.shuffle(clues)
        self._secret = secret
        self._people = people
        self._clues = [_text(c) for c in clues]
        self._obs = ("Five people: " + ", ".join(sorted(people)) + ". Seats are numbered 1 to 5 "
                     "from left to right.\nClues:\n" + "\n".join(
                         f"  {i + 1}. {t}" for i, t in enumerate(self._clues))
                     + "\nReply 'ANSWER: <seat 1>, <seat 2>, <seat 3>, <seat 4>, <seat 5>'.")
        self._turns = 0
        self._done = False
        return self._obs, {"people": sorted(people), "clues": len(self._clues)}

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
        parts = re.split(r"answer\s*:", action, flags=re.IGNORECASE)
        body = parts[-1].strip().rstrip(".").strip()
        tokens = [t for t in re.split(r"[,\s]+", body) if t]
        known = {p.lower(): p for p in self._people}
        if len(tokens) != 5 or any(t.lower() not in known for t in tokens):
            return ("Could not read five names from your reply (format: 'ANSWER: A, B, C, D, E').",
                    0.0, False, {"correct": False})
        order = [known[t.lower()] for t in tokens]
        if order == self._secret:
            return "Correct!", 1.0, True, {"correct": True}
        return "Incorrect arrangement.", 0.0, True, {"correct": False}

    def hint(self):
        return (f"{self._secret[0]} sits in seat 1 and {self._secret[3]} sits in seat 4; use the "
                "clues to place the other three.")

    def solution(self):
        return ["ANSWER: " + ", ".join(self._secret)]
