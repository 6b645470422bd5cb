"""The values that cross the memory's API, and the running-statistics update (one pure function).

Scores are episode scores in [0, 1] (DESIGN §3). Regret of one evaluation is
max(0, mean(hinted) - mean(unhinted)) (DESIGN §6); its exponential moving average ranks an
environment for replay. Learnability is p(1 - p) with p the unhinted success rate, estimated by
the mean unhinted score over all episodes so far (the solve rate when scores are 0/1).

Statistics are kept per variant (an environment at given params); an environment's own
statistics are the aggregate of its variants (`aggregate_stats`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

Status = Literal["accepted", "rejected"]
STATUSES: tuple[Status, ...] = ("accepted", "rejected")


@dataclass(frozen=True)
class NewEnv:
    """An environment to store. `rejected_reason` set: it failed validation and is stored as
    rejected with that reason. Otherwise it is accepted unless the novelty filter finds an
    accepted near-copy (skipped when `check_novelty` is False, e.g. for bulk imports)."""

    code: str
    name: str
    description: str
    source_doc_id: str = ""
    source_excerpt: str = ""
    policy_version: int | None = None
    tags: tuple[str, ...] = ()
    rejected_reason: str | None = None
    check_novelty: bool = True


@dataclass(frozen=True)
class InsertResult:
    id: str
    status: Status
    reason: str = ""
    neighbour_id: str | None = None    # nearest accepted environment, when one was compared
    similarity: float | None = None    # its cosine similarity
    existed: bool = False              # the same code was already stored (nothing was written)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class EnvStats:
    id: str
    episodes_hinted: int = 0
    episodes_unhinted: int = 0
    mean_hinted: float | None = None
    mean_unhinted: float | None = None
    regret_last: float | None = None
    regret_ema: float | None = None
    learnability: float | None = None
    # the share of hinted episodes that won by copying the hint (mean of their copy scores;
    # None: never measured)
    hint_leak: float | None = None
    # episodes that failed in the sandbox on the environment's own code (a crash, a timeout,
    # a value outside the contract): never scores, so a broken environment does not read as hard
    sandbox_failures: int | None = 0
    times_replayed: int = 0
    last_played: datetime | None = None
    last_tick: int | None = None
    updated_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("last_played", "updated_at"):
            d[key] = None if d[key] is None else d[key].isoformat()
        return d


@dataclass(frozen=True)
class VariantStats:
    """One variant: environment `env_id` played with `params`, and its own statistics (whose
    `id` is the variant id). What the designer's edit move shows the model, and what replay
    draws."""

    env_id: str
    params: dict[str, Any]
    stats: EnvStats

    @property
    def id(self) -> str:
        return self.stats.id

    @property
    def episodes(self) -> int:
        return self.stats.episodes_unhinted + self.stats.episodes_hinted

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "env_id": self.env_id, "params": self.params,
                "stats": self.stats.as_dict()}


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


@dataclass(frozen=True)
class EnvRecord:
    """An environment (the family) with its statistics aggregated over its variants
    (`aggregate_stats`); `EnvMemory.variants` has them one by one."""

    id: str
    name: str
    description: str
    status: Status
    reason: str
    source_doc_id: str
    source_excerpt: str
    created_at: datetime
    policy_version: int | None
    tags: tuple[str, ...]
    stats: EnvStats
    code: str | None = None  # only when asked for

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["created_at"] = self.created_at.isoformat()
        d["tags"] = list(self.tags)
        d["stats"] = self.stats.as_dict()
        if self.code is None:
            d.pop("code")
        return d


@dataclass(frozen=True)
class Hit:
    """One search result: the record and its cosine similarity to the query."""

    record: EnvRecord
    similarity: float
    rank: int

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "similarity": round(self.similarity, 4), **self.record.as_dict()}


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


@dataclass
class Summary:
    """What `spade memory stats` shows (filled by the store)."""

    counts: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)
    played: int = 0     # accepted environments with episodes
    variants: int = 0   # variant rows (played environment x params) of every environment
    regret: dict[str, Any] = field(default_factory=dict)
    solve_rate: dict[str, Any] = field(default_factory=dict)
    hint_leak: dict[str, Any] = field(default_factory=dict)  # over played envs that measured it
    sandbox_failing: dict[str, Any] = field(default_factory=dict)  # envs whose code failed
    diversity: dict[str, Any] = field(default_factory=dict)
    replay: dict[str, Any] = field(default_factory=dict)
    storage: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
