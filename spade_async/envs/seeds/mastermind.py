"""Multi-turn code breaking: Mastermind with black and white peg feedback."""

import itertools
import random
import re

COLORS = "RGBYOP"
COLOR_NAMES = {"R": "red", "G": "green", "B": "blue", "Y": "yellow", "O": "orange", "P": "purple"}
LENGTH = 4


def _score(secret, guess):
    black = sum(1 for s, g in zip(secret, guess) if s == g)
    common = sum(min(secret.count(c), guess.count(c)) for c in COLORS)
    return black, common - black


def _parse(text):
    body = re.sub(r"^\s*guess\s*:", "", text, flags=re.IGNORECASE)
    body = re.sub(r"[\s,\-]+", "", body).upper()
    if len(body) != LENGTH or any(c not in COLORS for c in body):
        return None
    return body


class Environment:
    name = "mastermind"
    description = (
        "Mastermind over several turns. A secret code of 4 pegs is drawn from 6 colors: R (red), "
        "G (green), B (blue), Y (yellow), O (orange), P (purple); colors may repeat. Each turn "
        "reply with exactly one guess of 4 color letters and nothing else, e.g. 'GUESS: RGBY' or "
        "'RGBY'. The feedback gives black pegs (right color in the right position) and white "
        "pegs (right color in the wrong position); the first observation also shows the score of "
        "a free opening guess. Four black pegs win. You have 10 guesses."
    )
    max_turns = 10
    tools = []

    _done = True
    _turns = 0

    def reset(self, seed):
        rng = random.Random(seed)
        self._secret = "".join(rng.choice(COLORS) for _ in range(LENGTH))
        while True:
            opening = "".join(rng.choice(COLORS) for _ in range(LENGTH))
            if opening != self._secret:
                break
        black, white = _score(self._secret, opening)
        self._opening = [opening, black, white]
        self._history = [list(self._opening)]
        self._turns = 0
        self._done = False
        obs = ("A secret code of 4 pegs from the colors R G B Y O P (repeats allowed) is set. "
               f"A free opening guess was played for you: {opening} scores {black} black, "
               f"{white} white. You have {self.max_turns} guesses. Reply 'GUESS: XXXX'.")
        return obs, {"colors": COLORS, "length": LENGTH, "opening": opening,
                     "opening_black": black, "opening_white": white}

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
        left = self.max_turns - self._turns
        if not term:
            obs += f" ({left} guesses left)" if left else " No guesses left; the code stays secret."
        return obs, float(reward), term, trunc, info

    def _act(self, action):
        guess = _parse(action)
        if guess is None:
            return ("Invalid guess: reply with exactly 4 letters from R G B Y O P, e.g. "
                    "'GUESS: RGBY'. That turn is wasted.", 0.0, False, {})
        black, white = _score(self._secret, guess)
        self._history.append([guess, black, white])
        if black == LENGTH:
            return f"{guess}: 4 black. You cracked the code!", 1.0, True, {"black": 4, "white": 0}
        return f"{guess}: {black} black, {white} white.", 0.0, False, {"black": black,
                                                                        "white": white}

    def hint(self):
        a, b = self._secret[0], self._secret[1]
        return (f"The first peg is {a} ({COLOR_NAMES[a]}) and the second peg is {b} "
                f"({COLOR_NAMES[b]}).")

    def solution(self):
        opening, black, white = self._opening
        cands = ["".join(p) for p in itertools.product(COLORS, repeat=LENGTH)]
        cands = [c for c in cands if _score(c, opening) == (black, white)]
        guess, moves = cands[0], []
        while len(moves) < self.max_turns:
            moves.append("GUESS: " + guess)
            fb = _score(self._secret, guess)
            if fb[0] == LENGTH:
                return moves
            cands = [c for c in cands if _score(c, guess) == fb]
            guess = cands[0]
        return ["GUESS: " + self._secret]
