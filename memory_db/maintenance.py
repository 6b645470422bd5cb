"""The memory's upkeep: `optimize()` every `optimize_every_s` (compaction, pruning of old
versions, folding new rows into the ANN index) and ANN index (re)training when the table grew
enough, or long enough ago.

`envs` only ever gets appends from the writer, which commit beside a compaction, so its upkeep
(minutes on a large table) runs beside the writes. `env_stats` and `meta` take an upsert every
batch, and a compaction committed beside an upsert of the same fragments loses the race ("Rewrite
preempted by concurrent Update": measured, every time under a steady load, so their old
versions were never pruned); they are small, and the writer compacts them between two batches
(`IN_LINE`)."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import structlog
from lancedb.index import Bitmap, IvfPq

from memory_db.config import MemoryConfig
from memory_db.schema import Tables, write_meta

log = structlog.get_logger(component="memory")


BESIDE = ("envs",)
IN_LINE = ("stats", "meta")
ALL = BESIDE + IN_LINE


class Maintenance:
    """When upkeep is due and how it runs; `rows` is the writer's count of `envs` rows."""

    def __init__(self, cfg: MemoryConfig, tables: Tables, dim: int) -> None:
        self.cfg, self.t, self.dim = cfg, tables, dim
        self.index_rows = int(tables.info.get("index_trained_rows", 0))
        self.index_at = float(tables.info.get("index_trained_at", 0.0))
        self.has_index = False  # the writer's load() finds out
        self.next_optimize = time.monotonic() + cfg.optimize_every_s

    def postpone(self) -> None:
        """The next optimize() one period from now (after this one failed)."""
        self.next_optimize = time.monotonic() + self.cfg.optimize_every_s

    def index_due(self, rows: int) -> bool:
        icfg = self.cfg.index
        if not self.has_index:
            return rows >= icfg.min_rows
        grown = rows >= icfg.rebuild_growth * max(1, self.index_rows)
        stale = time.time() - self.index_at >= icfg.rebuild_interval_s and rows > self.index_rows
        return grown or stale

    async def run(self, rows: int, *, optimize: bool, index: str,
                  tables: tuple[str, ...] = ALL) -> dict[str, Any]:
        """index: "auto" (train when due), "force" (train now), "skip"; optimize `tables`."""
        report: dict[str, Any] = {}
        if index == "force" or (index == "auto" and self.index_due(rows)):
            report["index"] = await self._train_index(rows)
        if optimize:
            t0 = time.perf_counter()
            if "envs" in tables:
                report["rejected_code_dropped"] = await self._drop_rejected_code()
            report.update(await self.optimize(tables))
            report["optimize_s"] = round(time.perf_counter() - t0, 3)
            self.postpone()
            log.info("memory_optimized", **report)
        return report

    async def optimize(self, tables: tuple[str, ...]) -> dict[str, Any]:
        """Compact `tables`, prune their versions older than `keep_versions_s` and fold new rows
        into their indexes: what was optimized and the files it removed."""
        keep = timedelta(seconds=self.cfg.keep_versions_s)
        by_name = {"envs": self.t.envs, "stats": self.t.stats, "meta": self.t.meta}
        report: dict[str, Any] = {"optimized": [], "versions_removed": 0, "bytes_removed": 0}
        for name in tables:
            with anyio.fail_after(self.cfg.db_timeout_s):
                stats = await by_name[name].optimize(cleanup_older_than=keep)
            report["optimized"].append(name)
            prune = getattr(stats, "prune", None)
            report["versions_removed"] += int(getattr(prune, "old_versions_removed", 0) or 0)
            report["bytes_removed"] += int(getattr(prune, "bytes_removed", 0) or 0)
        return report

    async def _drop_rejected_code(self) -> int:
        """Blank the code of rejected designs older than `rejected_code_keep_days`: over a
        week most rows are rejected designs, and their code is what makes them big."""
        days = self.cfg.rejected_code_keep_days
        if not days:
            return 0
        cut = (datetime.now(UTC) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S.%f")
        with anyio.fail_after(self.cfg.db_timeout_s):
            result = await self.t.envs.update(
                updates={"code": ""},
                where=f"status = 'rejected' AND created_at < TIMESTAMP '{cut}' AND code <> ''")
        return int(getattr(result, "rows_updated", 0) or 0)

    async def _train_index(self, rows: int) -> dict[str, Any]:
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
