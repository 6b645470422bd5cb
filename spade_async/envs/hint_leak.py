"""Hint-leak probes: policies read off an environment's privileged hint (DESIGN §3, §6).

Regret pays the designer for hinted minus unhinted play, so the cheapest design is a hint that
states the answer, the passphrase or the winning moves. Validation plays the policies this
module derives from the hint text alone, with no reasoning: the hint itself; each number,
quoted string and short word n-gram in it, alone and in the answer format the environment's
`solution()` uses (its prefix, as in 'ANSWER: ' or 'GUESS: '); and the sequences read off the
hint in order (its numbers, its list items, its tool calls), one per turn, for multi-turn play.
Where `solution()` exists, each of its actions found in the hint is a policy too. The answers
the hint gives in another form (spelled out, reversed, in pieces, as arithmetic still to do, in
another notation: `hint_decode.py`) are policies too, alone and in the answer format. A hint that
only narrows the search (a range, a parity, the first letter, a method) yields no policy that
solves the task on most seeds, so it passes; one that gives the task away does not.

`play_leak` is the same idea at play time: how much of a hinted episode's winning actions were
copied from the hint, verbatim or decoded.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from spade_async.envs.hint_decode import decoded_answers

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_QUOTED = re.compile(r"'([^'\n]{1,80})'|\"([^\"\n]{1,80})\"|`([^`\n]{1,80})`")
_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]*")
_JSON_OBJECT = re.compile(r"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}")
_SEPARATORS = re.compile(r"\s*(?:,|;|\n|->|=>|→|\bthen\b|\band then\b)\s*", re.I)
_PREFIX = re.compile(r"^\s*([A-Za-z][A-Za-z _-]{0,20}:)\s*")

MAX_NGRAM = 3
MAX_POLICIES = 64  # per seed: bounds validation time whatever the hint's length
MAX_DECODED = 12  # decoded answers played (each alone and in every answer format)


@dataclass(frozen=True)
class LeakPolicy:
    """A policy read off the hint: one action repeated every turn, or a sequence in order."""

    what: str  # how it was derived, for the rejection reason
    actions: tuple[str, ...]
    repeat: bool = True  # one action, sent every turn (a sequence is played once, in order)

    def plan(self, max_turns: int) -> list[str]:
        if self.repeat:
            return [self.actions[0]] * max_turns
        return list(self.actions[:max_turns])


def normalise(text: str) -> str:
    """Lower case, runs of whitespace and punctuation (but not signs and dots in numbers) as one
    space: what 'found verbatim in the hint' compares."""
    return " ".join(re.findall(r"-?\d+(?:\.\d+)?|[a-z0-9_]+", text.lower()))


def answer_prefixes(solution: list[str] | None) -> list[str]:
    """The answer formats the environment's own solution uses ('ANSWER: ', 'GUESS: ', ...)."""
    out: list[str] = []
    for action in solution or []:
        m = _PREFIX.match(action)
        if m and not action.lstrip().startswith("{"):
            p = m.group(1) + " "
            if p not in out:
                out.append(p)
    return out


def _payload(action: str) -> str:
    """A solution action without its answer prefix."""
    m = _PREFIX.match(action)
    return action[m.end():].strip() if m and not action.lstrip().startswith("{") else action.strip()


def _mentions(tokens: list[str], payloads: dict[str, str]) -> list[str]:
    """The actions whose payloads occur in `tokens` (a normalised hint), in the hint's order."""
    pats = sorted(((a, p.split()) for a, p in payloads.items()), key=lambda x: -len(x[1]))
    out, i = [], 0
    while i < len(tokens):
        for action, pat in pats:
            if tokens[i:i + len(pat)] == pat:
                out.append(action)
                i += len(pat)
                break
        else:
            i += 1
    return out


def _tool_calls(hint: str) -> list[str]:
    calls = []
    for m in _JSON_OBJECT.finditer(hint):
        try:
            obj = json.loads(m.group(0))
        except ValueError:
            continue
        if isinstance(obj, dict):
            calls.append(json.dumps(obj, ensure_ascii=False))
    return calls


