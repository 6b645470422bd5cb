"""Single-turn run-length coding: encode a string into runs, or decode runs back into a string."""

import itertools
import random
import re


def _encode(s):
    return "".join(f"{ch}{len(list(group))}" for ch, group in itertools.groupby(s))


class Environment:
    name = "run_length_encoding"
    description = (
        "A single-turn run-length coding task. In this code a string is written as its maximal "
        "runs of equal characters, each run as the character followed by the run length in "
        "decimal, always including the count (even 1): 'aaabcc' is 'a3b1c2' and 'zzzzzzzzzzzz' "
        "is 'z12'. You are asked either to encode a string or to decode an encoded one. Reply "
        "with 'ANSWER: ' followed by the result and nothing after it (spaces inside the result "
        "are ignored). You get one attempt."
    )
    max_turns = 1
    tools = []

    _done = True
    _turns = 0

    def reset(self, seed):
        rng = random.Random(seed)
        alphabet = rng.sample("abcdefghijklmnopqrstuvwxyz", rng.randint(3, 4))
        runs = []
        prev = None
        for _ in range(rng.randint(6, 10)):
            ch = rng.choice([c for c in alphabet if c != prev])
            length = rng.choice([1, 1, 2, 3, 4, 5, 7, rng.randint(10, 14)])
            runs.append((ch, length))
            prev = ch
        if all(n < 10 for _, n in runs):
            i = rng.randrange(len(runs))
            runs[i] = (runs[i][0], rng.randint(10, 13))
        plain = "".join(ch * n for ch, n in runs)
        code = _encode(plain)
        self._mode = rng.choice(["encode", "decode"])
        self._plain, self._code = plain, code
        self._runs = [(ch, len(list(g))) for ch, g in itertools.groupby(plain)]
        if self._mode == "encode":
            self._answer = code
            self._obs = f"Encode this string:\n{plain}\nReply 'ANSWER: <encoded>'."
        else:
            self._answer = plain
            self._obs = f"Decode this run-length code:\n{code}\nReply 'ANSWER: <decoded string>'."
        self._turns = 0
        self._done = False
        return self._obs, {"mode": self._mode, "length": len(plain)}

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
        got = re.sub(r"\s+", "", parts[-1]).strip("'\"`").lower()
        if not got:
            return "Empty answer.", 0.0, False, {"correct": False}
        if got == self._answer:
            return "Correct!", 1.0, True, {"correct": True}
        return "Incorrect.", 0.0, True, {"correct": False}

    def hint(self):
        first = " ".join(f"{ch}{n}" for ch, n in self._runs[:3])
        return (f"There are {len(self._runs)} runs and the string has {len(self._plain)} "
                f"characters; the first three runs are {first}.")

    def solution(self):
        return ["ANSWER: " + self._answer]
