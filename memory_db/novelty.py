"""The novelty filter: a new environment whose nearest accepted one (in the table, or earlier in
its own batch) is at least `novelty_threshold` cosine-similar is rejected as a duplicate.
It only reads and decides; the writer stores what it decided."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import numpy as np
import pyarrow as pa

from memory_db.config import MemoryConfig
from memory_db.records import InsertResult, NewEnv

if TYPE_CHECKING:  # annotations only
    from lancedb.table import AsyncTable

NOVELTY_PROBE = 8  # nearest rows of any status looked at before a status-filtered search


async def knn(envs: AsyncTable, cfg: MemoryConfig, vectors: list[np.ndarray], limit: int,
              where: str | None, columns: list[str]) -> pa.Table:
    """One multi-vector search; rows carry `query_index` (added when it is missing)."""
    q = (envs.query().nearest_to([v.tolist() for v in vectors]).distance_type("cosine")
         .limit(limit).select([*columns, "_distance"]).nprobes(cfg.index.nprobes)
         .refine_factor(cfg.index.refine_factor(limit)))
    if where:
        q = q.where(where)
    with anyio.fail_after(cfg.db_timeout_s):
        res = await q.to_arrow()
    if "query_index" not in res.column_names:
        res = res.append_column("query_index", pa.array([0] * res.num_rows, pa.int32()))
    return res


async def nearest_accepted(envs: AsyncTable, cfg: MemoryConfig,
                           vectors: list[np.ndarray]) -> list[tuple[str, float] | None]:
    """Nearest accepted environment of each vector: (id, cosine similarity) or None.

    A `status = 'accepted'` prefilter costs a scan of the status column per query, so the
    nearest NOVELTY_PROBE rows of any status are fetched first; the best accepted one among
    them is the nearest accepted overall. Only vectors whose probe held none accepted (say,
    a crowd of rejected near-copies) get the filtered search."""
    out: list[tuple[str, float] | None] = [None] * len(vectors)
    if not vectors:
        return out

    def take(res: pa.Table, index_map: list[int]) -> None:
        for qi, nid, status, dist in zip(res["query_index"].to_pylist(), res["id"].to_pylist(),
                                         res["status"].to_pylist(),
                                         res["_distance"].to_pylist(), strict=True):
            i, sim = index_map[qi], 1.0 - float(dist)
            if status == "accepted" and (out[i] is None or sim > out[i][1]):
                out[i] = (nid, sim)

    take(await knn(envs, cfg, vectors, NOVELTY_PROBE, None, ["id", "status"]),
         list(range(len(vectors))))
    missing = [i for i, o in enumerate(out) if o is None]
    if missing:
        take(await knn(envs, cfg, [vectors[i] for i in missing], 1, "status = 'accepted'",
                       ["id", "status"]), missing)
    return out


class BatchNovelty:
    """Judges one batch's new environments, in order, against the nearest accepted one in the
    table (looked up beforehand, `nearest_accepted`) and those accepted earlier in this very
    batch (not in the table yet)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self._vecs: list[np.ndarray] = []
        self._ids: list[str] = []

    def judge(self, eid: str, env: NewEnv, vector: np.ndarray,
              best: tuple[str, float] | None) -> InsertResult:
        threshold = self.threshold
        if env.rejected_reason is not None:
            res = InsertResult(eid, "rejected", env.rejected_reason)
        elif not env.check_novelty:
            res = InsertResult(eid, "accepted")
        else:
            if self._vecs:  # accepted earlier in this very batch, not in the table yet
                sims = np.stack(self._vecs) @ vector
                k = int(np.argmax(sims))
                if best is None or sims[k] > best[1]:
                    best = (self._ids[k], float(sims[k]))
            if best is not None and best[1] >= threshold:
                res = InsertResult(eid, "rejected", f"duplicate: nearest accepted environment "
                                   f"{best[0]} at cosine {best[1]:.3f} >= {threshold}",
                                   neighbour_id=best[0], similarity=best[1])
            elif best is not None:
                res = InsertResult(eid, "accepted", neighbour_id=best[0], similarity=best[1])
            else:
                res = InsertResult(eid, "accepted")
        if res.status == "accepted":
            self._vecs.append(vector)
            self._ids.append(eid)
        return res
