"""Single-turn string transformation: apply a described pipeline of operations to a word."""

import random
import re
import string

VOWELS = "aeiou"
KINDS = {
    "basic": ["reverse", "double", "drop_first", "append"],
    "all": ["reverse", "shift", "rotate", "swap_pairs", "vowel_next", "drop_third", "interleave"],
}


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


def _apply(op, s):
    kind = op[0]
    if kind == "reverse":
        return s[::-1]
    if kind == "double":
        return s + s
    if kind == "drop_first":
        return s[1:]
    if kind == "append":
        return s + op[1]
    if kind == "shift":
        k = op[1]
        return "".join(chr((ord(c) - 97 + k) % 26 + 97) for c in s)
    if kind == "rotate":
        n = op[1] % len(s)
        return s[n:] + s[:n]
    if kind == "swap_pairs":
        out = list(s)
        for i in range(0, len(out) - 1, 2):
            out[i], out[i + 1] = out[i + 1], out[i]
        return "".join(out)
    if kind == "vowel_next":
        return "".join(VOWELS[(VOWELS.index(c) + 1) % 5] if c in VOWELS else c for c in s)
    if kind == "drop_third":
        return "".join(c for i, c in enumerate(s) if (i + 1) % 3 != 0)
    # interleave
    half = (len(s) + 1) // 2
    first, second = s[:half], s[half:]
    out = []
    for i in range(half):
        out.append(first[i])
        if i < len(second):
            out.append(second[i])
    return "".join(out)


def _describe(op):
    kind = op[0]
    if kind == "reverse":
        return "Reverse the string."
    if kind == "double":
        return "Write the string twice in a row."
    if kind == "drop_first":
        return "Delete the first character."
    if kind == "append":
        return f"Add the letter '{op[1]}' at the end."
    if kind == "shift":
        return (f"Shift every letter {op[1]} places forward in the alphabet, wrapping around "
                "after z (a Caesar shift).")
    if kind == "rotate":
        return f"Rotate left by {op[1]}: move the first {op[1]} characters to the end."
    if kind == "swap_pairs":
        return ("Swap each adjacent pair of characters (1st with 2nd, 3rd with 4th, ...); a final "
                "unpaired character stays where it is.")
    if kind == "vowel_next":
        return "Replace every vowel by the next vowel in the cycle a->e->i->o->u->a."
    if kind == "drop_third":
        return "Delete every third character (the 3rd, 6th, 9th, ...)."
    return ("Split the string into a first half and a second half (the first half takes the extra "
            "character when the length is odd), then interleave them: 1st character of the first "
            "half, 1st of the second half, 2nd of the first half, 2nd of the second half, ...")


class Environment:
    name = "string_pipeline"
    description = (
        "A single-turn string task: you are given a lowercase word and a numbered list of "
        "operations; apply them in order and report the final string. Reply with 'ANSWER: ' "
        "followed by the final string and nothing after it, e.g. 'ANSWER: qwerty' (letter case "
        "is ignored). You get one attempt."
    )
    max_turns = 1
    tools = []

    params = {
        "ops": {"type": "int", "min": 1, "max": 6, "default": 4,
                "description": "operations to apply in order"},
        "word_len": {"type": "int", "min": 3, "max": 12, "default": 12,
                     "description": "longest start word (at least word_len - 3 letters)"},
        "op_set": {"type": "choice", "choices": ["basic", "all"], "default": "all",
                   "description": "basic: reverse, write twice, drop the first letter, add a "
                                  "letter; all: reverse, Caesar shift, rotate, swap pairs, next "
                                  "vowel, drop every third, interleave halves"},
    }

    _done = True
    _turns = 0

    def reset(self, seed, params=None):
        knobs = _resolve(self.params, params)
        rng = random.Random(seed)
        top = knobs["word_len"]
        word = "".join(rng.choice(string.ascii_lowercase)
                       for _ in range(rng.randint(max(3, top - 3), top)))
        kinds = KINDS[knobs["op_set"]]
        count = knobs["ops"]
        while True:
            ops = []
            picked = (rng.sample(kinds, count) if count <= len(kinds)
                      else [rng.choice(kinds) for _ in range(count)])
            for kind in picked:
                if kind == "shift":
                    ops.append((kind, rng.randint(1, 25)))
                elif kind == "rotate":
                    ops.append((kind, rng.randint(2, 6)))
                elif kind == "append":
                    ops.append((kind, rng.choice(string.ascii_lowercase)))
                else:
                    ops.append((kind,))
            states = [word]
            for op in ops:
                states.append(_apply(op, states[-1]) if states[-1] else "")
            # the result must be new, not a guessable scrap, and not a state the hint shows
            if (states[-1] != word and states[-1] != states[-2] and len(states[-1]) >= 2
                    and states[-1] not in states[1:min(3, count)]):
                break
        self._word, self._ops, self._states = word, ops, states
        self._answer = states[-1]
        self._obs = (f"Start with the string: {word}\nApply, in order:\n"
                     + "\n".join(f"  {i + 1}. {_describe(op)}" for i, op in enumerate(ops))
                     + "\nReply 'ANSWER: <final string>'.")
        self._turns = 0
        self._done = False
        return self._obs, {"start": word, "operations": [op[0] for op in ops], "knobs": knobs}

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
        got = parts[-1].strip().strip("'\"`").strip().lower()
        if not got:
            return "Empty answer.", 0.0, False, {"correct": False}
        if got == self._answer:
            return "Correct!", 1.0, True, {"correct": True}
        return "Incorrect final string.", 0.0, True, {"correct": False}

    def hint(self):
        if len(self._ops) >= 3:
            return (f"After operation 1 the string is '{self._states[1]}' and after operation 2 "
                    f"it is '{self._states[2]}'.")
        if len(self._ops) == 2:
            return f"After operation 1 the string is '{self._states[1]}'."
        return (f"The result has {len(self._answer)} characters and begins with "
                f"'{self._answer[0]}'.")

    def solution(self):
        return ["ANSWER: " + self._answer]
