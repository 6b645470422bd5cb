"""Single-turn logic puzzle: who sits where in a row of five seats, from clues with a unique answer."""

import itertools
import random
import re

POOL = ["Ava", "Ben", "Cleo", "Dan", "Eve", "Finn", "Gia", "Hugo", "Iris", "Jack", "Kara", "Leo"]
KINDS = ["left_of", "imm_left", "adjacent", "not_adjacent", "one_between", "end", "not_end",
         "not_seat", "left_of", "adjacent", "not_seat", "seat"]
DIRECT = ["seat", "not_seat", "end", "not_end", "not_seat", "seat"]
COUNTS = ["no", "one", "Two", "Three", "Four", "Five", "Six"]


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


def _holds(clue, pos):
    kind = clue[0]
    ends = (1, len(pos))
    if kind == "seat":
        return pos[clue[1]] == clue[2]
    if kind == "not_seat":
        return pos[clue[1]] != clue[2]
    if kind == "end":
        return pos[clue[1]] in ends
    if kind == "not_end":
        return pos[clue[1]] not in ends
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
        "A single-turn logic puzzle. Some people (five unless the task says otherwise) sit in a "
        "row of seats numbered from 1 (leftmost) up, one seat each. From the clues, work out who "
        "sits in each seat; exactly one arrangement fits all clues. Reply with 'ANSWER: ' "
        "followed by the names from seat 1 to the last seat, separated by commas, e.g. 'ANSWER: "
        "Ann, Bob, Cy, Di, Ed'. Nothing may follow the names. You get one attempt."
    )
    max_turns = 1
    tools = []

    params = {
        "people": {"type": "int", "min": 2, "max": 6, "default": 5,
                   "description": "people and seats"},
        "relations": {"type": "bool", "default": True,
                      "description": "clues may relate two people (left of, next to, ...); off: "
                                     "only clues about one person's seat"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        n = knobs["people"]
        kinds = KINDS if knobs["relations"] else DIRECT
        people = rng.sample(POOL, n)
        secret = people[:]
        rng.shuffle(secret)
        secret_pos = _positions(secret)
        cands = [_positions(p) for p in itertools.permutations(people)]
        clues = []
        while len(cands) > 1:
            kind = rng.choice(kinds)
            if kind in ("seat", "not_seat"):
                clue = (kind, rng.choice(people), rng.randint(1, n))
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
        seats = ", ".join(f"<seat {i + 1}>" for i in range(n))
        self._obs = (f"{COUNTS[n]} people: " + ", ".join(sorted(people)) + f". Seats are numbered "
                     f"1 to {n} from left to right.\nClues:\n" + "\n".join(
                         f"  {i + 1}. {t}" for i, t in enumerate(self._clues))
                     + f"\nReply 'ANSWER: {seats}'.")
        self._turns = 0
        self._done = False
        return self._obs, {"people": sorted(people), "clues": len(self._clues), "knobs": knobs}

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
        if len(tokens) != len(self._people) or any(t.lower() not in known for t in tokens):
            return (f"Could not read {len(self._people)} names from your reply (format: "
                    f"'ANSWER: {', '.join('ABCDEF'[:len(self._people)])}').", 0.0, False,
                    {"correct": False})
        order = [known[t.lower()] for t in tokens]
        if order == self._secret:
            return "Correct!", 1.0, True, {"correct": True}
        return "Incorrect arrangement.", 0.0, True, {"correct": False}

    def hint(self):
        n = len(self._secret)
        if n >= 5:
            return (f"{self._secret[0]} sits in seat 1 and {self._secret[3]} sits in seat 4; use "
                    f"the clues to place the other {COUNTS[n - 2].lower()}.")
        if n >= 3:
            return (f"{self._secret[0]} sits in seat 1; use the clues to place the other "
                    f"{COUNTS[n - 1].lower()}.")
        return ("Seat 1 is the leftmost seat; a clue about one seat also places the other "
                "person.")

    def solution(self):
        return ["ANSWER: " + ", ".join(self._secret)]
