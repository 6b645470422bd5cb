"""The memory's reads, which any process may run on the committed tables (the CLI reads while
the daemon writes): counts, lookups by id, vector search with MMR, listings, the replay
distribution, export and the summary. `EnvMemory` adds opening and the writes.

Statistics live per variant (an environment at given params, `variant_id`); environments
(`get`, `list`, `search`) carry the aggregate over their variants, and `variants(env_id)` lists
them one by one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import anyio
import numpy as np
import pyarrow as pa

from memory_db.config import MemoryConfig
from memory_db.embed import Embedder, aembed
from memory_db.mmr import mmr
from memory_db.ops import MemoryClosed
from memory_db.records import (
    STATUSES,
    EnvRecord,
    EnvStats,
    Hit,
    Summary,
    VariantStats,
)
from memory_db.replay import pool_distribution, replay_pool
from memory_db.rows import RECORD_COLUMNS, record_from_row, variant_from_row
from memory_db.schema import Tables, read_meta, sql_str
from memory_db.stats import aggregate_stats
from memory_db.summary import summarize

Sort = Literal["regret", "created", "played"]


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


class MemoryReads:
    """Queries over the tables the subclass (`EnvMemory`) opened; every await has a deadline
    (`db_timeout_s`)."""

    cfg: MemoryConfig
    uri: str
    embedder: Embedder
    _t: Tables | None

    @property
    def tables(self) -> Tables:
        if self._t is None:
            raise MemoryClosed("the memory is not open")
        return self._t

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
        return record_from_row(rows[0], stats.get(rows[0]["id"]), code=code)

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
             .refine_factor(self.cfg.index.refine_factor(limit)).select(cols))
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
        return [Hit(record_from_row(row, stats.get(row["id"]), code=code), sim, rank)
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
        records = [record_from_row(r, stats.get(r["id"])) for r in rows]
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

    async def export(self, *, code: bool = True, embeddings: bool = False,
                     status: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """Every environment (accepted and rejected, or those of `status`, filtered in the
        table scan) with its stats (aggregated) and its variants (most played first), oldest
        first."""
        if status is not None and status not in ("accepted", "rejected"):
            raise ValueError(f"status {status!r}: accepted or rejected")
        stats = await self._stats_for()
        variants: dict[str, list[VariantStats]] = {}
        for v in sorted(await self._variant_rows(), key=lambda v: (-v.episodes, v.id)):
            variants.setdefault(v.env_id, []).append(v)
        cols = RECORD_COLUMNS + (["code"] if code else []) + (["embedding"] if embeddings else [])
        with anyio.fail_after(self.cfg.db_timeout_s):
            query = self.tables.envs.query()
            if status is not None:
                query = query.where(f"status = '{status}'")
            rows = (await query.select(cols).to_arrow()).to_pylist()
        rows.sort(key=lambda r: (r["created_at"], r["id"]))
        for r in rows:
            d = record_from_row(r, stats.get(r["id"]), code=code).as_dict()
            d["variants"] = [v.as_dict() for v in variants.get(r["id"], [])]
            if embeddings:
                d["embedding"] = [round(float(x), 6) for x in r["embedding"]]
            yield d

    async def summary(self) -> Summary:
        """Counts by status and rejection reason, the number of variants, regret and solve-rate
        distributions of the played environments (aggregated over variants), diversity (mean
        pairwise cosine distance of accepted envs), the replay distribution's shape (over
        variants), and storage health (fragments, index coverage)."""
        return await summarize(self.tables, self.cfg, self.uri, self.embedder.dim,
                               await self._stats_for(), await self.replay_probabilities())
