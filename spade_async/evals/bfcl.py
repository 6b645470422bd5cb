"""The `bfcl-multi-turn` suite: BFCL v4 multi-turn entries (bfcl-eval 2026.3.23), each played as a
multi-turn tool-use episode through our environment contract and scored by bfcl's own
`multi_turn_checker`.

bfcl-eval's pins clash with .venv, so it lives in `.venv-bfcl` (`bash scripts/setup-bfcl.sh`) and
runs in a worker process (`bfcl_worker.py`, JSON lines on stdin/stdout), one per running task.
`BfclEnvSession` gives that worker the `EnvSession` interface `run_episode` plays:
  reset          the entry's first user request (fresh backend instances every time)
  step(action)   a tool call `{"tool", "arguments"}` runs on the entry's backends and its result
                 is the observation; plain text ends the user's request and the next request is
                 the observation; after the last request the episode ends with reward 1.0 when
                 bfcl's checker accepts the calls made, else 0.0
A request ends by itself after `steps_per_turn` actions, so `max_turns` = requests x that cap.

Task selection is fixed: `n_tasks` entries, round robin over the categories, from each the first
in the file's order, or with `sample_seed` a seeded sample (the same on every run and machine);
`ids` picks entries by id instead. Tools are presented with bfcl's full function docs (`tool_docs="full"`, the
benchmark); `"brief"` drops the parameter descriptions and keeps one sentence per function, so a
small-context model can be run at all, but its scores are not the benchmark's.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spade_async.core.config import RolloutConfig
from spade_async.envs.contract import EnvMeta, ResetResult, StepResult, parse_tool_call
from spade_async.evals.base import EvalPolicy, EvalTask, TaskResult, transcript
from spade_async.evals.worker import JsonLinesWorker, WorkerSetupError
from spade_async.evals.worker import worker_batch as _worker_batch
from spade_async.rollout.episode import Episode
from spade_async.sandbox.errors import SandboxError

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PYTHON = REPO / ".venv-bfcl" / "bin" / "python"
WORKER = Path(__file__).with_name("bfcl_worker.py")
SETUP = "bash scripts/setup-bfcl.sh"
CATEGORIES = ("base", "long_context", "miss_param", "miss_func")

DESCRIPTION = (
    "A user asks you for several things, one request at a time (BFCL multi-turn). Do what the "
    "user asks with the tools: one tool call per reply; each call's result comes back as the "
    "next message. When the current request is done (or the tools cannot do it), reply in plain "
    "text without a tool call: that ends the request, and the user's next request follows. At "
    "most {steps} replies per request."
)


class BfclSetupError(WorkerSetupError):
    """The BFCL venv is missing or broken."""


def worker_batch(python: Path, requests: Sequence[dict[str, Any]],
                 timeout_s: float = 120.0) -> list[Any]:
    """Run requests through a one-off worker (synchronously); the results in order."""
    return _worker_batch(python, WORKER, requests, timeout_s=timeout_s, label="BFCL worker",
                         setup=SETUP, error=BfclSetupError, venv="the BFCL venv (.venv-bfcl)")


class BfclWorker(JsonLinesWorker):
    """One BFCL worker process (evals/worker.py); use as `async with BfclWorker(...) as w`.
    A request that fails to answer within `timeout_s` kills the worker."""

    def __init__(self, python: Path | str = DEFAULT_PYTHON, *, timeout_s: float = 60.0) -> None:
        super().__init__(python, WORKER, timeout_s=timeout_s, label="BFCL worker", setup=SETUP,
                         setup_error=BfclSetupError, venv="the BFCL venv (.venv-bfcl)")


class BfclEnvSession:
    """One BFCL entry behind the `EnvSession` interface (meta, reset, step, hint). Build it with
    `await BfclEnvSession.open(worker, category, entry_id)`."""

    def __init__(self, worker: BfclWorker, *, category: str, entry_id: str, turns: int,
                 tools: Sequence[dict[str, Any]], steps_per_turn: int = 8,
                 tool_docs: str = "full") -> None:
        if steps_per_turn < 1:
            raise ValueError("steps_per_turn must be >= 1")
        self.worker, self.category, self.entry_id = worker, category, entry_id
        self.turns, self.steps_per_turn, self.tool_docs = turns, steps_per_turn, tool_docs
        self.meta = EnvMeta(name=f"bfcl-{entry_id}",
                            description=DESCRIPTION.format(steps=steps_per_turn),
                            max_turns=turns * steps_per_turn, tools=tuple(tools))
        self._fresh()

    def _fresh(self) -> None:
        self.turn = 0              # the user request being played (0-based)
        self.steps = 0             # actions in this request
        self.calls = 0             # tool calls executed over the episode
        self.rejected = 0          # tool calls the worker refused (unknown name, bad arguments)
        self.capped_turns = 0      # requests ended by the step cap
        self.done = False
        self.verdict: dict[str, Any] | None = None

    @classmethod
    async def open(cls, worker: BfclWorker, category: str, entry_id: str, *,
                   steps_per_turn: int = 8, tool_docs: str = "full") -> BfclEnvSession:
        r = await worker.request("reset", category=category, id=entry_id, docs=tool_docs)
        return cls(worker, category=category, entry_id=entry_id, turns=int(r["turns"]),
                   tools=r["tools"], steps_per_turn=steps_per_turn, tool_docs=tool_docs)

    async def reset(self, seed: int) -> ResetResult:
        """A fresh episode of the entry (new backend instances); BFCL entries have no seed."""
        r = await self.worker.request("reset", category=self.category, id=self.entry_id,
                                      docs=self.tool_docs)
        self._fresh()
        return ResetResult(str(r["observation"]), {"entry": self.entry_id, "turns": self.turns})

    async def step(self, action: str) -> StepResult:
        if self.done:
            raise SandboxError("closed", "step after the episode ended")
        self.steps += 1
        call = parse_tool_call(action)
        if call is None:
            return await self._end_turn("")
        name, arguments = call
        r = await self.worker.request("call", name=name, arguments=arguments)
        if r.get("executed"):
            self.calls += 1
        else:
            self.rejected += 1
        result = str(r.get("result", ""))
        if self.steps < self.steps_per_turn:
            return StepResult(result, 0.0, False, False, {"executed": bool(r.get("executed"))})
        self.capped_turns += 1
        return await self._end_turn(f"{result}\n\n[{self.steps_per_turn} steps: this request "
                                    "is over]\n\n")

    async def _end_turn(self, prefix: str) -> StepResult:
        r = await self.worker.request("end_turn")
        self.turn += 1
        self.steps = 0
        if not r["done"]:
            return StepResult(prefix + str(r["observation"]), 0.0, False, False,
                              {"turn": self.turn})
        self.done = True
        self.verdict = await self.worker.request("check")
        reward = 1.0 if self.verdict.get("valid") else 0.0
        return StepResult((prefix + "All requests are over.").strip(), reward, True, False,
                          {"valid": bool(self.verdict.get("valid")),
                           "error_type": self.verdict.get("error_type")})

    async def hint(self) -> str:
        return ""


def _category_of(entry_id: str) -> str:
    cat = entry_id.rsplit("_", 1)[0].removeprefix("multi_turn_")
    if cat not in CATEGORIES:
        raise ValueError(f"{entry_id!r} is not a BFCL multi-turn entry id of {CATEGORIES}")
    return cat


@dataclass
class BfclMultiTurnSuite:
    """`n_tasks` BFCL multi-turn entries of `categories` (base by default; also long_context,
    miss_param, miss_func), taken round robin over the categories: from each, its first entries
    in file order, or with `sample_seed` a sample seeded with it; `ids` (e.g.
    "multi_turn_base_3") names the entries instead."""

    python: Path | str = DEFAULT_PYTHON
    categories: tuple[str, ...] = ("base",)
    n_tasks: int | None = 10           # None: every entry of the categories
    sample_seed: int | None = None
    ids: tuple[str, ...] | None = None
    steps_per_turn: int = 8
    tool_docs: str = "full"            # "brief": small-context variant, not the benchmark
    episode_deadline_s: float = 1800.0
    worker_timeout_s: float = 60.0
    name: str = "bfcl-multi-turn"
    pass_mark: float = 1.0
    _selected: list[dict[str, Any]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.python = Path(self.python)
        self.categories = tuple(self.categories)
        for cat in self.categories:
            if cat not in CATEGORIES:
                raise ValueError(f"unknown BFCL multi-turn category {cat!r}: one of {CATEGORIES}")
        if self.tool_docs not in ("full", "brief"):
            raise ValueError(f"tool_docs must be 'full' or 'brief', got {self.tool_docs!r}")

    def _select(self) -> list[dict[str, Any]]:
        if self._selected is not None:
            return self._selected
        if self.ids is not None:
            by_cat: dict[str, list[str]] = {}
            for i in self.ids:
                by_cat.setdefault(_category_of(i), []).append(i)
            reqs = [{"op": "entries", "category": c, "ids": ids} for c, ids in by_cat.items()]
            found = {e["id"]: {**e, "category": c} for c, es in
                     zip(by_cat, worker_batch(self.python, reqs), strict=True) for e in es}
            self._selected = [found[i] for i in self.ids]
            return self._selected
        reqs = [{"op": "entries", "category": c} for c in self.categories]
        orders = []
        for cat, entries in zip(self.categories, worker_batch(self.python, reqs), strict=True):
            idx = list(range(len(entries)))
            if self.sample_seed is not None:  # str seeds hash the same on every run (sha512)
                random.Random(f"{self.sample_seed}/{cat}").shuffle(idx)
            orders.append([{**entries[i], "category": cat} for i in idx])
        # Round robin over the categories, so `n_tasks` and a `limit` sample each of them.
        longest = max((len(o) for o in orders), default=0)
        chosen = [o[k] for k in range(longest) for o in orders if k < len(o)]
        self._selected = chosen if self.n_tasks is None else chosen[:self.n_tasks]
        return self._selected

    def tasks(self, limit: int | None = None) -> list[EvalTask]:
        out = [EvalTask(e["id"], {"category": e["category"], "id": e["id"], "turns": e["turns"],
                                  "classes": e["classes"], "questions": e["questions"]})
               for e in self._select()]
        return out[:limit] if limit is not None else out

    def texts(self) -> list[str]:
        """Every user request of every selected task, one string each."""
        return [q for t in self.tasks() for q in t.payload["questions"] if q]

    def worker(self) -> BfclWorker:
        return BfclWorker(self.python, timeout_s=self.worker_timeout_s)

    async def run_task(self, task: EvalTask, policy: EvalPolicy) -> TaskResult:
        p = task.payload
        cfg = RolloutConfig(temperature=0.0, max_tokens_per_turn=policy.max_tokens,
                            max_seq_len=policy.max_seq_len, request_deadline_s=policy.deadline_s,
                            episode_deadline_s=self.episode_deadline_s)
        try:
            async with self.worker() as worker:
                env = await BfclEnvSession.open(worker, p["category"], p["id"],
                                                steps_per_turn=self.steps_per_turn,
                                                tool_docs=self.tool_docs)
                ep = await policy.play(env, env_id=f"bfcl/{p['id']}", seed=0, cfg=cfg)
        except SandboxError as exc:
            return TaskResult(task.task_id, 0.0, False, error=f"bfcl worker: {exc}",
                              detail={"category": p["category"]})
        return self._result(task, env, ep, policy)

    def _result(self, task: EvalTask, env: BfclEnvSession, ep: Episode,
                policy: EvalPolicy) -> TaskResult:
        verdict = env.verdict or {
            "valid": False, "error_type": "multi_turn:force_terminated",
            "error_message": f"the episode stopped in request {env.turn + 1} of {env.turns}"}
        error = ep.error
        if error is None and not ep.turns and ep.truncated:
            error = (f"the prompt ({ep.prompt_len} tokens, with {len(env.meta.tools)} tool "
                     f"schemas) fills max_seq_len {policy.max_seq_len}")
        score = ep.score
        return TaskResult(
            task.task_id, score, score >= self.pass_mark, answer=transcript(ep),
            turns=len(ep.turns), completion_tokens=ep.generated_tokens, error=error,
            detail={"category": env.category, "error_type": verdict.get("error_type"),
                    "error_message": verdict.get("error_message"), "user_turns": env.turns,
                    "turns_done": env.turn, "calls": env.calls, "rejected_calls": env.rejected,
                    "capped_turns": env.capped_turns, "truncated": ep.truncated,
                    "prompt_tokens": ep.prompt_len, "path": ep.path})
