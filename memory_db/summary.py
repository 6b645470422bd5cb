"""The memory's summary (what `spade memory stats` prints): counts by status and rejection
reason, regret, solve-rate and hint-leak distributions of the played environments, diversity
of the accepted ones, the replay distribution's shape and storage health."""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import numpy as np

from memory_db.config import MemoryConfig
from memory_db.records import EnvStats, Summary
from memory_db.schema import Tables

LEAK_FLAG = 0.5  # the summary counts environments whose hint_leak is at least this as flagged


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


async def summarize(t: Tables, cfg: MemoryConfig, uri: str, dim: int,
                    env_stats: dict[str, EnvStats], replay_probs: dict[str, float]) -> Summary:
    """The summary of the memory at `uri`, given each environment's statistics aggregated over
    its variants (`env_stats`) and the replay pool's P_replay by variant id (`replay_probs`)."""
    s = Summary()
    with anyio.fail_after(cfg.db_timeout_s):
        meta = (await t.envs.query().select(["id", "status", "reason"]).to_arrow()).to_pylist()
    s.counts = dict(Counter(r["status"] for r in meta))
    s.counts["total"] = len(meta)
    s.reasons = dict(Counter((r["reason"] or "").split(":", 1)[0] or "?" for r in meta
                             if r["status"] == "rejected").most_common())
    accepted = {r["id"] for r in meta if r["status"] == "accepted"}
    with anyio.fail_after(cfg.db_timeout_s):
        s.variants = await t.stats.count_rows()
    stats = [x for i, x in env_stats.items() if i in accepted]
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
    s.diversity = await diversity(t, cfg, dim, len(accepted))
    if replay_probs:
        p = np.array(sorted(replay_probs.values(), reverse=True))
        s.replay = {"pool": len(p), "score": cfg.replay.score,
                    "effective_pool": round(float(1.0 / np.square(p).sum()), 2),
                    "top": [{"id": i, "p": round(v, 4)} for i, v in
                            sorted(replay_probs.items(), key=lambda kv: -kv[1])[:5]]}
    with anyio.fail_after(cfg.db_timeout_s):
        ts = await t.envs.stats()
        indices = list(await t.envs.list_indices())
        s.storage = {"uri": uri, "version": await t.envs.version(),
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


async def diversity(t: Tables, cfg: MemoryConfig, dim: int, n_accepted: int) -> dict[str, Any]:
    """Mean pairwise cosine distance over all accepted environments, exactly and in O(n d):
    for unit vectors, sum_{i != j} v_i . v_j = |sum_i v_i|^2 - n."""
    if n_accepted < 2:
        return {"n": n_accepted, "mean_pairwise_cosine_distance": None}
    total = np.zeros(dim, dtype=np.float64)
    n = 0
    q = t.envs.query().where("status = 'accepted'").select(["embedding"])
    with anyio.fail_after(cfg.db_timeout_s * 4):
        async for batch in await q.to_batches():
            col = batch.column("embedding")
            vecs = col.values.to_numpy(zero_copy_only=False).reshape(len(col), -1)
            total += vecs.astype(np.float64).sum(axis=0)
            n += len(col)
    mean_sim = (float(total @ total) - n) / (n * (n - 1))
    return {"n": n, "mean_pairwise_cosine_distance": round(1.0 - mean_sim, 4)}

