"""Single-turn run-length coding: encode a string into runs, or decode runs back into a string."""

import itertools
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

    params = {
        "runs_max": {"type": "int", "min": 1, "max": 10, "default": 10,
                     "description": "most runs in the string (at least runs_max - 4)"},
        "run_max": {"type": "int", "min": 2, "max": 14, "default": 14,
                    "description": "longest run (from 10 up, one run has two digits)"},
        "mode": {"type": "choice", "choices": ["decode", "encode", "both"], "default": "both",
                 "description": "the direction asked"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        top = knobs["run_max"]
        alphabet = rng.sample("abcdefghijklmnopqrstuvwxyz", rng.randint(3, 4))
        runs = []
        prev = None
        for _ in range(rng.randint(max(1, knobs["runs_max"] - 4), knobs["runs_max"])):
            ch = rng.choice([c for c in alphabet if c != prev])
            length = rng.choice([1, 1, 2, 3, 4, 5, 7, rng.randint(10, 14)])
            runs.append((ch, min(length, top)))
            prev = ch
        if top >= 10 and all(n < 10 for _, n in runs):
            i = rng.randrange(len(runs))
            runs[i] = (runs[i][0], rng.randint(10, min(13, top)))
        if sum(n for _, n in runs) < 2:  # a one-letter string is too easy to guess
            runs[0] = (runs[0][0], 2)
        plain = "".join(ch * n for ch, n in runs)
        code = _encode(plain)
        self._mode = rng.choice(["encode", "decode"])
        if knobs["mode"] != "both":
            self._mode = knobs["mode"]
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
        return self._obs, {"mode": self._mode, "length": len(plain), "knobs": knobs}

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
        shown = min(3, len(self._runs) // 2)  # never every run: that would be the code itself
        runs = "There is 1 run" if len(self._runs) == 1 else f"There are {len(self._runs)} runs"
        text = (f"{runs} and the string has {len(self._plain)} "
                "characters")
        if shown:
            first = " ".join(f"{ch}{n}" for ch, n in self._runs[:shown])
            text += f"; the first {['', 'run is', 'two runs are', 'three runs are'][shown]} {first}"
        return text + "."

    def solution(self):
        return ["ANSWER: " + self._answer]
