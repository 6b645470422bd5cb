"""What failed, where and why: the daemon's ledger of expected failures of work items.

A work item (a design request, a validation, an episode, an evaluation task, a memory or spool
write) can fail for a reason the daemon expects and survives: the endpoint timed out or went
away, a sandbox worker could not start, a disk write failed. Such a failure is counted per stage
and kind, logged once with its context, and the item is retried within its budget
(`retrying`) or given up with the reason recorded in `<run_dir>/given_up.jsonl`.

Anything else is a bug: `failure_kind` returns None for it and it propagates, so the daemon
fails fast with the real traceback. This module never decides what to retry: callers do.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio

from spade_async.core.logs import get_logger
from spade_async.core.rolling import Retention, rolling
from spade_async.inference.errors import EndpointError
from spade_async.loop.metrics import Metrics
from spade_async.sandbox.errors import SandboxError, SandboxNodeLost, WorkerStartError

log = get_logger("failures")
T = TypeVar("T")

# Where a work item can fail: the first part of every `stage.kind` counter and given-up record.
STAGES = frozenset({
    "document", "design", "edit", "edit_parent", "examples", "validation", "episode", "play",
    "play_stats", "replay", "seed", "eval", "load", "batch", "spool", "memory",
})


# Sandbox failures that are the host's, not the environment's: no worker started, or the
# sandbox node running it was lost. Never counted against the environment's code.
HOST_SANDBOX_FAILURES = frozenset({"sandbox_start", "sandbox_node_lost"})


def _stage(stage: str) -> str:
    if stage not in STAGES:
        raise ValueError(f"unknown failure stage {stage!r}; add it to failures.STAGES")
    return stage


def failure_kind(exc: BaseException) -> str | None:
    """The counter label of an expected failure; None for anything else (a bug)."""
    if isinstance(exc, EndpointError):
        return exc.kind
    if isinstance(exc, SandboxNodeLost):
        return "sandbox_node_lost"
    if isinstance(exc, WorkerStartError):
        return "sandbox_start"
    if isinstance(exc, SandboxError):
        return f"sandbox_{exc.kind}"
    if isinstance(exc, TimeoutError):  # a database or file deadline (an OSError too)
        return "io_timeout"
    if isinstance(exc, OSError):
        return "io"
    return None


def describe(exc: BaseException) -> dict[str, Any]:
    """The context an error carries, for the one log line: endpoint, attempts, seconds."""
    out: dict[str, Any] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
    for attr in ("endpoint", "attempts", "elapsed_s"):
        value = getattr(exc, attr, None)
        if value not in (None, 0):
            out[attr] = value
    return out


class GaveUp(Exception):
    """A work item failed for an expected reason on every attempt of its budget."""

    def __init__(self, stage: str, kind: str, attempts: int, last: BaseException) -> None:
        super().__init__(f"{stage} gave up after {attempts} attempt(s): {kind}: {last}")
        self.stage, self.kind, self.attempts, self.last = stage, kind, attempts, last


class Failures:
    """Counts by `stage.kind`, given-up items by stage; one log line per failure."""

    def __init__(self, run_dir: Path | None = None, metrics: Metrics | None = None,
                 retention: Retention | None = None) -> None:
        self.run_dir, self.metrics = run_dir, metrics
        self._log = None if run_dir is None else rolling(run_dir / "given_up.jsonl", retention)
        self.counts: Counter[str] = Counter()
        self.given_up: Counter[str] = Counter()

    def count(self, stage: str, kind: str, exc: BaseException | None = None,
              **context: Any) -> None:
        self.counts[f"{_stage(stage)}.{kind}"] += 1
        if self.metrics is not None:
            self.metrics.failures.labels(stage, kind).inc()
        log.warning(f"{stage}_failed", kind=kind, **context,
                    **(describe(exc) if exc is not None else {}))

    async def give_up(self, stage: str, reason: str, **context: Any) -> None:
        """Record that an item is abandoned, and why (one line of given_up.jsonl)."""
        self.given_up[_stage(stage)] += 1
        if self.metrics is not None:
            self.metrics.given_up.labels(stage).inc()
        log.error(f"{stage}_given_up", reason=reason, **context)
        if self._log is None:
            return
        line = json.dumps({"time": time.time(), "stage": stage, "reason": reason, **context},
                          ensure_ascii=False, default=str) + "\n"
        await anyio.to_thread.run_sync(self._log.append_bytes, line.encode("utf-8"))

    def as_dict(self) -> dict[str, Any]:
        return {"by_kind": dict(sorted(self.counts.items())),
                "given_up": dict(sorted(self.given_up.items())),
                "total": sum(self.counts.values())}

    async def retrying(self, stage: str, attempt_fn: Callable[[], Awaitable[T]], *,
                       attempts: int, backoff_s: float = 0.5, backoff_max_s: float = 10.0,
                       retry: Callable[[str], bool] = lambda _kind: True,
                       **context: Any) -> T:
        """`attempt_fn()` until it succeeds, at most `attempts` times with doubling back-off.
        An expected failure is counted and logged; when the budget is spent, or `retry(kind)`
        says trying again cannot help, GaveUp is raised. A bug propagates at once."""
        delay = backoff_s
        for attempt in range(1, attempts + 1):
            try:
                return await attempt_fn()
            except Exception as exc:
                kind = failure_kind(exc)
                if kind is None:
                    raise
                self.count(stage, kind, exc, attempt=attempt, of=attempts, **context)
                if attempt == attempts or not retry(kind):
                    raise GaveUp(stage, kind, attempt, exc) from exc
            await anyio.sleep(delay)
            delay = min(backoff_max_s, delay * 2)
        raise AssertionError("unreachable: attempts >= 1")
