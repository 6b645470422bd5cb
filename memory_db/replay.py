"""Prioritized level replay (Jiang, Grefenstette & Rocktäschel, 2021) over stored variants.

A level is a variant (an environment at given params): each has its own score and staleness,
so an environment whose hard variant has high regret is replayed at that variant.

    P_replay(i) = (1 - rho) * P_S(i) + rho * P_C(i)
    P_S(i) = h(S_i)^(1/beta) / sum_j h(S_j)^(1/beta),  h(S_i) = 1 / rank(S_i)   (rank 1 = best)
    P_C(i) = (c - C_i) / sum_j (c - C_j)

S_i is the environment's score (regret EMA, or learnability p(1-p)); c is the replay clock (one
tick per visit), C_i the clock at variant i's last visit. Tied scores share their average
rank, so equally scored environments are equally likely. The clock and every C_i live in the
database (meta and env_stats), so a restarted daemon continues the same distribution.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from memory_db.config import ReplayConfig
from memory_db.records import EnvStats


def score_of(stats: EnvStats, score: str) -> float:
    value = stats.regret_ema if score == "regret" else stats.learnability
    return 0.0 if value is None else float(value)


def average_ranks(scores: np.ndarray) -> np.ndarray:
    """Rank 1 for the highest score; ties get the mean of the ranks they span."""
    uniq, inverse, counts = np.unique(-scores, return_inverse=True, return_counts=True)
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    group_rank = start + (counts + 1) / 2.0
    return group_rank[inverse]


def replay_distribution(scores: np.ndarray, last_ticks: np.ndarray, clock: int,
                        cfg: ReplayConfig) -> np.ndarray:
    """P_replay over the candidates, as in the module docstring."""
    n = len(scores)
    if n == 0:
        return np.zeros(0)
    h = (1.0 / average_ranks(np.asarray(scores, dtype=np.float64))) ** (1.0 / cfg.beta)
    p_score = h / h.sum()
    staleness = np.maximum(0, clock - np.asarray(last_ticks, dtype=np.float64))
    total = staleness.sum()
    p_stale = staleness / total if total > 0 else np.full(n, 1.0 / n)
    return (1.0 - cfg.rho) * p_score + cfg.rho * p_stale


def replay_pool(stats: Mapping[str, EnvStats], accepted: set[str],
                family: Mapping[str, str]) -> list[EnvStats]:
    """Variants replay draws from: played ones (PLR replays only levels it has seen) of accepted
    environments, in variant-id order so a draw is reproducible. `family` maps a variant id to
    its environment's id."""
    return [s for i, s in sorted(stats.items())
            if family.get(i, i) in accepted and s.episodes_unhinted > 0]


def pool_distribution(pool: list[EnvStats], clock: int, cfg: ReplayConfig) -> np.ndarray:
    scores = np.array([score_of(s, cfg.score) for s in pool])
    ticks = np.array([clock if s.last_tick is None else s.last_tick for s in pool])
    return replay_distribution(scores, ticks, clock, cfg)
