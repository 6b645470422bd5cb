"""The probe policies validation plays against an environment: fixed actions and actions made
for it, each repeated every turn, and observation echoes, whose action each turn is read off the
observation the agent sees; none of them may score at or above the exploit threshold. Derived
from the metadata, the solution and the observations alone, with no reasoning; playing them is
`sandboxed_checks.py`.
"""

from __future__ import annotations

import json
import random
import re
import string
from dataclasses import dataclass

from spade_async.envs.contract import EnvMeta
from spade_async.envs.hint_leak import answer_prefixes

# Probe policies: each repeats one action every turn. None of them may score >= the threshold.
# Besides these constants, each environment gets probes made for it (`probe_policies`): random
# text, the right format with wrong content, a verbose reply that sprays candidate answers, and
# well-formed calls of each of its tools with empty or wrong arguments.
PROBES: tuple[str, ...] = (
    "", "hello world lorem ipsum", "0", "1", "42", "yes", "A", '{"tool": "noop", "arguments": {}}',
)
# A long reply that contains many plausible answers: a verifier that pays when the answer
# appears anywhere in the reply (or pays for length) pays it.
VERBOSE = ("Let me think step by step. " + " ".join(str(i) for i in range(-20, 101))
           + " yes no true false none A B C D E R G Y O P left right up down north south east west"
           + " ANSWER: 1 ANSWER: 0 " + "lorem ipsum dolor sit amet " * 12).strip()


def _wrong_answer(solution: list[str]) -> str | None:
    """A plausible wrong answer: the solution's last action with its last number changed."""
    if not solution:
        return None
    last = solution[-1]
    nums = list(re.finditer(r"-?\d+", last))
    if nums:
        m = nums[-1]
        return last[: m.start()] + str(int(m.group()) + 1) + last[m.end():]
    return last + " not"


def short_action(action: str, n: int = 60) -> str:
    return repr(action if len(action) <= n else action[:n] + "...")


def probe_policies(meta: EnvMeta, solution: list[str] | None) -> list[tuple[str, str]]:
    """(label, action) of every probe policy for this environment, each repeated every turn."""
    out = [(f"constant {short_action(p)}", p) for p in PROBES]
    rng = random.Random(0)
    out.append(("random text", "".join(rng.choice(string.printable) for _ in range(40))))
    out.append(("verbose filler", VERBOSE))
    wrong = _wrong_answer(solution or [])
    if wrong is not None:
        out.append(("right format, wrong content", wrong))
    for prefix in answer_prefixes(solution):
        out.append((f"format only {short_action(prefix)}", prefix + "zzzz"))
        out.append((f"format with filler {short_action(prefix)}", prefix + VERBOSE))
    for tool in meta.tools:
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            continue
        props = (fn.get("parameters") or {}).get("properties") or {}
        wrong_args = {k: ("zzzz" if (v or {}).get("type") == "string" else -987654)
                      for k, v in props.items() if isinstance(v, dict) or v is None}
        for what, args in (("empty", {}), ("wrong", wrong_args)):
            out.append((f"tool call {name} with {what} arguments",
                        json.dumps({"tool": name, "arguments": args})))
    seen: set[str] = set()
    return [(label, a) for label, a in out if not (a in seen or seen.add(a))]


# Observation echoes: a verifier that pays a reply repeating the task back (its quoted word, the
# name or number it shows, a line of it) pays them, and small models echo their prompt often.
# A policy is an item kind and a position ("the 2nd quoted string"), so the same one applies to
# every seed and turn: the reset observation on turn 1, then the observation the last step gave.
ECHO_LIMIT = 40  # echo policies per point, after dedupe: bounds validation time
ECHO_FIRST = {"line": 3, "quoted string": 3, "number": 3, "word": 6}  # by position, + the last
ECHO_PREFIXES = 2  # answer formats each item is also sent in
# a number stands alone: not the digits of "bk918", not "-11" inside "2027-11-18"
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?!\.?\d)")
# a quote opens and closes away from letters, so the apostrophe of "What's" opens nothing
_QUOTED = re.compile(r"(?<!\w)(?:'([^'\n]{1,80})'|\"([^\"\n]{1,80})\"|`([^`\n]{1,80})`)(?!\w)")
_WORD = re.compile(r"(?<![\w-])[A-Za-z][\w-]*\w")  # "P588", "entry-fu"; 3+ characters kept
_STOP_WORDS = frozenset(
    "the and for with what which who whom whose how that this these those there their your you "
    "are was were been being has have had not but can could should would will shall may might "
    "must from into onto about after before then than one per each every all any some reply "
    "answer only its them they she her his him our out".split())
