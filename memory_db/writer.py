"""The memory's single writer: one task owns every write to the database.

Producers put operations on a bounded stream (back-pressure when the writer falls behind) and
wait for the batch that carries theirs to commit. A batch is whatever arrived within
`flush_interval_s` of its first operation, up to `batch_size`; it commits as at most one append to
`envs`, one merge_insert into `env_stats` and one upsert of the replay clock in `meta`. An
operation is acknowledged only after its batch committed, so a crash (even kill -9) loses only
unacknowledged work: Lance commits a version atomically, and a half-written batch is never seen.

Because all writes pass through here, the writer's in-memory view (which ids exist, their status,
every variant's stats and environment, the replay clock) is authoritative: the novelty filter
sees every environment of its own batch, and replay sampling is a read-modify-write without
races.
Maintenance runs between batches: `optimize()` every `optimize_every_s` (compaction, pruning of
old versions, folding new rows into the ANN index) and index (re)training when the table grew.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Literal

import anyio
import numpy as np
import pyarrow as pa
import structlog
from anyio.abc import TaskStatus
from lancedb.index import Bitmap, IvfPq

from memory_db.config import MemoryConfig
from memory_db.records import (
    EnvStats,
    Episodes,
    InsertResult,
    NewEnv,
    VariantStats,
    update_stats,
)
from memory_db.replay import pool_distribution, replay_pool
from memory_db.schema import (
    STATS_SCHEMA,
    Tables,
    env_id,
    envs_schema,
    now_utc,
    write_meta,
)

log = structlog.get_logger(component="memory")
NOVELTY_PROBE = 8  # nearest rows of any status looked at before a status-filtered search


class MemoryClosed(RuntimeError):
    """The memory has no running writer (opened read-only, or already closed)."""


@dataclass(frozen=True)
class InsertPayload:
    """Store `env` (embedded as `vector`) through the novelty filter: an InsertResult."""

    env: NewEnv
    vector: np.ndarray


@dataclass(frozen=True)
class RecordPayload:
    """Episodes of environment `env_id` played at `params` (canonical JSON), which is the
    variant `variant_id`."""

    env_id: str
    params: str
    variant_id: str
    episodes: Episodes


@dataclass(frozen=True)
class SamplePayload:
    """Draw a played variant by P_replay (`u` uniform in [0, 1)) once at least `min_seen`
    variants were played, and mark it visited: (variant id, probability) or None."""

    u: float
    min_seen: int = 1


@dataclass(frozen=True)
class MaintainPayload:
    """Compaction and (re)indexing now, between batches: what was done."""

    optimize: bool = True
    index: Literal["auto", "force", "skip"] = "auto"


Payload = InsertPayload | RecordPayload | SamplePayload | MaintainPayload
_KINDS: dict[type, str] = {InsertPayload: "insert", RecordPayload: "record",
                           SamplePayload: "sample", MaintainPayload: "maintain"}


@dataclass
class Op:
    """One queued operation; its kind (the stage that runs it) follows from its payload."""

    payload: Payload
    done: anyio.Event = field(default_factory=anyio.Event)
    result: Any = None
    error: BaseException | None = None

    @property
    def kind(self) -> str:
        return _KINDS[type(self.payload)]

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


def refine_factor(cfg: MemoryConfig, limit: int) -> int:
    return max(1, -(-cfg.index.refine_candidates // max(1, limit)))


VARIANT_COLUMNS = ("env_id", "params")  # the variant's identity; every other column is EnvStats
STAT_COLUMNS = [n for n in STATS_SCHEMA.names if n not in VARIANT_COLUMNS]


def stats_from_row(row: dict[str, Any]) -> EnvStats:
    return EnvStats(**{k: row[k] for k in STAT_COLUMNS})


def variant_from_row(row: dict[str, Any]) -> VariantStats:
    return VariantStats(env_id=row["env_id"], params=json.loads(row["params"]),
                        stats=stats_from_row(row))


def stats_table(rows: list[EnvStats], family: dict[str, tuple[str, str]]) -> pa.Table:
    """Rows of env_stats; `family` maps each variant id to (env_id, canonical params)."""
    cols: dict[str, list[Any]] = {name: [getattr(s, name) for s in rows] for name in STAT_COLUMNS}
    cols["env_id"] = [family[s.id][0] for s in rows]
    cols["params"] = [family[s.id][1] for s in rows]
    return pa.table({name: cols[name] for name in STATS_SCHEMA.names}, schema=STATS_SCHEMA)


class Writer:
    def __init__(self, cfg: MemoryConfig, tables: Tables, dim: int) -> None:
        self.cfg, self.t, self.dim = cfg, tables, dim
        self._send, self._recv = anyio.create_memory_object_stream[Op](cfg.writer.queue_size)
        self._closed = False
        self.finished = anyio.Event()
        self.known: dict[str, tuple[str, str]] = {}  # id -> (status, reason)
        self.stats: dict[str, EnvStats] = {}  # variant id -> its stats
        self.family: dict[str, tuple[str, str]] = {}  # variant id -> (env_id, canonical params)
        self.clock = self.clock_saved = int(tables.info.get("replay_tick", 0))
        self.index_rows = int(tables.info.get("index_trained_rows", 0))
        self.index_at = float(tables.info.get("index_trained_at", 0.0))
        self.has_index = False
        self.next_optimize = time.monotonic() + cfg.optimize_every_s
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
        self.has_index = any(ix.columns == ["embedding"] for ix in indices)  # status's rides along
        # a crash between the stats commit and the clock's leaves the clock behind: catch up
        ticks = [s.last_tick for s in self.stats.values() if s.last_tick is not None]
        self.clock = max(self.clock, max(ticks, default=-1) + 1)

    @property
    def accepted(self) -> set[str]:
        return {i for i, (s, _) in self.known.items() if s == "accepted"}

    # ---- producers -----------------------------------------------------------------------

    async def submit(self, payload: Payload) -> Any:
        return (await self.submit_many([payload]))[0]

    async def submit_many(self, payloads: Sequence[Payload]) -> list[Any]:
        if self._closed:
            raise MemoryClosed("the memory writer is not running")
        ops = [Op(p) for p in payloads]
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
        for op in ops:
            if op.error is not None:
                raise op.error
        return [op.result for op in ops]

    def close(self) -> None:
        """No new operations; the writer commits what is queued, then `run` returns."""
        self._closed = True
        self._send.close()

    # ---- the loop ------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._recv:
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
                    if time.monotonic() >= self.next_optimize:
                        try:
                            await self._maintain(optimize=True, index="auto")
                        except Exception as exc:  # compaction can wait for the next period
                            self.next_optimize = time.monotonic() + self.cfg.optimize_every_s
                            log.error("memory_optimize_failed", error=repr(exc))
            finally:
                self._closed = True
                self._fail_queued()
                self.finished.set()

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
        wait = max(0.0, self.next_optimize - time.monotonic())
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
            try:
                op.finish(await self._maintain(optimize=op.payload.optimize,
                                               index=op.payload.index))
            except Exception as exc:
                op.finish(error=exc)
        if "insert" in by_kind and self._index_due():
            try:
                await self._maintain(optimize=False, index="auto")
            except Exception as exc:  # searches stay exact (flat) meanwhile; retried next batch
                log.error("memory_index_failed", error=repr(exc))
        self.commits += 1

    # ---- stages --------------------------------------------------------------------------

    async def _knn(self, vectors: list[np.ndarray], limit: int, where: str | None,
                   columns: list[str]) -> pa.Table:
        """One multi-vector search; rows carry `query_index` (added when it is missing)."""
        q = (self.t.envs.query().nearest_to([v.tolist() for v in vectors]).distance_type("cosine")
             .limit(limit).select([*columns, "_distance"]).nprobes(self.cfg.index.nprobes)
             .refine_factor(refine_factor(self.cfg, limit)))
        if where:
            q = q.where(where)
        with anyio.fail_after(self.cfg.db_timeout_s):
            res = await q.to_arrow()
        if "query_index" not in res.column_names:
            res = res.append_column("query_index", pa.array([0] * res.num_rows, pa.int32()))
        return res

    async def _nearest_accepted(self, vectors: list[np.ndarray]) -> list[tuple[str, float] | None]:
        """Nearest accepted environment of each vector: (id, cosine similarity) or None.

        A `status = 'accepted'` prefilter costs a scan of the status column per query, so the
        nearest NOVELTY_PROBE rows of any status are fetched first; the best accepted one among
        them is the nearest accepted overall. Only vectors whose probe held none accepted (say,
        a crowd of rejected near-copies) get the filtered search."""
        out: list[tuple[str, float] | None] = [None] * len(vectors)
        if not vectors or not any(s == "accepted" for s, _ in self.known.values()):
            return out

        def take(res: pa.Table, index_map: list[int]) -> None:
            for qi, nid, status, dist in zip(res["query_index"].to_pylist(), res["id"].to_pylist(),
                                             res["status"].to_pylist(),
                                             res["_distance"].to_pylist(), strict=True):
                i, sim = index_map[qi], 1.0 - float(dist)
                if status == "accepted" and (out[i] is None or sim > out[i][1]):
                    out[i] = (nid, sim)

        take(await self._knn(vectors, NOVELTY_PROBE, None, ["id", "status"]),
             list(range(len(vectors))))
        missing = [i for i, o in enumerate(out) if o is None]
        if missing:
            take(await self._knn([vectors[i] for i in missing], 1, "status = 'accepted'",
                                 ["id", "status"]), missing)
        return out

    async def _inserts(self, ops: list[Op], dirty: dict[str, EnvStats]) -> None:
        ids = [env_id(op.payload.env.code) for op in ops]
        fresh = [j for j, i in enumerate(ids) if i not in self.known]
        to_check = [j for j in fresh if ops[j].payload.env.check_novelty
                    and ops[j].payload.env.rejected_reason is None]
        nearest = dict(zip(to_check, await self._nearest_accepted(
            [ops[j].payload.vector for j in to_check]), strict=True))
        threshold = self.cfg.novelty_threshold
        batch_ids: dict[str, InsertResult] = {}
        batch_vecs: list[np.ndarray] = []
        batch_acc: list[str] = []
        rows: list[tuple[InsertPayload, InsertResult]] = []
        results: list[InsertResult] = []
        now = now_utc()
        for j, (op, eid) in enumerate(zip(ops, ids, strict=True)):
            env: NewEnv = op.payload.env
            if eid in self.known:
                status, reason = self.known[eid]
                results.append(InsertResult(eid, status, reason, existed=True))
                continue
            if eid in batch_ids:
                results.append(replace(batch_ids[eid], existed=True))
                continue
            best = nearest.get(j)
            if env.rejected_reason is not None:
                res = InsertResult(eid, "rejected", env.rejected_reason)
            elif not env.check_novelty:
                res = InsertResult(eid, "accepted")
            else:
                if batch_vecs:  # accepted earlier in this very batch, not in the table yet
                    sims = np.stack(batch_vecs) @ op.payload.vector
                    k = int(np.argmax(sims))
                    if best is None or sims[k] > best[1]:
                        best = (batch_acc[k], float(sims[k]))
                if best is not None and best[1] >= threshold:
                    res = InsertResult(eid, "rejected", f"duplicate: nearest accepted environment "
                                       f"{best[0]} at cosine {best[1]:.3f} >= {threshold}",
                                       neighbour_id=best[0], similarity=best[1])
                elif best is not None:
                    res = InsertResult(eid, "accepted", neighbour_id=best[0], similarity=best[1])
                else:
                    res = InsertResult(eid, "accepted")
            if res.status == "accepted":
                batch_vecs.append(op.payload.vector)
                batch_acc.append(eid)
            batch_ids[eid] = res
            results.append(res)
            rows.append((op.payload, res))
        if rows:
            with anyio.fail_after(self.cfg.db_timeout_s):
                await self.t.envs.add(self._rows_table(rows, now))
            for _, res in rows:
                self.known[res.id] = (res.status, res.reason)
        for op, res in zip(ops, results, strict=True):
            op.finish(res)
        if rows:
            log.debug("memory_inserted", rows=len(rows),
                      accepted=sum(r.status == "accepted" for _, r in rows))

    def _rows_table(self, rows: list[tuple[InsertPayload, InsertResult]], now: Any) -> pa.Table:
        """Columnar, so a batch of thousands of 384-d rows does not go through Python lists."""
        envs = [p.env for p, _ in rows]
        vecs = np.stack([p.vector for p, _ in rows]).astype(np.float32, copy=False)
        cols = {
            "id": [r.id for _, r in rows], "name": [e.name for e in envs],
            "description": [e.description for e in envs], "code": [e.code for e in envs],
            "source_doc_id": [e.source_doc_id for e in envs],
            "source_excerpt": [e.source_excerpt for e in envs],
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), self.dim),
            "created_at": [now] * len(rows), "policy_version": [e.policy_version for e in envs],
            "status": [r.status for _, r in rows], "reason": [r.reason for _, r in rows],
            "tags": [list(e.tags) for e in envs],
        }
        return pa.table(cols, schema=envs_schema(self.dim))

    async def _records(self, ops: list[Op], dirty: dict[str, EnvStats]) -> None:
        now = now_utc()
        for op in ops:
            rec: RecordPayload = op.payload
            if rec.env_id not in self.known:
                op.finish(error=KeyError(f"unknown environment {rec.env_id}"))
                continue
            vid = rec.variant_id
            # set before the commit; harmless if it fails: the same variant maps the same way
            self.family[vid] = (rec.env_id, rec.params)
            prev = dirty.get(vid) or self.stats.get(vid) or EnvStats(id=vid)
            new = update_stats(prev, rec.episodes, alpha=self.cfg.ema_alpha, now=now)
            if new.last_tick is None and rec.episodes.scored:  # first play: a replay visit
                new = replace(new, last_tick=self.clock)
                self.clock += 1
            dirty[vid] = new
            op.result = new  # finished once the stats commit

    async def _samples(self, ops: list[Op], dirty: dict[str, EnvStats]) -> None:
        accepted = self.accepted
        family = {vid: env for vid, (env, _) in self.family.items()}
        for op in ops:
            u, min_pool = op.payload.u, op.payload.min_seen
            merged = {**self.stats, **dirty}
            pool = replay_pool(merged, accepted, family)
            # min_seen counts environments (ReplayConfig), however many variants each has
            if not pool or len({family.get(v.id, v.id) for v in pool}) < min_pool:
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

    def _index_due(self) -> bool:
        rows, icfg = len(self.known), self.cfg.index
        if not self.has_index:
            return rows >= icfg.min_rows
        grown = rows >= icfg.rebuild_growth * max(1, self.index_rows)
        stale = time.time() - self.index_at >= icfg.rebuild_interval_s and rows > self.index_rows
        return grown or stale

    async def _maintain(self, *, optimize: bool, index: str) -> dict[str, Any]:
        """index: "auto" (train when due), "force" (train now), "skip"."""
        report: dict[str, Any] = {}
        if index == "force" or (index == "auto" and self._index_due()):
            report["index"] = await self._train_index()
        if optimize:
            t0 = time.perf_counter()
            keep = timedelta(seconds=self.cfg.keep_versions_s)
            for name, table in (("envs", self.t.envs), ("stats", self.t.stats),
                                ("meta", self.t.meta)):
                with anyio.fail_after(self.cfg.db_timeout_s):
                    await table.optimize(cleanup_older_than=keep)
                report.setdefault("optimized", []).append(name)
            report["optimize_s"] = round(time.perf_counter() - t0, 3)
            self.next_optimize = time.monotonic() + self.cfg.optimize_every_s
            log.info("memory_optimized", **report)
        return report

    async def _train_index(self) -> dict[str, Any]:
        rows = len(self.known)
        icfg = self.cfg.index
        sub = icfg.num_sub_vectors or (self.dim // 8 if self.dim % 8 == 0 else 1)
        # sqrt(rows) partitions, the usual IVF heuristic (what LanceDB documents as its default)
        partitions = icfg.num_partitions or max(1, round(math.sqrt(rows)))
        config = IvfPq(distance_type="cosine", num_sub_vectors=sub, num_partitions=partitions)
        t0 = time.perf_counter()
        with anyio.fail_after(icfg.build_timeout_s):
            await self.t.envs.create_index("embedding", config=config, replace=True)
            # the status filter of searches and novelty checks: a bitmap, kept current by
            # optimize() like the vector index
            await self.t.envs.create_index("status", config=Bitmap(), replace=True)
        seconds = time.perf_counter() - t0
        self.has_index, self.index_rows, self.index_at = True, rows, time.time()
        with anyio.fail_after(self.cfg.db_timeout_s):
            await write_meta(self.t.meta, {"index_trained_rows": rows,
                                           "index_trained_at": self.index_at,
                                           "index_type": "IVF_PQ", "index_sub_vectors": sub,
                                           "index_partitions": partitions})
        log.info("memory_index_trained", rows=rows, seconds=round(seconds, 2), sub_vectors=sub,
                 partitions=partitions)
        return {"rows": rows, "seconds": round(seconds, 3), "type": "IVF_PQ", "sub_vectors": sub,
                "partitions": partitions}
