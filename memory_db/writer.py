"""The memory's single writer: one task owns every write to the database.

Producers put operations (`ops`) on a bounded stream (back-pressure when the writer falls
behind) and wait for the batch that carries theirs to commit. A batch is whatever arrived within
`flush_interval_s` of its first operation, up to `batch_size`; it commits as at most one append to
`envs`, one merge_insert into `env_stats` and one upsert of the replay clock in `meta`. An
operation is acknowledged only after its batch committed, so a crash (even kill -9) loses only
unacknowledged work: Lance commits a version atomically, and a half-written batch is never seen.

Because all writes pass through here, the writer's in-memory view (which ids exist, their status,
every variant's stats and environment, the replay clock) is authoritative: the novelty filter
sees every environment of its own batch, and replay sampling is a read-modify-write without
races. Maintenance (`maintenance`) runs between batches.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import anyio
import numpy as np
import structlog
from anyio.abc import TaskGroup, TaskStatus
from lancedb.index import BTree

from memory_db.capacity import oldest_beyond, to_retire
from memory_db.config import MemoryConfig
from memory_db.maintenance import BESIDE, IN_LINE, Maintenance
from memory_db.novelty import BatchNovelty, nearest_accepted
from memory_db.ops import InsertPayload, MemoryClosed, Op, Payload, RecordPayload
from memory_db.records import EnvStats, InsertResult
from memory_db.replay import pool_distribution, replay_pool
from memory_db.rows import envs_table, stats_from_row, stats_table
from memory_db.schema import Tables, env_id, now_utc, sql_str, write_meta
from memory_db.stats import update_stats

log = structlog.get_logger(component="memory")
# While an upkeep runs beside the writes, the writer looks again this often for the next one.
UPKEEP_POLL_S = 1.0


class Writer:
    def __init__(self, cfg: MemoryConfig, tables: Tables, dim: int) -> None:
        self.cfg, self.t, self.dim = cfg, tables, dim
        self._send, self._recv = anyio.create_memory_object_stream[Op](cfg.writer.queue_size)
        self._closed = False
        self.finished = anyio.Event()
        # Scheduled upkeep (compaction, index training) runs beside the writes, one at a time;
        # an explicit maintain() waits for it, then runs in line.
        self._upkeep_tg: TaskGroup | None = None
        self._upkeep_idle = anyio.Event()
        self._upkeep_idle.set()
        self.known: dict[str, tuple[str, str]] = {}  # id -> (status, reason)
        self.stats: dict[str, EnvStats] = {}  # variant id -> its stats
        self.family: dict[str, tuple[str, str]] = {}  # variant id -> (env_id, canonical params)
        self.env_of: dict[str, str] = {}  # variant id -> env_id (the replay pool's join)
        self._accepted: set[str] = set()  # kept with `known`: a draw must not scan every row
        # environments the capacity deleted lately: a play of one still in flight is recorded
        # as nothing, not as an error (bounded: older ones are long out of flight)
        self._retired: dict[str, None] = {}
        self.deleted = {"retired": int(tables.info.get("retired_total", 0)),
                        "rejected": int(tables.info.get("rejected_deleted_total", 0))}
        self.clock = self.clock_saved = int(tables.info.get("replay_tick", 0))
        self.upkeep = Maintenance(cfg, tables, dim)
        self.commits = 0

    # ---- state ---------------------------------------------------------------------------

    async def load(self) -> None:
        """Read the authoritative state once, before the first operation."""
        with anyio.fail_after(self.cfg.db_timeout_s):
            rows = await self.t.envs.query().select(["id", "status", "reason"]).to_arrow()
            stats = await self.t.stats.query().to_arrow()
            indices = await self.t.envs.list_indices()
        self.known = {i: (s, r) for i, s, r in zip(rows["id"].to_pylist(),
                                                   rows["status"].to_pylist(),
                                                   rows["reason"].to_pylist(), strict=True)}
        stat_rows = stats.to_pylist()
        self.stats = {r["id"]: stats_from_row(r) for r in stat_rows}
        self.family = {r["id"]: (r["env_id"], r["params"]) for r in stat_rows}
        self.env_of = {vid: env for vid, (env, _) in self.family.items()}
        self._accepted = {i for i, (s, _) in self.known.items() if s == "accepted"}
        # the status column's index rides along with the embedding's
        self.upkeep.has_index = any(ix.columns == ["embedding"] for ix in indices)
        await self._id_indexes(indices)
        # a crash between the stats commit and the clock's leaves the clock behind: catch up
        ticks = [s.last_tick for s in self.stats.values() if s.last_tick is not None]
        self.clock = max(self.clock, max(ticks, default=-1) + 1)

    async def _id_indexes(self, env_indices: list[Any]) -> None:
        """A BTree on each table's id, the key of every merge_insert and point read (without
        it each upsert scans the table); created once, kept current by optimize()."""
        with anyio.fail_after(self.cfg.db_timeout_s):
            stat_indices = await self.t.stats.list_indices()
            for table, indices in ((self.t.envs, env_indices), (self.t.stats, stat_indices)):
                if not any(ix.columns == ["id"] for ix in indices):
                    await table.create_index("id", config=BTree())

    @property
    def accepted(self) -> set[str]:
        return self._accepted

    # ---- producers -----------------------------------------------------------------------

    async def submit(self, payload: Payload) -> Any:
        return (await self.submit_many([payload]))[0]

    async def submit_many(self, payloads: Sequence[Payload]) -> list[Any]:
        if self._closed:
            raise MemoryClosed("the memory writer is not running")
        ops = [Op(p) for p in payloads]
        try:
            with anyio.fail_after(self.cfg.writer.write_timeout_s):
                try:
                    for op in ops:
                        try:  # no checkpoint while there is room: one call's ops share a batch
                            self._send.send_nowait(op)
                        except anyio.WouldBlock:
                            await self._send.send(op)  # the queue is full: back-pressure
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    raise MemoryClosed("the memory writer is not running") from None
                for op in ops:
                    await op.done.wait()
        except BaseException as exc:
            # Timed out or cancelled: what the writer has not taken yet is dropped; what it
            # has taken is waited for (its own database deadlines bound that), so the caller
            # never retries an operation that still commits later (a play's episodes would
            # count twice). A timeout whose ops all committed meanwhile is no failure.
            if not await self._leave(ops) or not isinstance(exc, TimeoutError):
                raise
        for op in ops:
            if op.error is not None:
                raise op.error
        return [op.result for op in ops]

    async def _leave(self, ops: list[Op]) -> bool:
        """The producer of `ops` stops waiting: abandon the ones not yet taken, wait (shielded)
        for the others; True when every op finished."""
        with anyio.CancelScope(shield=True):
            for op in ops:
                if not op.taken:
                    op.abandoned = True
            for op in ops:
                if op.taken:
                    await op.done.wait()
        return all(op.done.is_set() for op in ops)

    def close(self) -> None:
        """No new operations; the writer commits what is queued, then `run` returns."""
        self._closed = True
        self._send.close()

    # ---- the loop ------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._recv, anyio.create_task_group() as upkeep:
            self._upkeep_tg = upkeep
            try:
                task_status.started()
                while True:
                    batch = await self._collect()
                    if batch is None:
                        break
                    try:
                        await self._flush(batch)
                    except BaseException as exc:  # a bug or cancellation: nobody waits forever
                        for op in batch:
                            if not op.done.is_set():
                                op.finish(error=MemoryClosed(f"the writer stopped: {exc!r}"))
                        raise
                    if (time.monotonic() >= self.upkeep.next_optimize
                            and self._upkeep_idle.is_set()):
                        await self._optimize_in_line()
                        self._upkeep_beside(optimize=True, index="auto")
            finally:
                self._closed = True
                self._fail_queued()
                # Upkeep under way is dropped: Lance commits a compaction or an index whole or
                # not at all, and the next start's schedule runs it again.
                upkeep.cancel_scope.cancel()
                self._upkeep_tg = None
                self.finished.set()

    async def _optimize_in_line(self) -> None:
        """The upserted tables' compaction and pruning, between two batches (see
        `maintenance`): a failure is logged and waits for the next period."""
        try:
            t0 = time.perf_counter()
            report = await self._enforce_capacity()
            report.update(await self.upkeep.optimize(IN_LINE))
            log.info("memory_optimized", **report, optimize_s=round(time.perf_counter() - t0, 3))
        except Exception as exc:
            log.error("memory_upkeep_failed", optimize=True, tables=list(IN_LINE),
                      error=repr(exc))

    async def _enforce_capacity(self) -> dict[str, int]:
        """`max_accepted` and `max_rejected` (memory_db.capacity): delete what is past them,
        between two batches (the stats rows take upserts), then forget it here."""
        cfg, out = self.cfg, {}
        retire = to_retire(self._accepted, self.stats, self.env_of, keep=cfg.max_accepted,
                           score=cfg.replay.score, now=now_utc(), grace_s=cfg.retire_grace_s)
        drop: list[str] = []
        rejected = sum(1 for s, _ in self.known.values() if s == "rejected")
        if cfg.max_rejected and rejected > cfg.max_rejected:
            with anyio.fail_after(cfg.db_timeout_s):
                rows = await (self.t.envs.query().where("status = 'rejected'")
                              .select(["id", "created_at"]).to_arrow())
            drop = oldest_beyond(list(zip(rows["id"].to_pylist(),
                                          rows["created_at"].to_pylist(), strict=True)),
                                 cfg.max_rejected)
        if not retire and not drop:
            return out
        gone = set(retire)
        variants = [v for v, e in self.env_of.items() if e in gone]
        await self._delete_ids(self.t.envs, [*retire, *drop])
        await self._delete_ids(self.t.stats, variants)
        for i in [*retire, *drop]:
            self.known.pop(i, None)
        for i in retire:
            self._accepted.discard(i)
            self._retired[i] = None
        for v in variants:
            self.stats.pop(v, None)
            self.family.pop(v, None)
            self.env_of.pop(v, None)
        while len(self._retired) > 100_000:
            del self._retired[next(iter(self._retired))]
        self.deleted["retired"] += len(retire)
        self.deleted["rejected"] += len(drop)
        with anyio.fail_after(cfg.db_timeout_s):
            await write_meta(self.t.meta, {"retired_total": self.deleted["retired"],
                                           "rejected_deleted_total": self.deleted["rejected"]})
        log.info("memory_capacity", retired=len(retire), variants_deleted=len(variants),
                 rejected_deleted=len(drop), accepted=len(self._accepted))
        return {"retired": len(retire), "rejected_deleted": len(drop)}

    async def _delete_ids(self, table: Any, ids: list[str], chunk: int = 500) -> None:
        """Delete the rows of `table` with these ids, `chunk` to a statement."""
        for i in range(0, len(ids), chunk):
            with anyio.fail_after(self.cfg.db_timeout_s):
                await table.delete("id IN (" + ", ".join(map(sql_str, ids[i:i + chunk])) + ")")

    def _upkeep_beside(self, *, optimize: bool, index: str) -> None:
        """Scheduled upkeep in its own task, so writes go on while a compaction or an index
        build (minutes on a large table) runs; one at a time. Lance commits an append beside an
        index build or a compaction (the new rows stay unindexed until the next optimize)."""
        if not self._upkeep_idle.is_set() or self._upkeep_tg is None:
            return
        self._upkeep_idle = anyio.Event()
        if optimize:
            self.upkeep.postpone()  # the next one is a period from now, whatever this one does

        async def work(done: anyio.Event) -> None:
            try:
                await self.upkeep.run(len(self.known), optimize=optimize, index=index,
                                      tables=BESIDE)
            except Exception as exc:  # compaction and training wait for the next period
                self.upkeep.postpone()
                log.error("memory_upkeep_failed", optimize=optimize, index=index,
                          error=repr(exc))
            finally:
                done.set()

        self._upkeep_tg.start_soon(work, self._upkeep_idle)

    def _fail_queued(self) -> None:
        """Operations still queued when the writer stops fail now instead of at their deadline."""
        while True:
            try:
                op = self._recv.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return
            op.finish(error=MemoryClosed("the memory writer stopped before this was written"))

    async def _collect(self) -> list[Op] | None:
        """The next batch; [] when maintenance came due while idle; None at end of stream."""
        wait = max(0.0, self.upkeep.next_optimize - time.monotonic())
        if not self._upkeep_idle.is_set():
            # Upkeep under way beside the writes: what comes due next waits for it, the writes
            # do not. (A zero wait here cancelled every receive: once an upkeep outlasted the
            # period, the writer spun and took no write until it ended.)
            wait = max(wait, UPKEEP_POLL_S)
        first = None
        with anyio.move_on_after(wait):
            try:
                first = await self._recv.receive()
            except anyio.EndOfStream:
                return None
        if first is None:
            return []
        batch = [first]
        deadline = time.monotonic() + self.cfg.writer.flush_interval_s
        while len(batch) < self.cfg.writer.batch_size:
            try:
                batch.append(self._recv.receive_nowait())
                continue
            except anyio.WouldBlock:
                pass
            except anyio.EndOfStream:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            with anyio.move_on_after(remaining):
                try:
                    batch.append(await self._recv.receive())
                except anyio.EndOfStream:
                    break
        return batch

    async def _flush(self, batch: list[Op]) -> None:
        batch = [op for op in batch if not op.abandoned]  # their producers left: never written
        for op in batch:
            op.taken = True
        if not batch:
            return
        by_kind: dict[str, list[Op]] = {}
        for op in batch:
            by_kind.setdefault(op.kind, []).append(op)
        dirty: dict[str, EnvStats] = {}
        clock_before = self.clock
        stages = [("insert", self._inserts), ("record", self._records), ("sample", self._samples)]
        for kind, stage in stages:
            ops = by_kind.get(kind, [])
            if not ops:
                continue
            try:
                await stage(ops, dirty)
            except Exception as exc:  # the database failed: every op of this stage fails with it
                log.error("memory_write_failed", stage=kind, ops=len(ops), error=repr(exc))
                for op in ops:
                    if not op.done.is_set():
                        op.finish(error=exc)
        pending = [op for kind in ("record", "sample") for op in by_kind.get(kind, [])
                   if not op.done.is_set()]
        try:
            if dirty:
                with anyio.fail_after(self.cfg.db_timeout_s):
                    await (self.t.stats.merge_insert("id").when_matched_update_all()
                           .when_not_matched_insert_all()
                           .execute(stats_table(list(dirty.values()), self.family)))
        except Exception as exc:
            log.error("memory_stats_write_failed", ops=len(pending), error=repr(exc))
            self.clock = clock_before  # nothing of `dirty` was committed
            for op in pending:
                op.finish(error=exc)
        else:
            self.stats.update(dirty)
            for op in pending:
                op.finish(op.result)
        if self.clock != self.clock_saved:
            try:
                with anyio.fail_after(self.cfg.db_timeout_s):
                    await write_meta(self.t.meta, {"replay_tick": self.clock})
                self.clock_saved = self.clock
            except Exception as exc:  # retried with the next batch; load() repairs a lag
                log.error("memory_clock_write_failed", error=repr(exc))
        for op in by_kind.get("maintain", []):
            await self._upkeep_idle.wait()  # an explicit maintain follows the upkeep under way
            try:
                op.finish(await self._maintain(optimize=op.payload.optimize,
                                               index=op.payload.index))
            except Exception as exc:
                op.finish(error=exc)
        if "insert" in by_kind and self.upkeep.index_due(len(self.known)):
            # searches stay exact (flat) until it is built; a failure is retried next batch
            self._upkeep_beside(optimize=False, index="auto")
        self.commits += 1

    # ---- stages --------------------------------------------------------------------------

    async def _inserts(self, ops: list[Op], dirty: dict[str, EnvStats]) -> None:
        ids = [env_id(op.payload.env.code) for op in ops]
        fresh = [j for j, i in enumerate(ids) if i not in self.known]
        to_check = [j for j in fresh if ops[j].payload.env.check_novelty
                    and ops[j].payload.env.rejected_reason is None]
        vectors = [ops[j].payload.vector for j in to_check]
        found = (await nearest_accepted(self.t.envs, self.cfg, vectors)
                 if self._accepted
                 else [None] * len(vectors))
        nearest = dict(zip(to_check, found, strict=True))
        novelty = BatchNovelty(self.cfg.novelty_threshold)
        batch_ids: dict[str, InsertResult] = {}
        rows: list[tuple[InsertPayload, InsertResult]] = []
        results: list[InsertResult] = []
        now = now_utc()
        for j, (op, eid) in enumerate(zip(ops, ids, strict=True)):
            if eid in self.known:
                status, reason = self.known[eid]
                results.append(InsertResult(eid, status, reason, existed=True))
                continue
            if eid in batch_ids:
                results.append(replace(batch_ids[eid], existed=True))
                continue
            res = novelty.judge(eid, op.payload.env, op.payload.vector, nearest.get(j))
            batch_ids[eid] = res
            results.append(res)
            rows.append((op.payload, res))
        if rows:
            with anyio.fail_after(self.cfg.db_timeout_s):
                await self.t.envs.add(envs_table(rows, now, self.dim))
            for _, res in rows:
                self.known[res.id] = (res.status, res.reason)
                if res.status == "accepted":
                    self._accepted.add(res.id)
        for op, res in zip(ops, results, strict=True):
            op.finish(res)
        if rows:
            log.debug("memory_inserted", rows=len(rows),
                      accepted=sum(r.status == "accepted" for _, r in rows))

    async def _records(self, ops: list[Op], dirty: dict[str, EnvStats]) -> None:
        now = now_utc()
        for op in ops:
            rec: RecordPayload = op.payload
            if rec.env_id not in self.known:
                if rec.env_id in self._retired:  # a play that was in flight: nothing to keep
                    op.finish(EnvStats(id=rec.variant_id))
                    continue
                op.finish(error=KeyError(f"unknown environment {rec.env_id}"))
                continue
            vid = rec.variant_id
            # set before the commit; harmless if it fails: the same variant maps the same way
            self.family[vid] = (rec.env_id, rec.params)
            self.env_of[vid] = rec.env_id
            prev = dirty.get(vid) or self.stats.get(vid) or EnvStats(id=vid)
            new = update_stats(prev, rec.episodes, alpha=self.cfg.ema_alpha, now=now)
            if new.last_tick is None and rec.episodes.scored:  # first play: a replay visit
                new = replace(new, last_tick=self.clock)
                self.clock += 1
            dirty[vid] = new
            op.result = new  # finished once the stats commit

    async def _samples(self, ops: list[Op], dirty: dict[str, EnvStats]) -> None:
        for op in ops:
            u = op.payload.u
            pool = replay_pool({**self.stats, **dirty}, self._accepted, self.env_of)
            if not pool:
                op.finish(None)
                continue
            p = pool_distribution(pool, self.clock, self.cfg.replay)
            k = min(int(np.searchsorted(np.cumsum(p), u * p.sum(), side="right")), len(pool) - 1)
            chosen = pool[k]
            dirty[chosen.id] = replace(chosen, last_tick=self.clock,
                                       times_replayed=chosen.times_replayed + 1,
                                       updated_at=now_utc())
            self.clock += 1
            op.result = (chosen.id, float(p[k]))

    # ---- maintenance ---------------------------------------------------------------------

    async def _maintain(self, *, optimize: bool, index: str) -> dict[str, Any]:
        """Everything now, in line (an explicit `maintain()`): the capacity, then the upkeep."""
        report: dict[str, Any] = await self._enforce_capacity() if optimize else {}
        return {**report, **await self.upkeep.run(len(self.known), optimize=optimize,
                                                   index=index)}