def leak_policies(hint: str, solution: list[str] | None = None,
                  limit: int = MAX_POLICIES, observation: str = "",
                  decoded: bool = True) -> list[LeakPolicy]:
    """The policies of the module docstring, most specific first, at most `limit`.
    `observation` (the episode's first) keeps arithmetic on the task's own numbers out of the
    decoded answers: a hint that restates the operands with a method is not a leak."""
    prefixes = answer_prefixes(solution)
    out: list[LeakPolicy] = []
    seen: set[tuple[tuple[str, ...], bool]] = set()

    def add(what: str, actions: list[str], repeat: bool = True) -> None:
        actions = [a.strip() for a in actions if a and a.strip()]
        if not actions:
            return
        forms = [actions] + [[p + a for a in actions] for p in prefixes]
        for form in forms:
            key = (tuple(form), repeat)
            if key not in seen:
                seen.add(key)
                out.append(LeakPolicy(what, tuple(form), repeat))

    norm_hint = f" {normalise(hint)} "
    # the solution's own actions where the hint holds them: each alone, and all of them in the
    # order the hint mentions them (the order is read off the hint, never off the solution)
    if solution:
        payloads = {a: normalise(_payload(a)) for a in dict.fromkeys(solution)}
        payloads = {a: p for a, p in payloads.items() if p and f" {p} " in norm_hint}
        for a in payloads:
            add(f"the solution action {a!r}, found in the hint", [a])
        in_order = _mentions(normalise(hint).split(), payloads)
        if len(in_order) > 1:
            add("the solution's actions in the order the hint mentions them", in_order,
                repeat=False)
    add("the hint itself", [hint])
    calls = _tool_calls(hint)
    for call in calls:
        add(f"the tool call {call[:60]} in the hint", [call])
    if len(calls) > 1:
        add("the hint's tool calls in order", calls, repeat=False)
    numbers = _NUMBER.findall(hint)
    quoted = [next(g for g in m.groups() if g is not None) for m in _QUOTED.finditer(hint)]
    for q in quoted:
        add(f"the quoted string {q!r} in the hint", [q])
    for n in dict.fromkeys(numbers):
        add(f"the number {n} in the hint", [n])
    answers = decoded_answers(hint, observation) if decoded else []
    if solution:  # a decoded answer that is a solution action goes first
        wanted = {normalise(_payload(a)) for a in solution}
        answers.sort(key=lambda d: normalise(d[1]) not in wanted)
    for what, value in answers[:MAX_DECODED]:
        add(f"the hint decoded ({what})", [value])
    items = [s for s in _SEPARATORS.split(hint) if s.strip()]
    if len(numbers) > 1:
        add("the hint's numbers in order", numbers, repeat=False)
    if len(quoted) > 1:
        add("the hint's quoted strings in order", quoted, repeat=False)
    if 1 < len(items) <= 40:
        add("the hint's list items in order", [i.strip(" .") for i in items], repeat=False)
        lasts = [_WORD.findall(i)[-1] for i in items if _WORD.findall(i)]
        add("the last words of the hint's list items in order", lasts, repeat=False)
    words = _WORD.findall(hint)
    for n in range(1, MAX_NGRAM + 1):
        for i in range(len(words) - n + 1):
            add(f"the words {' '.join(words[i:i + n])!r} in the hint",
                [" ".join(words[i:i + n])])
            if len(out) >= limit:
                return out[:limit]
    return out[:limit]


def play_leak(hint: str, actions: list[str], observation: str = "") -> float:
    """The share of an episode's actions found in the hint, verbatim (normalised, as a whole)
    or as an answer the hint gives in another form (`decoded_answers`, with the episode's
    first `observation`): 1.0 when every action the agent sent was copied from the hint.
    Empty actions are left out; an episode without actions scores 0."""
    norm_hint = f" {normalise(hint)} "
    counted = [normalise(_payload(a)) for a in actions]
    counted = [a for a in counted if a]
    if not counted:
        return 0.0
    decoded = {normalise(v) for _, v in decoded_answers(hint, observation)}
    return sum(f" {a} " in norm_hint or a in decoded for a in counted) / len(counted)
