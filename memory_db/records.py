"""The values that cross the memory's API: what is stored (NewEnv) and what comes back
(InsertResult, EnvStats, VariantStats, EnvRecord, Hit, Summary).

Statistics are kept per variant (an environment at given params); an environment's own
statistics are the aggregate of its variants (`stats.aggregate_stats`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
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


@dataclass(frozen=True)
class EnvRecord:
    """An environment (the family) with its statistics aggregated over its variants
    (`stats.aggregate_stats`); `EnvMemory.variants` has them one by one."""

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


@dataclass
class Summary:
    """What `spade memory stats` shows (filled by `summary.summarize`)."""

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
