"""The running statistics of a variant, as pure functions: `update_stats` folds one
evaluation's `Episodes` into them, `aggregate_stats` combines an environment's variants.

Scores are episode scores in [0, 1] (DESIGN §3). Regret of one evaluation is
max(0, mean(hinted) - mean(unhinted)) (DESIGN §6); its exponential moving average ranks an
environment for replay. Learnability is p(1 - p) with p the unhinted success rate, estimated by
the mean unhinted score over all episodes so far (the solve rate when scores are 0/1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from memory_db.records import EnvStats


@dataclass(frozen=True)
class Episodes:
    """Scores of one environment's evaluation (K hinted and K unhinted episodes)."""

    hinted: tuple[float, ...] = ()
    unhinted: tuple[float, ...] = ()
    hint_copies: tuple[float, ...] = ()  # per hinted episode: won by copying the hint (0..1)
    sandbox_failures: int = 0  # episodes of this play the environment's code failed

    def __post_init__(self) -> None:
        if self.hint_copies and len(self.hint_copies) != len(self.hinted):
            raise ValueError(f"{len(self.hint_copies)} hint copy scores for "
                             f"{len(self.hinted)} hinted episodes")
        for s in (*self.hinted, *self.unhinted, *self.hint_copies):
            if not (isinstance(s, int | float) and math.isfinite(s) and 0.0 <= s <= 1.0):
                raise ValueError(f"episode score {s!r} is not in [0, 1]")
        if self.sandbox_failures < 0:
            raise ValueError(f"sandbox_failures {self.sandbox_failures} < 0")
        if not self.hinted and not self.unhinted and not self.sandbox_failures:
            raise ValueError("no episodes to record")

    @property
    def scored(self) -> bool:
        return bool(self.hinted or self.unhinted)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _running_mean(old: float | None, n_old: int, new: Sequence[float]) -> float | None:
    if not new:
        return old
    total = (old or 0.0) * n_old + sum(new)
    return total / (n_old + len(new))


def update_stats(prev: EnvStats, ep: Episodes, *, alpha: float, now: datetime) -> EnvStats:
    """The stats after one more evaluation of the environment. Failed episodes only count
    (sandbox_failures): a play without a score leaves the means, regret and play time alone."""
    failures = (prev.sandbox_failures or 0) + ep.sandbox_failures
    if not ep.scored:
        return replace(prev, sandbox_failures=failures, updated_at=now)
    regret = ema = prev.regret_ema
    last = prev.regret_last
    if ep.hinted and ep.unhinted:
        last = max(0.0, _mean(ep.hinted) - _mean(ep.unhinted))
        ema = last if regret is None else alpha * last + (1.0 - alpha) * regret
    mean_u = _running_mean(prev.mean_unhinted, prev.episodes_unhinted, ep.unhinted)
    leak = prev.hint_leak
    if ep.hint_copies:  # hinted episodes before leaks were measured count as unmeasured
        measured = prev.episodes_hinted if prev.hint_leak is not None else 0
        leak = _running_mean(prev.hint_leak, measured, ep.hint_copies)
    return replace(
        prev,
        episodes_hinted=prev.episodes_hinted + len(ep.hinted),
        episodes_unhinted=prev.episodes_unhinted + len(ep.unhinted),
        mean_hinted=_running_mean(prev.mean_hinted, prev.episodes_hinted, ep.hinted),
        mean_unhinted=mean_u,
        regret_last=last,
        regret_ema=ema,
        learnability=None if mean_u is None else mean_u * (1.0 - mean_u),
        hint_leak=leak,
        sandbox_failures=failures,
        last_played=now,
        updated_at=now,
    )


def _weighted(values: Sequence[tuple[float | None, int]]) -> float | None:
    pairs = [(v, n) for v, n in values if v is not None and n > 0]
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else None


def aggregate_stats(env_id: str, variants: Sequence[EnvStats]) -> EnvStats:
    """An environment's statistics over all its variants, so readers that predate variants
    (list by regret, summary, the report) keep their meaning: the environment as played.

    Episode counts and times replayed are summed. mean_hinted / mean_unhinted are the means over
    all the episodes (each variant's mean weighted by its hinted / unhinted episodes), and
    learnability is p(1 - p) of that pooled unhinted mean, as for one variant. regret_ema is
    the mean of the variants' EMAs weighted by their episodes (hinted + unhinted); regret_last,
    last_played and last_tick come from the most recently played variant (the latest visit).
    A single variant is returned as it is (under the environment's id), so an environment
    played only at its defaults reads exactly as before."""
    if not variants:
        return EnvStats(id=env_id)
    if len(variants) == 1:
        return replace(variants[0], id=env_id)
    eps_u = sum(v.episodes_unhinted for v in variants)
    eps_h = sum(v.episodes_hinted for v in variants)
    mean_u = _weighted([(v.mean_unhinted, v.episodes_unhinted) for v in variants])
    played = [v for v in variants if v.last_played is not None]
    latest = max(played, key=lambda v: v.last_played) if played else None
    updated = [v.updated_at for v in variants if v.updated_at is not None]
    ticks = [v.last_tick for v in variants if v.last_tick is not None]
    return EnvStats(
        id=env_id, episodes_hinted=eps_h, episodes_unhinted=eps_u,
        mean_hinted=_weighted([(v.mean_hinted, v.episodes_hinted) for v in variants]),
        mean_unhinted=mean_u,
        regret_last=latest.regret_last if latest else None,
        regret_ema=_weighted([(v.regret_ema, v.episodes_unhinted + v.episodes_hinted)
                              for v in variants]),
        learnability=None if mean_u is None else mean_u * (1.0 - mean_u),
        hint_leak=_weighted([(v.hint_leak, v.episodes_hinted) for v in variants]),
        sandbox_failures=sum(v.sandbox_failures or 0 for v in variants),
        times_replayed=sum(v.times_replayed for v in variants),
        last_played=latest.last_played if latest else None,
        last_tick=max(ticks) if ticks else None,
        updated_at=max(updated) if updated else None,
    )
