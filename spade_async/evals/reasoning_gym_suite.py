"""The `reasoning-gym` suite: a fixed, seeded task set from several of the package's generators,
each answer scored by the generator's own verifier (`dataset.score_answer`).

The set is the same on every run and machine: `size` tasks from each generator below, built
with EVAL_SEED. Training never draws from these seeds (the fixed-environment mode plays the
memory's environments, and the designer's corpus is documents, not tasks); `texts()` lets a
test check that no task leaks into the corpus or the memory.
"""

from __future__ import annotations

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


@dataclass
class ReasoningGymSuite:
    """`per_generator` tasks of every generator in `generators` (default: all six above)."""

    per_generator: int = 8
    generators: tuple[str, ...] = tuple(GENERATORS)
    max_tokens: int = 384
    name: str = "reasoning-gym"
    pass_mark: float = 1.0
    _datasets: dict[str, Any] = field(default_factory=dict, repr=False)

    def _dataset(self, gen: str) -> Any:
        if gen not in self._datasets:
            import reasoning_gym

            if gen not in GENERATORS:
                raise ValueError(f"unknown reasoning-gym generator {gen!r}: one of "
                                 f"{', '.join(GENERATORS)}")
            self._datasets[gen] = reasoning_gym.create_dataset(
                gen, size=self.per_generator, seed=EVAL_SEED, **GENERATORS[gen][1])
        return self._datasets[gen]

    def tasks(self, limit: int | None = None) -> list[EvalTask]:
        """Round robin over the generators, so a `limit` still samples every kind."""
        out = []
        for i in range(self.per_generator):
            for gen in self.generators:
                entry = self._dataset(gen)[i]
                out.append(EvalTask(f"{gen}/{i}", {"generator": gen, "index": i,
                                                   "kind": GENERATORS[gen][0],
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

    def reference(self, gen: str, index: int) -> str:
        return str(self._dataset(gen)[index]["answer"])

    async def run_task(self, task: EvalTask, policy: EvalPolicy) -> TaskResult:
        from reasoning_gym.utils import SYSTEM_PROMPTS

        p = task.payload
        messages = [{"role": "system", "content": SYSTEM_PROMPTS["default"]},
                    {"role": "user", "content": p["question"]}]
        text, n = await policy.reply(messages, max_tokens=self.max_tokens)
        score, answer = self.score(p["generator"], p["index"], text)
        return TaskResult(task.task_id, score, score >= self.pass_mark, answer=text[:500],
                          turns=1, completion_tokens=n,
                          detail={"kind": p["kind"], "extracted": answer})
