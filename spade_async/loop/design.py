"""The write move's stages: a document → G design requests (with memory examples) → each
design validated in the sandbox → stored in the memory (novelty decides) → the accepted ones
into the env stream; the group waits for their plays, then goes to the batch stage.
`design_rounds` (the G requests, retried as a whole when every one failed) serves the edit move
too."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from spade_async.core.logs import get_logger
from spade_async.corpus.documents import Chunk
from spade_async.design.designer import Design, design
from spade_async.inference.errors import EndpointError
from spade_async.loop.admission import Reservation
from spade_async.loop.batches import Batches
from spade_async.loop.context import OUTAGE, LoopContext
from spade_async.loop.failures import GaveUp, failure_kind
from spade_async.loop.jobs import DocGroup, PlayJob
from spade_async.reward.regret import DesignStatus

log = get_logger("daemon")


def group_ended(ctx: LoopContext, streams: Reservation) -> None:
    """A document or edit group left the loop: its admission is free again."""
    streams.close()
    ctx.admission.documents -= 1
    ctx.admission.notify()


async def design_rounds(ctx: LoopContext, group: DocGroup, one: Callable[[], Awaitable[None]],
                        n: int) -> None:
    """The group's G designs (`one()` makes one). When the endpoints failed every one of
    them, the group is designed again after a back-off (1 s, doubling to 30 s): an outage
    (no endpoint up, connection refused, the model not served yet) is waited out, so a
    dead endpoint neither spins through the corpus nor loses documents; other failures
    (timeouts, deadlines, 5xx, malformed answers) get `daemon.document_attempts` tries,
    then the document (or edited variant) is given up and recorded."""
    attempts = ctx.cfg.daemon.document_attempts
    delay, tries = 1.0, 0
    while True:
        group.request_failures = []
        if group.streams is None or not group.streams.left:  # a second round
            group.streams = ctx.admission.reserve(ctx.routes["designer"].group, n)
        try:
            async with anyio.create_task_group() as tg:
                for _ in range(n):
                    tg.start_soon(one)
        finally:
            group.streams.close()
        failed = group.request_failures
        if group.designs or len(failed) < n or ctx.stopping:
            return
        outage = all(kind in OUTAGE for kind in failed)
        tries += 0 if outage else 1
        if tries >= attempts:
            await ctx.failures.give_up(
                "document" if group.move == "write" else "edit",
                f"all {n} design requests failed on {tries} tries (last: "
                + ", ".join(f"{k} {v}" for k, v in sorted(Counter(failed).items())) + ")",
                chunk=group.label)
            return
        ctx.counters["documents_retried"] += 1
        log.warning("document_designs_all_failed", chunk=group.label,
                    kinds=sorted(set(failed)), outage=outage, retry_in_s=delay,
                    tries=tries, of=attempts)
        await ctx.pause(delay)
        delay = min(30.0, delay * 2)


async def designer_request(ctx: LoopContext, group: DocGroup, move_stage: str,
                           call: Callable[[Any], Awaitable[Design]],
                           **context: Any) -> tuple[Design, float] | None:
    """One designer request on the group's next admitted stream, with the newest policy
    (a retried group designs with it): the design and its seconds, or None when the endpoint
    failed it (counted under `move_stage`, design or edit, and kept for design_rounds)."""
    ctx.in_flight["designs"] += 1
    ctx.policy.refresh()
    stream = group.streams.take() if group.streams is not None else None
    t0 = time.monotonic()
    try:
        d = await call(ctx.pool_for(stream, "designer"))
    except EndpointError as exc:
        ctx.failures.count(move_stage, exc.kind, exc, **context)
        group.request_failures.append(exc.kind)
        return None
    finally:
        ctx.in_flight["designs"] -= 1
        if stream is not None:
            stream.end()
    ctx.counters["designs"] += 1
    ctx.counters[f"moves_{group.move}_proposed"] += 1
    ctx.ledger.play("designer")
    group.answered += 1  # the batch stage drops those that never joined group.designs
    ctx.sampled_with(d.policy_version, episode=False)
    return d, time.monotonic() - t0


class Documents:
    """The write move, one document at a time per task."""

    def __init__(self, ctx: LoopContext, batches: Batches) -> None:
        self.ctx, self.batches = ctx, batches

    async def run(self, chunk: Chunk, send_env, streams: Reservation) -> None:
        ctx = self.ctx
        group = DocGroup(chunk, label=chunk.chunk_id, streams=streams)
        log.info("document_start", chunk=chunk.chunk_id, seq=chunk.seq)
        try:
            async with send_env:
                examples = await self._examples(chunk)
                await design_rounds(ctx, group, lambda: self._one(group, examples),
                                    ctx.cfg.daemon.designs_per_document)
                accepted = [d for d in group.designs
                            if group.status[d.design_id] is DesignStatus.ACCEPTED]
                group.pending = len(accepted)
                if not accepted:
                    group.done.set()
                for d in accepted:
                    env_id = group.env_of[d.design_id]
                    await send_env.send(PlayJob(env_id, d.code or "", env_id, group,
                                                move="write"))
            await group.done.wait()
            await self.batches.finish_group(group)
        finally:
            group_ended(ctx, streams)

    async def _examples(self, chunk: Chunk) -> list[str]:
        """Memory examples for the designer prompt; a failed search designs without them."""
        ctx = self.ctx
        if not ctx.cfg.daemon.examples_k:
            return []
        try:
            return await ctx.memory.examples(chunk.text, ctx.cfg.daemon.examples_k)
        except Exception as exc:
            kind = failure_kind(exc)
            if kind is None:
                raise
            ctx.failures.count("examples", kind, exc, chunk=chunk.chunk_id)
            return []

    async def _one(self, group: DocGroup, examples: list[str]) -> None:
        """One design request, its validation and its memory record."""
        ctx = self.ctx
        dcfg, chunk = ctx.cfg.daemon, group.chunk
        route = ctx.routes["designer"]
        got = await designer_request(ctx, group, "design", lambda pool: design(
            pool, ctx.chat, doc_id=chunk.doc_id, chunk_id=chunk.chunk_id,
            excerpt=chunk.text, examples=examples, model=route.model or ctx.policy.model,
            policy_version=ctx.policy.version, max_tokens=dcfg.designer_max_tokens,
            temperature=dcfg.designer_temperature, prefill=dcfg.designer_prefill,
            max_seq_len=ctx.cfg.rollout.max_seq_len,
            deadline_s=ctx.cfg.rollout.request_deadline_s, path=route.path,
            group=route.group), chunk=chunk.chunk_id)
        if got is None:
            return
        d, design_s = got
        t0 = time.monotonic()
        try:
            report = None if d.code is None else await ctx.validate(
                d.code, read_hint=True, chunk=chunk.chunk_id, design_id=d.design_id)
            status, env_id, reason = await ctx.memory_op(
                lambda: ctx.memory.add_design(
                    d.code, report, doc_id=chunk.doc_id, chunk_id=chunk.chunk_id,
                    excerpt=chunk.text, policy_version=d.policy_version),
                chunk=chunk.chunk_id, design_id=d.design_id)
        except GaveUp as exc:
            # Not the designer's doing: the design gets no reward and no sample.
            await ctx.failures.give_up("design", str(exc), chunk=chunk.chunk_id,
                                       design_id=d.design_id, failed_in=exc.stage)
            return
        validation_s = time.monotonic() - t0  # with the memory's novelty check
        group.designs.append(d)
        group.status[d.design_id] = status
        if report is not None:
            group.checks_passed[d.design_id] = report.progress
        ctx.counters[f"designs_{status.value}"] += 1
        ctx.metrics.designs.labels(status.value).inc()
        ctx.metrics.tokens.labels("designer").inc(d.completion_tokens)
        if status is DesignStatus.ACCEPTED:
            group.env_of[d.design_id] = env_id or ""
            ctx.counters["moves_write_accepted"] += 1
        else:
            ctx.rejected(reason)
        log.info("design", chunk=chunk.chunk_id, status=status.value, env_id=env_id,
                 reason=reason or None)
        await ctx.append("designs", {
            "time": time.time(), "design_id": d.design_id, "doc_id": chunk.doc_id,
            "chunk_id": chunk.chunk_id, "policy_version": d.policy_version,
            "status": status.value, "reason": reason.split(":")[0] if reason else "",
            "env_id": env_id, "completion_tokens": d.completion_tokens,
            "progress": report.progress if report is not None else 0.0, "move": "write",
            "parent": None, "params": None, "variant_id": None,
            "family": report.meta.name if report is not None and report.meta else None,
            "path": d.path, "model": d.model, "prompt_tokens": d.prompt_len,
            "design_s": round(design_s, 3), "validation_s": round(validation_s, 3)})
