"""The self-play daemon: one anyio task group, stages joined by bounded streams (DESIGN §2).

    corpus ─► designer (G designs per document) ─► sandbox validation ─► memory (novelty)
                                                                            │ accepted
    replay sampler (memory) ──────────────────────────────────────────────► env stream
                                                                            ▼
          K_u unhinted + K_h hinted episodes per env ─► regret ─► memory stats
                   └─► agent samples ─┐           designer samples (once all G of a doc are in)
                                      ▼                   ▼
                             one batch per document ─► spool (atomic, sequenced)

An "iteration" is one document taken through every stage and written to the spool. That document
alone is committed as used after the write (not the others still in flight), so a crash
re-designs exactly the documents that were in flight;
environments already stored stay stored, and a batch is on disk whole or not at all.

This module only wires the stages, each a component of its own in spade_async.loop: sources
(seeds, documents and edits, replays, the fixed pool), design and edit, play, batches,
telemetry and the evaluator. They share one LoopContext. The components they drive (designer,
episode runner, regret math, spool, memory) know nothing of this loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskStatus

from spade_async.core.config import SpadeConfig
from spade_async.core.logs import get_logger
from spade_async.core.spool.base import BatchSpool
from spade_async.corpus.sampler import CorpusSampler
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.pool import EndpointPool
from spade_async.loop.batches import Batches
from spade_async.loop.context import LoopContext
from spade_async.loop.control import watch_stop_requests
from spade_async.loop.design import Documents
from spade_async.loop.edit import Edits
from spade_async.loop.evaluator import Evaluator
from spade_async.loop.jobs import PlayJob
from spade_async.loop.play import Player
from spade_async.loop.ports import MemoryPort
from spade_async.loop.sources import DesignerSource, FixedSource, TrainerPace, bootstrap_seeds
from spade_async.loop.telemetry import Telemetry
from spade_async.sandbox.runtime import Sandbox

log = get_logger("daemon")


class Daemon:
    def __init__(self, cfg: SpadeConfig, *, pool: EndpointPool, sandbox: Sandbox,
                 memory: MemoryPort, spool: BatchSpool, corpus: CorpusSampler, chat: ChatTokens,
                 run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.ctx = ctx = LoopContext(cfg, pool=pool, sandbox=sandbox, memory=memory,
                                     spool=spool, chat=chat, run_dir=run_dir)
        self.telemetry = Telemetry(ctx)
        self.batches = Batches(ctx, corpus)
        pace = TrainerPace(ctx)
        self.player = Player(ctx, self.batches, pace)
        self.evaluator = Evaluator(ctx)
        self._flow: anyio.CancelScope | None = None
        self.source = (FixedSource(ctx, pace) if cfg.daemon.mode == "fixed" else
                       DesignerSource(ctx, corpus, Documents(ctx, self.batches),
                                      Edits(ctx, self.batches), pace))

    async def run(self, max_iterations: int | None = None, *,
                  task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until `max_iterations` documents are through every stage, or `stop()`."""
        ctx, dcfg = self.ctx, self.cfg.daemon
        self.run_dir.mkdir(parents=True, exist_ok=True)
        ctx.policy.refresh()
        ctx.start_version = ctx.policy.version
        # accepted environments (and replays) wait here for room to play: a bounded stream
        send_env, recv_env = anyio.create_memory_object_stream[PlayJob](dcfg.env_queue)
        ctx.queue_depth = lambda: send_env.statistics().current_buffer_used
        if dcfg.metrics_port:
            ctx.metrics.serve(dcfg.metrics_port)
        try:
            async with anyio.create_task_group() as beside:
                beside.start_soon(self.telemetry.run)  # status.json, metrics, saturation
                beside.start_soon(watch_stop_requests, ctx)  # `spade experiment`'s budget stop
                if self.cfg.eval.every_versions:
                    beside.start_soon(self.evaluator.run)  # held-out scores per version
                task_status.started()
                if dcfg.bootstrap_seeds:
                    await bootstrap_seeds(ctx)  # an empty memory gets the seed environments
                async with anyio.create_task_group() as flow:
                    self._flow = flow.cancel_scope
                    # corpus → designs → validation → memory (or the fixed pool; replays)
                    flow.start_soon(self.source.run, send_env, max_iterations)
                    # → episodes → regret → memory stats → samples → batches → spool
                    flow.start_soon(self.player.run, recv_env)
                if ctx.final_eval and self.cfg.eval.every_versions:
                    # a bounded run's last point: the version it stopped on, evaluated
                    await self.evaluator.evaluate_current(final=True)
                beside.cancel_scope.cancel()
        finally:  # also when the drain deadline cancels us: status says it stopped
            self.telemetry.stopped = True
            self.telemetry.write_status()
            log.info("daemon_stopped", iterations=ctx.iterations, reason=ctx.stop_reason,
                     **dict(ctx.counters))

    def stop(self, reason: str = "signal") -> None:
        """Finish the documents in flight, then return (SIGTERM/SIGINT, or a bounded run)."""
        self.ctx.stop(reason)

    def cut_drain(self) -> None:
        """The drain took too long: cancel the work in flight (a final evaluation, when one
        was asked for, still runs)."""
        if self._flow is not None:
            self._flow.cancel()

    def status(self) -> dict[str, Any]:
        return self.telemetry.status()

    def saturation_run(self, name: str) -> dict[str, Any] | None:
        return self.telemetry.saturation_run(name)

    # what callers read while it runs (the CLI, benches, tests)
    stop_requested = property(lambda self: self.ctx.stop_requested)
    stop_reason = property(lambda self: self.ctx.stop_reason)
    counters = property(lambda self: self.ctx.counters)
    in_flight = property(lambda self: self.ctx.in_flight)
    iterations = property(lambda self: self.ctx.iterations)
    failures = property(lambda self: self.ctx.failures)
    metrics = property(lambda self: self.ctx.metrics)
    admission = property(lambda self: self.ctx.admission)
    policy = property(lambda self: self.ctx.policy)
    waiting_for_trainer = property(lambda self: self.ctx.waiting_for_trainer)
    final_eval = property(lambda self: self.ctx.final_eval)
