"""`spade bench memory`: the environment memory at scale, measured side by side in one run.

- insert rate: N synthetic environments through the real insert path (hash-384 embedding in a
  worker thread, the single batched writer, LanceDB appends), novelty filter off as for a bulk
  import; then a smaller set with the novelty filter on, against the indexed table;
- MMR top-k latency: `EnvMemory.nearest` (LanceDB IVF-PQ search of the top fetch_k, then MMR)
  versus numpy brute force over the same vectors held in RAM (one dot product with all N, top
  fetch_k by argpartition, the same MMR function); queries alternate between the two so machine
  noise hits both alike; LanceDB flat (before the index exists) is timed on a few queries too;
  the same search with the `status = 'accepted'` filter real callers use is reported beside;
- recall@k of the ANN plain top-k against the exact top-k, and how much the two MMR lists agree.

Synthetic environments have structure like real ones: topics (a word set each), variants within
a topic, and per-environment noise words, so near neighbours are clearly nearer than the bulk;
on structureless random text every neighbour ties and recall means nothing.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from memory_db import MemoryConfig, NewEnv, open_memory
from memory_db.embed import aembed
from memory_db.mmr import mmr

TOPICS, VARIANTS, VOCAB = 1000, 10, 20_000
CODE = '''import random

class Environment:
    name = "{name}"
    description = "{description}"
    max_turns = 4

    def reset(self, seed):
        self.target = random.Random(seed * {salt}).randint(0, 99)
        return "Guess a number from 0 to 99.", {{}}

    def step(self, action):
        ok = action.strip() == str(self.target)
        return ("right" if ok else "wrong"), float(ok), ok, False, {{}}

    def hint(self):
        return f"The number is {{self.target}}."
'''


class SyntheticWorld:
    """Topic and variant word sets fixed by `seed`; `envs(n, stream)` draws environments."""

    def __init__(self, seed: int = 1234) -> None:
        rng = np.random.default_rng(seed)
        self.topic_words = rng.integers(0, VOCAB, size=(TOPICS, 8))
        self.variant_words = rng.integers(0, VOCAB, size=(TOPICS, VARIANTS, 4))

    def texts(self, n: int, stream: int) -> list[tuple[int, str]]:
        rng = np.random.default_rng(stream)
        out = []
        for _ in range(n):
            t, v = int(rng.integers(TOPICS)), int(rng.integers(VARIANTS))
            words = [*np.sort(rng.choice(self.topic_words[t], 6, replace=False)),
                     *np.sort(rng.choice(self.variant_words[t, v], 3, replace=False)),
                     *rng.integers(0, VOCAB, 2)]
            out.append((t, " ".join(f"w{w}" for w in words)))
        return out

    def envs(self, n: int, stream: int, *, check_novelty: bool = False) -> list[NewEnv]:
        return [NewEnv(code=CODE.format(name=f"syn-{stream}-{i}", description=text, salt=i + 7),
                       name=f"syn-{stream}-{i}", description=text, tags=(f"topic-{t}",),
                       source_doc_id=f"synthetic:{stream}", check_novelty=check_novelty)
                for i, (t, text) in enumerate(self.texts(n, stream))]


def _ms(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median_ms": round(statistics.median(xs) * 1000, 3),
            "p90_ms": round(xs[int(0.9 * (len(xs) - 1))] * 1000, 3), "n": len(xs)}


def numpy_mmr(matrix: np.ndarray, q: np.ndarray, k: int, fetch_k: int, lam: float) -> list[int]:
    """The brute-force baseline: exact similarities to every row, top fetch_k, then MMR."""
    sims = matrix @ q
    top = np.argpartition(-sims, fetch_k)[:fetch_k]
    top = top[np.argsort(-sims[top], kind="stable")]
    return [int(top[i]) for i in mmr(sims[top], matrix[top], k, lam)]


async def _bench(rows: int, queries: int, k: int, fetch_k: int, novelty_rows: int,
                 workdir: Path, progress: Callable[[str], None]) -> dict[str, Any]:
    # The index is trained once, explicitly, after the bulk load (automatic training is held
    # back by min_rows), so the flat search can be timed first.
    cfg = MemoryConfig(embedding_model="hash-384", fetch_k=fetch_k,
                       index={"min_rows": max(256, 2 * (rows + novelty_rows)),
                              "build_timeout_s": 3600},
                       writer={"batch_size": 1024, "queue_size": 4096,
                               "write_timeout_s": 1800}, optimize_every_s=3600)
    world = SyntheticWorld()
    report: dict[str, Any] = {"rows": rows, "dim": 384, "k": k, "fetch_k": fetch_k,
                              "mmr_lambda": cfg.mmr_lambda, "queries": queries}
    uri = str(workdir / "memory")
    async with open_memory(cfg, uri) as mem:
        chunk = 10_000
        t0 = time.perf_counter()
        for start in range(0, rows, chunk):
            envs = world.envs(min(chunk, rows - start), stream=start)
            await mem.insert_many(envs)
            progress(f"inserted {start + len(envs)}/{rows} "
                     f"({(start + len(envs)) / (time.perf_counter() - t0):.0f} rows/s)")
        insert_s = time.perf_counter() - t0
        report["insert"] = {"rows_per_s": round(rows / insert_s, 1), "seconds": round(insert_s, 2),
                            "novelty_filter": False, "writer_batch": cfg.writer.batch_size}

        q_texts = [text for _, text in world.texts(queries, stream=10**9)]
        q_vecs = await aembed(mem.embedder, q_texts)
        flat_n = min(20, queries)
        flat = []
        for q in q_vecs[:flat_n]:
            t1 = time.perf_counter()
            await mem.nearest(q, k=k, diverse=True)
            flat.append(time.perf_counter() - t1)
        report["lancedb_flat_mmr"] = _ms(flat)
        progress(f"flat (no index) MMR top-{k}: median {report['lancedb_flat_mmr']['median_ms']} ms")

        progress("optimizing and training the IVF-PQ index ...")
        t0 = time.perf_counter()
        m = await mem.maintain(optimize=True, index="force")
        report["index"] = {**m["index"], "optimize_s": m["optimize_s"],
                           "nprobes": cfg.index.nprobes,
                           "refine_candidates": cfg.index.refine_candidates,
                           "total_s": round(time.perf_counter() - t0, 2)}
        progress(f"index trained in {m['index']['seconds']:.1f} s")

        tbl = await mem.tables.envs.query().select(["id", "embedding"]).to_arrow()
        ids = tbl["id"].to_pylist()
        emb = tbl["embedding"].combine_chunks()
        matrix = np.ascontiguousarray(emb.values.to_numpy().reshape(len(emb), -1))
        progress(f"numpy matrix {matrix.shape} ({matrix.nbytes / 2**20:.0f} MiB) in RAM")

        for q in q_vecs[:5]:  # warm both paths (page cache, BLAS threads)
            await mem.nearest(q, k=k, diverse=True)
            numpy_mmr(matrix, q, k, fetch_k, cfg.mmr_lambda)
        t_lance, t_np, t_filtered, recall, agree = [], [], [], [], []
        for i, q in enumerate(q_vecs):
            t1 = time.perf_counter()
            got = await mem.nearest(q, k=k, diverse=True)
            t2 = time.perf_counter()
            base = numpy_mmr(matrix, q, k, fetch_k, cfg.mmr_lambda)
            t3 = time.perf_counter()
            # as the designer and `spade memory search` ask: accepted environments only
            await mem.nearest(q, k=k, diverse=True, where="status = 'accepted'")
            t_filtered.append(time.perf_counter() - t3)
            t_lance.append(t2 - t1)
            t_np.append(t3 - t2)
            agree.append(len({r["id"] for r, _ in got} & {ids[j] for j in base}) / k)
            exact = {ids[j] for j in np.argsort(-(matrix @ q), kind="stable")[:k]}
            ann = {r["id"] for r, _ in await mem.nearest(q, k=k, diverse=False)}
            recall.append(len(ann & exact) / k)
            if (i + 1) % 50 == 0:
                progress(f"queries {i + 1}/{queries}")
        report["lancedb_ann_mmr"] = _ms(t_lance)
        report["numpy_bruteforce_mmr"] = _ms(t_np)
        report["lancedb_ann_mmr_status_filter"] = _ms(t_filtered)
        report["ratio_lancedb_over_numpy"] = round(
            report["lancedb_ann_mmr"]["median_ms"] / report["numpy_bruteforce_mmr"]["median_ms"], 3)
        report["recall_at_k"] = round(float(np.mean(recall)), 4)
        report["mmr_agreement"] = round(float(np.mean(agree)), 4)

        novel = world.envs(novelty_rows, stream=2 * 10**9, check_novelty=True)
        t0 = time.perf_counter()
        results = await mem.insert_many(novel)
        nov_s = time.perf_counter() - t0
        report["insert_with_novelty"] = {
            "rows": novelty_rows, "rows_per_s": round(novelty_rows / nov_s, 1),
            "seconds": round(nov_s, 2), "threshold": cfg.novelty_threshold,
            "rejected_as_duplicates": sum(r.status == "rejected" for r in results)}
        progress(f"novelty-checked inserts: {report['insert_with_novelty']['rows_per_s']} rows/s")
        st = (await mem.summary()).storage
        report["storage"] = {"fragments": st["fragments"], "bytes": st["bytes"]}
    return report


def run_memory_bench(*, rows: int = 100_000, queries: int = 200, k: int = 10, fetch_k: int = 50,
                     novelty_rows: int = 1000, workdir: Path | None = None,
                     progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Build a fresh memory of `rows` synthetic environments (in `workdir`, else a temporary
    directory removed afterwards) and measure it."""
    tmp = None
    if workdir is None:
        tmp = Path(tempfile.mkdtemp(prefix="spade-bench-memory-"))
        workdir = tmp
    try:
        return anyio.run(_bench, rows, queries, k, fetch_k, novelty_rows, workdir, progress)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
