"""Multi-turn guessing game: find a secret integer in a range from higher/lower feedback."""

import random
import re


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
    name = "number_guess"
    description = (
        "A guessing game over several turns. A secret integer lies in a range given at the "
        "start. Each turn, reply with one guess; the last integer in your reply is taken as the "
        "guess, e.g. 'GUESS: 517'. The feedback says whether the secret is higher or lower than "
        "your guess. Guessing the secret exactly wins; the task says how many guesses you have "
        "(at most 12), so halve the range each time."
    )
    max_turns = 12
    tools = []

    params = {
        "span_max": {"type": "int", "min": 5, "max": 2000, "default": 2000,
                     "description": "largest distance between the range's ends (spans run from "
                                    "3/10 of it)"},
        "guesses": {"type": "int", "min": 1, "max": 12, "default": 12, "easy": 12,
                    "description": "guesses allowed"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        span = knobs["span_max"]
        self._lo = rng.randint(100, 900)
        self._hi = self._lo + rng.randint(max(4, span * 3 // 10), span)
        self._secret = rng.randint(self._lo, self._hi)
        width = min(24, max(3, (self._hi - self._lo) // 3))
        start = rng.randint(max(self._lo, self._secret - width + 1), min(self._secret, self._hi))
        self._window = (start, min(self._hi, start + width - 1))
        self._budget = knobs["guesses"]
        self._turns = 0
        self._done = False
        obs = (f"I am thinking of an integer from {self._lo} to {self._hi} inclusive. You have "
               f"{self._budget} guesses. Reply 'GUESS: <integer>'.")
        return obs, {"low": self._lo, "high": self._hi, "knobs": knobs}

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
        info["guesses_left"] = left
        return obs, float(reward), term, trunc, info

    def _act(self, action):
        guess = _last_int(action)
        if guess is None:
            return "No integer found in your reply; that turn is wasted.", 0.0, False, {}
        if not self._lo <= guess <= self._hi:
            return f"{guess} is outside the range {self._lo}..{self._hi}.", 0.0, False, {}
        if guess == self._secret:
            return f"Correct! The secret was {guess}.", 1.0, True, {"correct": True}
        word = "higher" if guess < self._secret else "lower"
        return f"The secret is {word} than {guess}.", 0.0, False, {"feedback": word}

    def hint(self):
        a, b = self._window  # told as exclusive ends, so neither end is the secret
        return f"The secret lies strictly between {a - 1} and {b + 1}."

    def solution(self):
        lo, hi, moves = self._lo, self._hi, []
        while lo <= hi:
            mid = (lo + hi) // 2
            moves.append(f"GUESS: {mid}")
            if mid == self._secret:
                break
            if mid < self._secret:
                lo = mid + 1
            else:
                hi = mid - 1
        if len(moves) > self._budget:  # too few guesses to search: name it
            return [f"GUESS: {self._secret}"]
        return moves
