"""Multi-turn code breaking: Mastermind with black and white peg feedback."""

import itertools
import random
import re

COLORS = "RGBYOP"
COLOR_NAMES = {"R": "red", "G": "green", "B": "blue", "Y": "yellow", "O": "orange", "P": "purple"}
ORDINALS = ["first", "second", "third", "fourth", "fifth"]


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


def _score(secret, guess):
    black = sum(1 for s, g in zip(secret, guess) if s == g)
    common = sum(min(secret.count(c), guess.count(c)) for c in COLORS)
    return black, common - black


def _parse(text, length, palette):
    body = re.sub(r"^\s*guess\s*:", "", text, flags=re.IGNORECASE)
    body = re.sub(r"[\s,\-]+", "", body).upper()
    if len(body) != length or any(c not in palette for c in body):
        return None
    return body


class Environment:
    name = "mastermind"
    description = (
        "Mastermind over several turns. A secret code of pegs (4 unless the task says otherwise) "
        "is drawn from the colors R (red), G (green), B (blue), Y (yellow), O (orange), P "
        "(purple), or the first few of them as the task says; colors may repeat. Each turn reply "
        "with exactly one guess of that many color letters and nothing else, e.g. 'GUESS: RGBY' "
        "or 'RGBY'. The feedback gives black pegs (right color in the right position) and white "
        "pegs (right color in the wrong position); the first observation may also show the "
        "score of a free opening guess. All pegs black wins. The task says how many guesses you "
        "have (at most 10)."
    )
    max_turns = 10
    tools = []

    params = {
        "length": {"type": "int", "min": 1, "max": 5, "default": 4,
                   "description": "pegs in the code"},
        "colors": {"type": "int", "min": 2, "max": 6, "default": 6,
                   "description": "colors in play (the first ones of R G B Y O P)"},
        "guesses": {"type": "int", "min": 1, "max": 10, "default": 10, "easy": 10,
                    "description": "guesses allowed"},
        "opening": {"type": "bool", "default": True, "easy": True,
                    "description": "a free opening guess and its score are shown at the start"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        length, palette = knobs["length"], COLORS[:knobs["colors"]]
        self._length, self._palette, self._budget = length, palette, knobs["guesses"]
        self._secret = "".join(rng.choice(palette) for _ in range(length))
        self._opening = None
        self._history = []
        shown = ""
        if knobs["opening"]:
            while True:
                opening = "".join(rng.choice(palette) for _ in range(length))
                if opening != self._secret:
                    break
            black, white = _score(self._secret, opening)
            self._opening = [opening, black, white]
            self._history = [list(self._opening)]
            shown = (f" A free opening guess was played for you: {opening} scores {black} black, "
                     f"{white} white.")
        self._turns = 0
        self._done = False
        pegs = "peg" if length == 1 else "pegs"
        obs = (f"A secret code of {length} {pegs} from the colors {' '.join(palette)} (repeats "
               f"allowed) is set.{shown} You have {self._budget} guesses. Reply "
               f"'GUESS: {'X' * length}'.")
        info = {"colors": palette, "length": length, "knobs": knobs}
        if self._opening:
            info.update(opening=self._opening[0], opening_black=self._opening[1],
                        opening_white=self._opening[2])
        return obs, info

    def step(self, action):
        if self._done:
            return "episode is over", 0.0, True, False, {}
        self._turns += 1
        try:
            obs, reward, term, info = self._act(str(action))
        except Exception as exc:  # step must never raise
            obs, reward, term, info = "internal error: " + str(exc)[:200], 0.0, False, {}
        trunc = (not term) and self._turns >= self._budget
        self._done = term or trunc
        left = self._budget - self._turns
        if not term:
            obs += f" ({left} guesses left)" if left else " No guesses left; the code stays secret."
        return obs, float(reward), term, trunc, info

    def _act(self, action):
        guess = _parse(action, self._length, self._palette)
        if guess is None:
            return (f"Invalid guess: reply with exactly {self._length} letters from "
                    f"{' '.join(self._palette)}, e.g. 'GUESS: {self._palette[:self._length]}'. "
                    "That turn is wasted.", 0.0, False, {})
        black, white = _score(self._secret, guess)
        self._history.append([guess, black, white])
        if black == self._length:
            return f"{guess}: {black} black. You cracked the code!", 1.0, True, {
                "black": black, "white": 0}
        return f"{guess}: {black} black, {white} white.", 0.0, False, {"black": black,
                                                                        "white": white}

    def hint(self):
        shown = self._length // 2  # half the pegs; a one-peg code gets a color it is not
        if not shown:
            absent = next(c for c in self._palette if c not in self._secret)
            return f"The code contains no {absent} ({COLOR_NAMES[absent]})."
        told = [f"the {ORDINALS[i]} peg is {c} ({COLOR_NAMES[c]})"
                for i, c in enumerate(self._secret[:shown])]
        text = " and ".join(told) + "."
        return text[0].upper() + text[1:]

    def solution(self):
        cands = ["".join(p) for p in itertools.product(self._palette, repeat=self._length)]
        if self._opening:
            opening, black, white = self._opening
            cands = [c for c in cands if _score(c, opening) == (black, white)]
        guess, moves = cands[0], []
        while len(moves) < self._budget:
            moves.append("GUESS: " + guess)
            fb = _score(self._secret, guess)
            if fb[0] == self._length:
                return moves
            cands = [c for c in cands if _score(c, guess) == fb]
            guess = cands[0]
        return ["GUESS: " + self._secret]
