"""Multi-turn Wordle-like game over a fixed, shown list of five-letter words."""

import random
import re

WORDS = (
    "crane slate pious bunch dwarf glyph knelt mirth proxy quilt vixen whisk zebra jumbo flock "
    "grind haste ivory joker latch mound nymph ocean plumb risky shove tramp umbra vapor waltz "
    "yacht blend chirp dough fjord gusty hoard inlet jewel karma lunar maple noble opera prism "
    "quest rover sword thump unzip venom wheat youth amber brisk cider drape ethic frown ghost "
    "hinge index jolly kiosk lemon moist niche olive pearl quart raven scalp tiger usher vocal "
    "wrist xenon yield zesty badge cloak"
).split()


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


def _feedback(secret, guess):
    marks = ["-"] * 5
    left = {}
    for i in range(5):
        if guess[i] == secret[i]:
            marks[i] = "G"
        else:
            left[secret[i]] = left.get(secret[i], 0) + 1
    for i in range(5):
        if marks[i] != "G" and left.get(guess[i], 0) > 0:
            marks[i] = "Y"
            left[guess[i]] -= 1
    return "".join(marks)


class Environment:
    name = "word_guess"
    description = (
        "A Wordle-like game over several turns. The secret is one of the five-letter words in "
        "the list shown at the start. Each turn reply with exactly one word from that list and "
        "nothing else, e.g. 'GUESS: crane' or 'crane'. The feedback has one mark per letter: G = "
        "right letter in the right place, Y = the letter is in the word elsewhere, - = not in "
        "the word (repeated letters are marked at most as often as they occur). Guessing the word "
        "wins; the task says how many guesses you have (at most 6), and a word outside the list "
        "wastes a turn."
    )
    max_turns = 6
    tools = []

    params = {
        "words": {"type": "int", "min": 2, "max": 50, "default": 50,
                  "description": "words in the shown list (the secret is one of them)"},
        "guesses": {"type": "int", "min": 1, "max": 6, "default": 6, "easy": 6,
                    "description": "guesses allowed"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        self._budget = knobs["guesses"]
        self._words = sorted(rng.sample(WORDS, knobs["words"]))
        self._secret = rng.choice(self._words)
        self._turns = 0
        self._done = False
        obs = (f"The secret word is one of these {len(self._words)} words:\n"
               + " ".join(self._words)
               + f"\nYou have {self._budget} guesses. Reply 'GUESS: <word>'.")
        return obs, {"words": len(self._words), "knobs": knobs}

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
            obs += f" ({left} guesses left)" if left else " No guesses left; the game is over."
        return obs, float(reward), term, trunc, info

    def _act(self, action):
        body = re.sub(r"^\s*guess\s*:", "", action, flags=re.IGNORECASE).strip().strip(
            "'\"`.").lower()
        if body not in self._words:
            return ("Not a word from the list: reply with exactly one listed word. That turn is "
                    "wasted.", 0.0, False, {})
        marks = _feedback(self._secret, body)
        if body == self._secret:
            return f"{body.upper()}: GGGGG. You found the word!", 1.0, True, {"feedback": marks}
        return f"{body.upper()}: {marks}", 0.0, False, {"feedback": marks}

    def hint(self):
        return (f"The secret word starts with '{self._secret[0]}' and ends with "
                f"'{self._secret[-1]}'.")

    def solution(self):
        cands, moves = list(self._words), []
        while len(moves) < self._budget:
            if len(cands) <= 2:
                guess = cands[0]
            else:
                best = None
                for w in self._words:
                    groups = {}
                    for c in cands:
                        fb = _feedback(c, w)
                        groups[fb] = groups.get(fb, 0) + 1
                    key = (max(groups.values()), 0 if w in cands else 1)
                    if best is None or key < best[0]:
                        best = (key, w)
                guess = best[1]
            moves.append("GUESS: " + guess)
            if guess == self._secret:
                return moves
            fb = _feedback(self._secret, guess)
            cands = [c for c in cands if _feedback(c, guess) == fb]
        return ["GUESS: " + self._secret]
