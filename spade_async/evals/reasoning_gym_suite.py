"""The `reasoning-gym` suites: a fixed, seeded task set from several of the package's generators,
each answer scored by the generator's own verifier (`dataset.score_answer`), strictly (the answer
in `<answer>` tags, as the package reads it) and leniently (an untagged reply read by its shape).

Two levels of the same generators: `reasoning-gym` (LEVELS below) and `reasoning-gym-easy`,
their smallest sizes, where a 135M model solves some. Each set is the same on every run and
machine: `per_generator` tasks from each generator, built with EVAL_SEED. Training never draws
from these seeds (the fixed-environment mode plays the memory's environments, and the
designer's corpus is documents, not tasks); `texts()` lets a test check that no task leaks into
the corpus or the memory.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spade_async.evals.base import EvalPolicy, EvalTask, TaskResult

EVAL_SEED = 917_2026  # held out: nothing in training uses it

# name -> (kind, generator config): small, fast, exact-verifier generators.
GENERATORS: dict[str, tuple[str, dict[str, Any]]] = {
    "chain_sum": ("arithmetic", {"min_terms": 2, "max_terms": 4, "min_digits": 1,
                                 "max_digits": 2}),
    "basic_arithmetic": ("arithmetic", {"min_terms": 2, "max_terms": 3, "min_digits": 1,
                                        "max_digits": 2}),
    "knights_knaves": ("logic", {}),
    "word_sorting": ("algorithmic", {}),
    "mini_sudoku": ("games", {}),
    "maze": ("games", {}),
}

# The same generators at their smallest sizes. knights_knaves is left out: its smallest level
# that generates at all (2 people, statements of depth 2 and width 2: depth or width 1 and a
# single person yield no puzzle with one solution) is the one above, which a 135M model can
# only guess (one of four assignments), so it would add noise, not signal.
EASY_GENERATORS: dict[str, tuple[str, dict[str, Any]]] = {
    "chain_sum": ("arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                 "max_digits": 1}),
    # No "/": without parentheses the package falls back to "*" for an inexact division but
    # leaves the "/" in the question. (Its operands here are 0..10, the package's range.)
    "basic_arithmetic": ("arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                        "max_digits": 1, "operators": ("+", "-", "*"),
                                        "allow_parentheses": False, "allow_negation": False}),
    "word_sorting": ("algorithmic", {"min_words": 2, "max_words": 3, "min_word_length": 3,
                                     "max_word_length": 5}),
    "mini_sudoku": ("games", {"min_empty": 1, "max_empty": 2}),
    # Grids of 4 or 5 sometimes leave no cell for the goal and the generator raises (index 2
    # at EVAL_SEED); 6 never did in 3000 indices.
    "maze": ("games", {"min_dist": 1, "max_dist": 3, "min_grid_size": 6, "max_grid_size": 6}),
}

LEVELS: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {
    "reasoning-gym": GENERATORS, "reasoning-gym-easy": EASY_GENERATORS}

NUMBER_ANSWERS = frozenset({"chain_sum", "basic_arithmetic", "maze"})
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def lenient_answer(reply: str, shape: str, *, options: Sequence[Sequence[str]] = (),
                   lines: int = 1) -> str | None:
    """The answer a reply gives when read leniently. Tagged: what the package's strict reader
    takes from the last `<answer>` tags. Untagged, by the answer's `shape`: "number", the last
    number; "option", for each group of `options` the one mentioned last (case and spacing
    aside), joined by ", "; "lines", the last `lines` non-empty lines. None: nothing found."""
    from reasoning_gym.utils import extract_answer

    tagged = extract_answer(reply)
    if tagged is not None:
        return tagged
    if shape == "number":
        numbers = _NUMBER.findall(reply)
        return numbers[-1] if numbers else None
    if shape == "option":
        picked = []
        for group in options:
            last = {o: _last_mention(reply, o) for o in group}
            best = max(last, key=lambda o: last[o], default=None)
            if best is not None and last[best] >= 0:
                picked.append(best)
        return ", ".join(picked) or None
    if shape == "lines":
        rows = [x.strip() for x in reply.splitlines() if x.strip()]
        return "\n".join(rows[-lines:]) or None
    raise ValueError(f"unknown answer shape {shape!r}")


def _last_mention(text: str, phrase: str) -> int:
    """Where `phrase` last occurs in `text` as whole words (any case, any spacing); -1: never."""
    pattern = r"\b" + r"\s+".join(re.escape(w) for w in phrase.split()) + r"\b"
    starts = [m.start() for m in re.finditer(pattern, text, flags=re.IGNORECASE)]
    return starts[-1] if starts else -1


def answer_shape(gen: str, entry: dict[str, Any]) -> dict[str, Any]:
    """How to read an untagged reply to `entry` of generator `gen` (lenient_answer's keywords):
    a number; for knights_knaves an option per inhabitant (which of the puzzle's two roles);
    else as many last lines as the reference answer has (a sudoku's grid is four)."""
    if gen in NUMBER_ANSWERS:
        return {"shape": "number"}
    if gen == "knights_knaves":
        terms = entry["metadata"]["knight_knave_terms"]
        return {"shape": "option", "options": [
            tuple(f"{name} is {article} {terms[role]}" for role in ("knight", "knave")
                  for article in ("a", "an"))
            for name in map(str, entry["metadata"]["names"])]}
    return {"shape": "lines", "lines": max(1, len(str(entry["answer"]).splitlines()))}


@dataclass
class ReasoningGymSuite:
    """`per_generator` tasks of every generator in `generators` (default: all of the level
    that `name` names, LEVELS)."""

    per_generator: int = 8
    generators: tuple[str, ...] = ()
    max_tokens: int = 384
    name: str = "reasoning-gym"
    pass_mark: float = 1.0
    _datasets: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.name not in LEVELS:
            raise ValueError(f"unknown reasoning-gym suite {self.name!r}: one of "
                             f"{', '.join(LEVELS)}")
        self.generators = self.generators or tuple(self.level)

    @property
    def level(self) -> dict[str, tuple[str, dict[str, Any]]]:
        return LEVELS[self.name]

    def _dataset(self, gen: str) -> Any:
        if gen not in self._datasets:
            import reasoning_gym

            if gen not in self.level:
                raise ValueError(f"unknown {self.name} generator {gen!r}: one of "
                                 f"{', '.join(self.level)}")
            self._datasets[gen] = reasoning_gym.create_dataset(
                gen, size=self.per_generator, seed=EVAL_SEED, **self.level[gen][1])
        return self._datasets[gen]

    def tasks(self, limit: int | None = None) -> list[EvalTask]:
        """Round robin over the generators, so a `limit` still samples every kind."""
        out = []
        for i in range(self.per_generator):
            for gen in self.generators:
                entry = self._dataset(gen)[i]
                out.append(EvalTask(f"{gen}/{i}", {"generator": gen, "index": i,
                                                   "kind": self.level[gen][0],
                                                   "question": entry["question"]}))
        return out[:limit] if limit is not None else out

    def texts(self) -> list[str]:
        return [t.payload["question"] for t in self.tasks()]

    def score(self, gen: str, index: int, completion: str) -> tuple[float, str | None]:
        """The generator's own verdict on a completion: (score, the extracted answer)."""
        from reasoning_gym.utils import extract_answer

        ds = self._dataset(gen)
        answer = extract_answer(completion)
        return float(ds.score_answer(answer, ds[index])), answer

    def score_lenient(self, gen: str, index: int,
                      completion: str) -> tuple[float, str | None]:
        """The same verdict on the lenient reading (lenient_answer by the task's
        answer_shape): equal to `score` when the completion has answer tags."""
        ds = self._dataset(gen)
        entry = ds[index]
        answer = lenient_answer(completion, **answer_shape(gen, entry))
        return float(ds.score_answer(answer, entry)), answer

    def reference(self, gen: str, index: int) -> str:
        return str(self._dataset(gen)[index]["answer"])

    async def run_task(self, task: EvalTask, policy: EvalPolicy) -> TaskResult:
        from reasoning_gym.utils import SYSTEM_PROMPTS

        p = task.payload
        messages = [{"role": "system", "content": SYSTEM_PROMPTS["default"]},
                    {"role": "user", "content": p["question"]}]
        text, n = await policy.reply(messages, max_tokens=self.max_tokens)
        score, answer = self.score(p["generator"], p["index"], text)
        lenient, read = self.score_lenient(p["generator"], p["index"], text)
        return TaskResult(task.task_id, score, score >= self.pass_mark, answer=text[:500],
                          turns=1, completion_tokens=n,
                          detail={"kind": p["kind"], "extracted": answer, "lenient": read},
                          lenient=lenient, lenient_passed=lenient >= self.pass_mark)
