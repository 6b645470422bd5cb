"""Decontamination: how close each held-out suite's tasks come to what an arm trained on.

Every task text of a held-out suite (`Suite.texts()`) is embedded with the arm's memory
embedder and compared (cosine) with the embeddings of the arm's accepted environments, as the
memory stored them. Per suite: the nearest training environment over all its tasks (its name
and distance, and the task), and the median over tasks of each task's nearest distance. A
distance near 0 says a held-out task and a training environment read alike; the probe suites
are training variants on purpose and are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from spade_async.core.config.eval import PROBE_SUITES


def nearest_training(texts: dict[str, Sequence[str]], envs: list[dict[str, Any]],
                     embed: Callable[[Sequence[str]], np.ndarray]) -> dict[str, dict[str, Any]]:
    """Per suite, its tasks' nearest accepted environment among `envs` (memory export rows
    with embeddings). `embed` returns unit rows, as the memory's embedder does."""
    accepted = [e for e in envs if e.get("status") == "accepted" and e.get("embedding")]
    if not accepted:
        return {}
    train = np.asarray([e["embedding"] for e in accepted], dtype=np.float32)
    train /= np.maximum(np.linalg.norm(train, axis=1, keepdims=True), 1e-12)
    out: dict[str, dict[str, Any]] = {}
    for suite, tasks in texts.items():
        tasks = [t for t in tasks if t]
        if not tasks:
            continue
        sims = embed(tasks) @ train.T  # (tasks, environments)
        nearest = sims.max(axis=1)
        t = int(nearest.argmax())
        e = int(sims[t].argmax())
        out[suite] = {
            "tasks": len(tasks), "environments": len(accepted),
            "min_distance": round(float(1.0 - nearest[t]), 4),
            "median_nearest_distance": round(float(1.0 - np.median(nearest)), 4),
            "closest": {"environment": accepted[e].get("name"), "env_id": accepted[e].get("id"),
                        "task": tasks[t][:160]},
        }
    return out


def suite_texts(cfg: Any, suites: Sequence[str]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The held-out suites' task texts (the probe suites left out), and the suites whose texts
    could not be read, with why (e.g. BFCL without its venv)."""
    from spade_async.evals import make_suite

    texts: dict[str, list[str]] = {}
    missing: dict[str, str] = {}
    for name in suites:
        if name in PROBE_SUITES:
            continue
        try:
            texts[name] = list(make_suite(name, cfg).texts())
        except Exception as exc:  # a suite's package may be absent here: say so, go on
            missing[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return texts, missing


def arm_decontamination(cfg: Any, suites: Sequence[str], envs: list[dict[str, Any]]
                        ) -> dict[str, Any]:
    """The report's decontamination block for one arm: `nearest_training` with the arm's
    memory embedder, plus the suites it could not read."""
    from memory_db.embed import make_embedder

    texts, missing = suite_texts(cfg, suites)
    if not texts or not envs:
        return {"suites": {}, "unavailable": missing}
    try:
        embedder = make_embedder(cfg.memory.embedding_model)
        found = nearest_training(texts, envs, embedder.embed)
    except Exception as exc:  # the report still comes out, saying what is missing
        return {"suites": {}, "unavailable": missing,
                "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return {"suites": found, "unavailable": missing,
            "embedding_model": cfg.memory.embedding_model}