# an answer format the observation announces: "Reply ANSWER: <n>", "Reply 'GUESS: XXXX'"
_ANNOUNCED = re.compile(r"\b([A-Z][A-Z_]{1,19}:)[ ]?(?=\S)")


def _lines(obs: str) -> list[str]:
    return [line.strip() for line in obs.splitlines() if line.strip()]


def _quoted(obs: str) -> list[str]:
    return [next(g for g in m.groups() if g is not None) for m in _QUOTED.finditer(obs)]


def _words(obs: str) -> list[str]:
    return [w for w in _WORD.findall(obs) if len(w) >= 3 and w.lower() not in _STOP_WORDS]


# an observation's items of each kind, in order (EchoProbe counts each distinct one once)
_ITEMS = {
    "observation": lambda obs: [obs.strip()] if obs.strip() else [],
    "line": _lines,
    "quoted string": _quoted,
    "number": _NUMBER.findall,
    "word": _words,
}


@dataclass(frozen=True)
class EchoProbe:
    """Each turn, the `index`-th distinct item of `kind` in the observation (-1: the last one),
    after `prefix`; the empty reply where the observation has no such item."""

    kind: str  # a key of _ITEMS
    index: int = 0
    prefix: str = ""

    def action(self, observation: str) -> str:
        items = list(dict.fromkeys(_ITEMS[self.kind](observation)))
        if not -len(items) <= self.index < len(items):
            return ""
        item = items[self.index]
        return item if item.startswith(self.prefix) else self.prefix + item

    @property
    def label(self) -> str:
        if self.kind == "observation":
            what = "the whole observation"
        elif self.index == -1:
            what = f"the last {self.kind} of the observation"
        else:
            what = f"{self.kind} #{self.index + 1} of the observation"
        form = f", as {short_action(self.prefix + '...')}" if self.prefix else ""
        return f"observation echo: {what}{form}"


def announced_prefixes(observations: list[str]) -> list[str]:
    """The answer formats the observations announce ('ANSWER: ' of "Reply 'ANSWER: <n>'")."""
    found = (m.group(1) + " " for obs in observations for m in _ANNOUNCED.finditer(obs))
    return list(dict.fromkeys(found))


def echo_policies(observations: list[str], solution: list[str] | None,
                  limit: int = ECHO_LIMIT) -> list[EchoProbe]:
    """The observation echoes for an environment whose first observations at the validation
    seeds are `observations`: the whole observation, then for each position (#1, the last, #2,
    #3, ...) each kind's item there, each bare and in the answer formats of the solution and the
    observation. How many positions a kind has comes from these observations; a policy that
    sends the same actions as an earlier one on all of them (or nothing) is dropped. At most
    `limit`, the positions interleaved so that every kind is probed before any runs deep."""
    prefixes = list(dict.fromkeys(answer_prefixes(solution)
                                  + announced_prefixes(observations)))[:ECHO_PREFIXES]
    counts = {kind: max(len(set(items(obs))) for obs in observations)
              for kind, items in _ITEMS.items()}
    depth = max(ECHO_FIRST.values())
    positions = [(0, "observation")] + [
        (index, kind) for index in [0, -1, *range(1, depth)] for kind in ECHO_FIRST
        if counts[kind] and index < min(counts[kind], ECHO_FIRST[kind])]
    out: list[EchoProbe] = []
    seen: set[tuple[str, ...]] = set()
    for index, kind in positions:
        for prefix in ["", *prefixes]:
            probe = EchoProbe(kind, index, prefix)
            sent = tuple(probe.action(obs) for obs in observations)
            if any(sent) and sent not in seen:
                seen.add(sent)
                out.append(probe)
                if len(out) >= limit:
                    return out
    return out
