"""The report's summary: the run's counts (designs, rejections by reason, the memory, episodes,
regret, hint leaks, trainer steps, evaluations, moves, curriculum, frontier, probe, saturation)
as one dict, written as summary.json and printed by `spade report`."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np

from spade_async.core.config import SpadeConfig, run_dir
from spade_async.report.curriculum import (
    curriculum,
    curriculum_table,
    moves_summary,
    probe_summary,
)
from spade_async.report.data import RunData, design_outcome
from spade_async.report.frontier import frontier_summary
from spade_async.report.training import training_summary


def _leak_summary(plays: list[dict]) -> dict[str, Any]:
    """Plays whose hinted wins were copied from the hint: how many were measured and flagged,
    the mean leak, and the flagged share per quarter of the run (the leak rate over time)."""
    measured = [p for p in plays if p.get("hint_leak") is not None]
    flagged = [bool(p.get("leak_flagged")) for p in measured]
    quarters = [flagged[i * len(flagged) // 4:(i + 1) * len(flagged) // 4] for i in range(4)]
    return {"plays": len(measured), "flagged": sum(flagged),
            "mean": round(sum(float(p["hint_leak"]) for p in measured) / len(measured), 4)
            if measured else None,
            "flagged_share_by_quarter": [round(sum(q) / len(q), 3) if q else None
                                         for q in quarters]}


def summary(cfg: SpadeConfig, d: RunData) -> dict[str, Any]:
    fams = curriculum(d.designs, d.plays, d.t0, cfg.validation.solution_score)
    outcomes = Counter(design_outcome(x) for x in d.designs)
    regrets = [float(p.get("regret", 0.0)) for p in d.plays]
    published = [s["publish"]["version"] for s in d.steps
                 if isinstance(s.get("publish"), dict) and s["publish"].get("ok")]
    return {
        "data_dir": str(cfg.paths.data_dir),
        "minutes": round((d.t_last - d.t0) / 60.0, 1) if d.t_last is not None else 0.0,
        "designs": len(d.designs),
        "accepted": outcomes.get("accepted", 0),
        "rejected_by_reason": {k: v for k, v in outcomes.most_common() if k != "accepted"},
        "memory": {"stored": len(d.envs),
                   "accepted": sum(e.get("status") == "accepted" for e in d.envs),
                   "error": d.memory_error},
        "episodes": len(d.episodes),
        # failed on the endpoint or in the sandbox: never scores, counted here by kind
        "episodes_failed": d.episodes.failures(),
        "episode_versions": [int(v) for v in np.unique(d.episodes.policy_version)],
        "envs_played": len(d.plays),
        "regret_mean": round(sum(regrets) / len(regrets), 4) if regrets else None,
        "hint_leak": _leak_summary(d.plays),
        "trainer_steps": len(d.steps),
        # pace, throughput, padding, drift from the base, the sample ledger (report/training.py)
        "training": training_summary(cfg, d),
        "versions_published": published,
        "evaluations": len(d.evals),
        "moves": moves_summary(d.designs, d.plays, d.t0),
        "curriculum": curriculum_table(fams),
        "curriculum_families": fams,
        # edit sizes in neighbour steps and where the plays' solve rates lie (report/frontier.py)
        "frontier": frontier_summary(d.designs, d.plays, d.t0, cfg.validation.solution_score),
        "probe": probe_summary(d.evals),
        "probe_greedy": probe_summary(d.evals, "probe-greedy"),
        # per probe suite: its last version minus its first, paired task by task
        "probe_paired": d.probe_paired,
        "saturation": _saturation(cfg),
    }


def _saturation(cfg: SpadeConfig) -> dict[str, Any]:
    """Per endpoint, the run's mean saturation from the daemon's last status (while running,
    while waiting for the trainer, and the share of time it waited)."""
    try:
        st = json.loads((run_dir(cfg) / "status.json").read_text())
    except (OSError, ValueError):
        return {}
    return {ep["name"]: ep.get("saturation_run") for ep in st.get("endpoints", [])}
