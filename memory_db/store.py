"""`EnvMemory`: the environment memory's API. Reads run on any process (the CLI reads while the
daemon writes); writes go through the one `Writer` task of the process that opened it writable.

    async with open_memory(cfg, uri) as mem:                # writable: runs the writer
        res = await mem.insert(NewEnv(code, name, description))
        hits = await mem.search("grid navigation", k=5)     # MMR over the top fetch_k hits
        await mem.record_episodes(res.id, hinted=[1, 1], unhinted=[0, 1], params={"n": 5})
        vid = await mem.next_replay(rng)                    # PLR, or None: design a new one
        v = await mem.variant(vid)                          # its environment and params

Statistics live per variant (an environment at given params, `variant_id`); environments
(`get`, `list`, `search`) carry the aggregate over their variants, and `variants(env_id)` lists
them one by one. Novelty and MMR work on environments; replay draws variants.

Every await on the database has a deadline (`db_timeout_s`; writes `write_timeout_s`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, Literal

import anyio
import lancedb
import numpy as np
import pyarrow as pa
from anyio.abc import TaskStatus

from memory_db.config import MemoryConfig
from memory_db.embed import Embedder, aembed, env_text, make_embedder
from memory_db.mmr import mmr
from memory_db.records import (
    STATUSES,
    EnvRecord,
    EnvStats,
    Episodes,
    Hit,
    InsertResult,
    NewEnv,
    Summary,
    VariantStats,
    aggregate_stats,
)
from memory_db.replay import pool_distribution, replay_pool
from memory_db.schema import Tables, canonical_params, open_tables, read_meta, sql_str, variant_id
from memory_db.writer import (
    InsertPayload,
    MaintainPayload,
    MemoryClosed,
    RecordPayload,
    SamplePayload,
    Writer,
    refine_factor,
    variant_from_row,
)

RECORD_COLUMNS = ["id", "name", "description", "status", "reason", "source_doc_id",
                  "source_excerpt", "created_at", "policy_version", "tags"]
Sort = Literal["regret", "created", "played"]
LEAK_FLAG = 0.5  # `summary` counts environments whose hint_leak is at least this as flagged


def _where(status: str | None = None, tags: Sequence[str] = (),
           source_doc_id: str | None = None) -> str | None:
    parts = []
    if status is not None:
        if status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
        parts.append(f"status = {sql_str(status)}")
    if tags:
        parts.append(f"array_has_any(tags, [{', '.join(sql_str(t) for t in tags)}])")
    if source_doc_id is not None:
        parts.append(f"source_doc_id = {sql_str(source_doc_id)}")
    return " AND ".join(parts) or None


def _record(row: dict[str, Any], stats: EnvStats | None, code: bool = False) -> EnvRecord:
    return EnvRecord(
        id=row["id"], name=row["name"], description=row["description"], status=row["status"],
        reason=row["reason"] or "", source_doc_id=row["source_doc_id"] or "",
        source_excerpt=row["source_excerpt"] or "", created_at=row["created_at"],
        policy_version=row["policy_version"], tags=tuple(row["tags"] or ()),
        stats=stats or EnvStats(id=row["id"]), code=row.get("code") if code else None,
    )


def _distribution(values: list[float], bins: int = 10) -> dict[str, Any]:
    """n, mean, quantiles and a histogram over [0, 1] (scores and regrets live there)."""
    if not values:
        return {"n": 0}
    a = np.asarray(values, dtype=np.float64)
    hist, _ = np.histogram(np.clip(a, 0, 1), bins=bins, range=(0.0, 1.0))
    q = np.quantile(a, [0.1, 0.5, 0.9])
    return {"n": len(a), "mean": round(float(a.mean()), 4), "min": round(float(a.min()), 4),
            "p10": round(float(q[0]), 4), "p50": round(float(q[1]), 4),
            "p90": round(float(q[2]), 4), "max": round(float(a.max()), 4),
            "histogram": {"bins": bins, "counts": hist.tolist()}}


class EnvMemory:
    def __init__(self, cfg: MemoryConfig, uri: str, *, writable: bool = False,
                 embedder: Embedder | None = None) -> None:
        if not uri:
            raise ValueError("the memory needs a resolved URI (the caller picks the default)")
        self.cfg, self.uri, self.writable = cfg, uri, writable
        self.embedder = embedder or make_embedder(cfg.embedding_model, cfg.embed_batch_size)
        if self.embedder.name != cfg.embedding_model:
            raise ValueError(f"embedder {self.embedder.name} does not match the configured "
                             f"model {cfg.embedding_model}")
        self._t: Tables | None = None
        self._writer: Writer | None = None

    # ---- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        with anyio.fail_after(self.cfg.db_timeout_s):
            db = await lancedb.connect_async(
                self.uri, storage_options=dict(self.cfg.storage_options) or None,
                read_consistency_interval=timedelta(seconds=self.cfg.read_consistency_s))
        self._t = await open_tables(db, self.uri, model=self.embedder.name,
                                    dim=self.embedder.dim, writable=self.writable,
                                    timeout_s=self.cfg.db_timeout_s)
        if self.writable:
            self._writer = Writer(self.cfg, self._t, self.embedder.dim)
            await self._writer.load()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The writer service: returns once `close()` was called and the queue is committed."""
        if self._writer is None:
            raise MemoryClosed("opened read-only: there is no writer to run")
        await self._writer.run(task_status=task_status)

    async def close(self, timeout_s: float | None = None) -> None:
        """Stop taking writes and wait (shielded, bounded) for the queued ones to commit."""
        if self._writer is None:
            return
        self._writer.close()
        with anyio.move_on_after(timeout_s or self.cfg.db_timeout_s, shield=True):
            await self._writer.finished.wait()

    @property
    def tables(self) -> Tables:
        if self._t is None:
            raise MemoryClosed("the memory is not open")
        return self._t

    def _w(self) -> Writer:
        if self._writer is None:
            raise MemoryClosed(f"{self.uri} is open read-only")
        return self._writer

    # ---- writes (through the writer) ------------------------------------------------------

    async def insert(self, env: NewEnv) -> InsertResult:
        return (await self.insert_many([env]))[0]

    async def insert_many(self, envs: Sequence[NewEnv]) -> list[InsertResult]:
        """Embed (batched, in a worker thread), then insert through the writer's novelty filter.
        Results are in input order; each is committed when this returns."""
        writer = self._w()
        vectors = await aembed(self.embedder, [env_text(e.name, e.description, e.code)
                                               for e in envs])
        return await writer.submit_many(
            [InsertPayload(e, v) for e, v in zip(envs, vectors, strict=True)])

    async def record_episodes(self, env_id: str, *, hinted: Iterable[float] = (),
                              unhinted: Iterable[float] = (),
                              params: dict[str, Any] | None = None,
                              hint_copies: Iterable[float] = (),
                              sandbox_failures: int = 0) -> EnvStats:
        """One evaluation's episode scores of environment `env_id` played at `params`: updates
        that variant's counts, means, regret EMA, learnability (creating its row on first play)
        and returns its stats (`id` is the variant id). No params: the default variant, whose id
        is the environment's. Pass resolved params (every knob, defaults filled), or the same
        variant ends up under two ids. `hint_copies` (none, or one per hinted episode): how far
        each hinted episode won by copying the hint; their running mean is `hint_leak`.
        `sandbox_failures`: episodes of this play that failed on the environment's own code
        (counted, never scores; a play may consist of nothing else)."""
        episodes = Episodes(tuple(float(x) for x in hinted), tuple(float(x) for x in unhinted),
                            tuple(float(x) for x in hint_copies), int(sandbox_failures))
        canon = canonical_params(params)  # a value that is not JSON fails here, in the caller
        return await self._w().submit(
            RecordPayload(env_id, canon, variant_id(env_id, params), episodes))

    async def sample_replay(self, rng: random.Random) -> tuple[str, float] | None:
        """Draw one played variant by P_replay and mark it visited: (variant id, its
        probability); `variant()` has its environment and params. None when nothing has been
        played yet."""
        return await self._w().submit(SamplePayload(rng.random()))

    async def next_replay(self, rng: random.Random) -> str | None:
        """PLR's decision: with probability `replay_prob` (once `min_seen` environments were
        played) the id of a variant to replay; otherwise None, meaning design a new one."""
        if rng.random() >= self.cfg.replay.replay_prob:
            return None
        drawn = await self._w().submit(SamplePayload(rng.random(), self.cfg.replay.min_seen))
        return None if drawn is None else drawn[0]

    async def maintain(self, *, optimize: bool = True,
                       index: Literal["auto", "force", "skip"] = "auto") -> dict[str, Any]:
        """Run maintenance now, in the writer (between batches)."""
        return await self._w().submit(MaintainPayload(optimize, index))

    # ---- reads ---------------------------------------------------------------------------

    async def count(self, status: str | None = None) -> int:
        with anyio.fail_after(self.cfg.db_timeout_s):
            return await self.tables.envs.count_rows(_where(status))

    async def _variant_rows(self, env_ids: Sequence[str] | None = None,
                            where: str | None = None) -> list[VariantStats]:
        """Variants of `env_ids` (all when None), or those matching `where`."""
        q = self.tables.stats.query()
        if env_ids is not None:
            if not env_ids:
                return []
            where = f"env_id IN ({', '.join(sql_str(i) for i in env_ids)})"
        if where:
            q = q.where(where)
        with anyio.fail_after(self.cfg.db_timeout_s):
            rows = (await q.to_arrow()).to_pylist()
        return [variant_from_row(r) for r in rows]

    async def _stats_for(self, ids: Sequence[str] | None = None) -> dict[str, EnvStats]:
        """Each environment's statistics aggregated over its variants (`aggregate_stats`)."""
        by_env: dict[str, list[EnvStats]] = {}
        for v in await self._variant_rows(ids):
            by_env.setdefault(v.env_id, []).append(v.stats)
        for group in by_env.values():
            group.sort(key=lambda st: st.id)  # the aggregate must not depend on scan order
        return {env: aggregate_stats(env, group) for env, group in by_env.items()}

    async def variants(self, env_id: str) -> list[VariantStats]:
        """The variants of environment `env_id` with their own statistics, most played first
        (episodes, then most recently played, then id). [] when it was never played (or is
        unknown): the edit move then starts from the defaults."""
        found = sorted(await self._variant_rows([env_id]), key=lambda v: v.id)
        found.sort(key=lambda v: (v.episodes, v.stats.last_played.timestamp()
                                  if v.stats.last_played else float("-inf")), reverse=True)
        return found

    async def variant(self, variant_id: str) -> VariantStats:
        """One variant by its id (as `sample_replay` returns it). KeyError when unknown."""
        found = await self._variant_rows(where=f"id = {sql_str(variant_id)}")
        if not found:
            raise KeyError(f"no variant with id {variant_id}")
        return found[0]

    async def get(self, id_or_prefix: str, *, code: bool = False) -> EnvRecord:
        """By id or unique id prefix (as `list` prints them), or a variant id (as replay and
        `stats` print them: its environment). KeyError when none or ambiguous.
        Its stats are aggregated over its variants (`records.aggregate_stats`: episodes summed,
        means weighted by episodes); `variants()` has each one's."""
        key, _, variant = id_or_prefix.strip().lower().partition(".")
        if not key or any(c not in "0123456789abcdef" for c in key + variant):
            raise KeyError(f"{id_or_prefix!r} is not an environment id (hex)")
        cols = [*RECORD_COLUMNS, "code"] if code else RECORD_COLUMNS
        with anyio.fail_after(self.cfg.db_timeout_s):
            rows = (await self.tables.envs.query().where(f"id LIKE {sql_str(key + '%')}")
                    .select(cols).limit(2).to_arrow()).to_pylist()
        if not rows:
            raise KeyError(f"no environment with id {id_or_prefix}")
        if len(rows) > 1:
            raise KeyError(f"id prefix {id_or_prefix} is ambiguous ({rows[0]['id']}, "
                           f"{rows[1]['id']}, ...)")
        stats = await self._stats_for([rows[0]["id"]])
        return _record(rows[0], stats.get(rows[0]["id"]), code=code)

    async def nearest(self, vector: np.ndarray, *, k: int, diverse: bool = True,
                      lam: float | None = None, fetch_k: int | None = None,
                      where: str | None = None,
                      columns: Sequence[str] = ("id",)) -> list[tuple[dict[str, Any], float]]:
        """Vector search (ANN when indexed, flat otherwise), re-ranked by MMR when `diverse`:
        rows of `columns` with their cosine similarity, best first (in MMR order)."""
        lam = self.cfg.mmr_lambda if lam is None else lam
        limit = max(k, fetch_k or self.cfg.fetch_k) if diverse else k
        cols = list(dict.fromkeys([*columns, "embedding", "_distance"] if diverse
                                  else [*columns, "_distance"]))
        q = (self.tables.envs.vector_search(np.asarray(vector, dtype=np.float32))
             .distance_type("cosine").limit(limit).nprobes(self.cfg.index.nprobes)
             .refine_factor(refine_factor(self.cfg, limit)).select(cols))
        if where:
            q = q.where(where)
        with anyio.fail_after(self.cfg.db_timeout_s):
            res = await q.to_arrow()
        if res.num_rows == 0:
            return []
        sims = 1.0 - res["_distance"].to_numpy().astype(np.float64)
        if diverse:
            emb = res["embedding"].combine_chunks()
            vecs = emb.values.to_numpy().reshape(len(emb), -1)
            order = mmr(sims, vecs, k, lam)
        else:
            order = list(range(min(k, res.num_rows)))
        keep = res.select(list(columns)).take(pa.array(order, type=pa.int64())).to_pylist()
        return [(row, float(sims[i])) for row, i in zip(keep, order, strict=True)]

    async def search(self, query: str | np.ndarray, *, k: int = 10, diverse: bool = True,
                     lam: float | None = None, fetch_k: int | None = None,
                     status: str | None = "accepted", tags: Sequence[str] = (),
                     source_doc_id: str | None = None, code: bool = False) -> list[Hit]:
        """Environments like `query` (text, or a vector), diversified by MMR unless told not."""
        vec = (await aembed(self.embedder, [query]))[0] if isinstance(query, str) else query
        cols = [*RECORD_COLUMNS, "code"] if code else RECORD_COLUMNS
        found = await self.nearest(vec, k=k, diverse=diverse, lam=lam, fetch_k=fetch_k,
                                   where=_where(status, tags, source_doc_id), columns=cols)
        stats = await self._stats_for([row["id"] for row, _ in found])
        return [Hit(_record(row, stats.get(row["id"]), code=code), sim, rank)
                for rank, (row, sim) in enumerate(found, 1)]

    async def list(self, *, sort: Sort = "created", status: str | None = None,
                   tags: Sequence[str] = (), limit: int | None = 20) -> list[EnvRecord]:
        """Newest first (created), highest regret EMA first (regret), most recently played
        first (played: only played ones)."""
        if sort not in ("regret", "created", "played"):
            raise ValueError(f"sort must be regret, created or played, not {sort!r}")
        q = self.tables.envs.query().select(RECORD_COLUMNS)
        where = _where(status, tags)
        if where:
            q = q.where(where)
        with anyio.fail_after(self.cfg.db_timeout_s):
            rows = (await q.to_arrow()).to_pylist()
        stats = await self._stats_for()
        records = [_record(r, stats.get(r["id"])) for r in rows]
        if sort == "created":
            records.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        elif sort == "regret":
            records.sort(key=lambda r: (r.stats.regret_ema is not None,
                                        r.stats.regret_ema or 0.0, r.created_at), reverse=True)
        else:
            records = [r for r in records if r.stats.last_played is not None]
            records.sort(key=lambda r: r.stats.last_played, reverse=True)
        return records if limit is None else records[:limit]

    async def replay_probabilities(self) -> dict[str, float]:
        """P_replay of every variant in the replay pool (by variant id), from the committed
        state."""
        with anyio.fail_after(self.cfg.db_timeout_s):
            acc = await self.tables.envs.query().where("status = 'accepted'").select(
                ["id"]).to_arrow()
            clock = int((await read_meta(self.tables.meta)).get("replay_tick", 0))
        variants = await self._variant_rows()
        pool = replay_pool({v.id: v.stats for v in variants}, set(acc["id"].to_pylist()),
                           {v.id: v.env_id for v in variants})
        if not pool:
            return {}
        ticks = [s.last_tick for s in pool if s.last_tick is not None]
        clock = max(clock, max(ticks, default=-1) + 1)
        p = pool_distribution(pool, clock, self.cfg.replay)
        return {s.id: float(x) for s, x in zip(pool, p, strict=True)}

    async def export(self, *, code: bool = True,
                     embeddings: bool = False) -> AsyncIterator[dict[str, Any]]:
        """Every environment (accepted and rejected) with its stats (aggregated) and its
        variants (most played first), oldest first."""
        stats = await self._stats_for()
        variants: dict[str, list[VariantStats]] = {}
        for v in sorted(await self._variant_rows(), key=lambda v: (-v.episodes, v.id)):
            variants.setdefault(v.env_id, []).append(v)
        cols = RECORD_COLUMNS + (["code"] if code else []) + (["embedding"] if embeddings else [])
        with anyio.fail_after(self.cfg.db_timeout_s):
            rows = (await self.tables.envs.query().select(cols).to_arrow()).to_pylist()
        rows.sort(key=lambda r: (r["created_at"], r["id"]))
        for r in rows:
            d = _record(r, stats.get(r["id"]), code=code).as_dict()
            d["variants"] = [v.as_dict() for v in variants.get(r["id"], [])]
            if embeddings:
                d["embedding"] = [round(float(x), 6) for x in r["embedding"]]
            yield d

    async def summary(self) -> Summary:
        """Counts by status and rejection reason, the number of variants, regret and solve-rate
        distributions of the played environments (aggregated over variants), diversity (mean
        pairwise cosine distance of accepted envs), the replay distribution's shape (over
        variants), and storage health (fragments, index coverage)."""
        t, s = self.tables, Summary()
        with anyio.fail_after(self.cfg.db_timeout_s):
            meta = (await t.envs.query().select(["id", "status", "reason"]).to_arrow()).to_pylist()
        s.counts = dict(Counter(r["status"] for r in meta))
        s.counts["total"] = len(meta)
        s.reasons = dict(Counter((r["reason"] or "").split(":", 1)[0] or "?" for r in meta
                                 if r["status"] == "rejected").most_common())
        accepted = {r["id"] for r in meta if r["status"] == "accepted"}
        with anyio.fail_after(self.cfg.db_timeout_s):
            s.variants = await t.stats.count_rows()
        stats = [x for i, x in (await self._stats_for()).items() if i in accepted]
        played = [x for x in stats if x.episodes_unhinted or x.episodes_hinted]
        s.played = len(played)
        s.regret = _distribution([x.regret_ema for x in played if x.regret_ema is not None])
        s.solve_rate = {
            "unhinted": _distribution([x.mean_unhinted for x in played
                                       if x.mean_unhinted is not None]),
            "hinted": _distribution([x.mean_hinted for x in played if x.mean_hinted is not None]),
        }
        leaks = [x.hint_leak for x in played if x.hint_leak is not None]
        s.hint_leak = {"n": len(leaks), "threshold": LEAK_FLAG,
                       "flagged": sum(v >= LEAK_FLAG for v in leaks),
                       "distribution": _distribution(leaks)}
        failing = [x for x in stats if x.sandbox_failures]
        s.sandbox_failing = {"envs": len(failing), "never_scored": sum(
            not (x.episodes_unhinted or x.episodes_hinted) for x in failing)}
        s.diversity = await self._diversity(len(accepted))
        probs = await self.replay_probabilities()
        if probs:
            p = np.array(sorted(probs.values(), reverse=True))
            s.replay = {"pool": len(p), "score": self.cfg.replay.score,
                        "effective_pool": round(float(1.0 / np.square(p).sum()), 2),
                        "top": [{"id": i, "p": round(v, 4)} for i, v in
                                sorted(probs.items(), key=lambda kv: -kv[1])[:5]]}
        with anyio.fail_after(self.cfg.db_timeout_s):
            ts = await t.envs.stats()
            indices = list(await t.envs.list_indices())
            s.storage = {"uri": self.uri, "version": await t.envs.version(),
                         "fragments": ts["fragment_stats"]["num_fragments"],
                         "small_fragments": ts["fragment_stats"]["num_small_fragments"],
                         "bytes": ts["total_bytes"], "index": None}
            for ix in indices:
                if ix.columns == ["embedding"]:
                    st = await t.envs.index_stats(ix.name)
                    s.storage["index"] = {"name": ix.name, "type": str(ix.index_type),
                                          "distance": st.distance_type if st else None,
                                          "indexed_rows": st.num_indexed_rows if st else None,
                                          "unindexed_rows": st.num_unindexed_rows if st else None}
        return s

    async def _diversity(self, n_accepted: int) -> dict[str, Any]:
        """Mean pairwise cosine distance over all accepted environments, exactly and in O(n d):
        for unit vectors, sum_{i != j} v_i . v_j = |sum_i v_i|^2 - n."""
        if n_accepted < 2:
            return {"n": n_accepted, "mean_pairwise_cosine_distance": None}
        total = np.zeros(self.embedder.dim, dtype=np.float64)
        n = 0
        q = self.tables.envs.query().where("status = 'accepted'").select(["embedding"])
        with anyio.fail_after(self.cfg.db_timeout_s * 4):
            async for batch in await q.to_batches():
                col = batch.column("embedding")
                vecs = col.values.to_numpy(zero_copy_only=False).reshape(len(col), -1)
                total += vecs.astype(np.float64).sum(axis=0)
                n += len(col)
        mean_sim = (float(total @ total) - n) / (n * (n - 1))
        return {"n": n, "mean_pairwise_cosine_distance": round(1.0 - mean_sim, 4)}


@asynccontextmanager
async def open_memory(cfg: MemoryConfig, uri: str, *, writable: bool = True,
                      embedder: Embedder | None = None) -> AsyncIterator[EnvMemory]:
    """Open the memory; when writable, run its writer for the duration of the block and commit
    what is queued on the way out."""
    mem = EnvMemory(cfg, uri, writable=writable, embedder=embedder)
    await mem.open()
    if not writable:
        yield mem
        return
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(mem.run)
            try:
                yield mem
            finally:
                await mem.close()
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The task group wraps the caller's own exception; hand a lone one back unwrapped so
        # `except KeyError:` around the block still works.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
