"""What the loop needs from the environment memory (memory_db implements it through
spade_async.memory.port; tests fake it): the environments it plays and the records it keeps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from memory_db.schema import variant_id
from spade_async.envs.validation_report import ValidationReport
from spade_async.reward.regret import DesignStatus


@dataclass(frozen=True)
class StoredEnv:
    """An environment to play: `env_id` is the environment (family, whose code this is),
    `params` the difficulty knobs to play it at ({}: its defaults) and `variant_id` that
    variant's stats key (memory_db.schema.variant_id; defaults to env_id when there are no
    params)."""

    env_id: str
    code: str
    name: str
    params: dict[str, Any] = field(default_factory=dict, hash=False)
    variant_id: str = ""

    def __post_init__(self) -> None:
        if not self.variant_id:
            if self.params:  # only the memory knows how params hash; never guess an id here
                raise ValueError(f"StoredEnv {self.env_id} with params needs its variant_id")
            object.__setattr__(self, "variant_id", self.env_id)

    def at(self, params: dict[str, Any]) -> StoredEnv:
        """The same environment at other knob values, keyed as the memory keys variants."""
        if params == self.params:
            return self
        return StoredEnv(self.env_id, self.code, self.name, params=dict(params),
                         variant_id=variant_id(self.env_id, params))


class MemoryPort(Protocol):
    async def examples(self, query: str, k: int) -> list[str]: ...

    async def add_design(self, code: str | None, report: ValidationReport | None, *,
                         doc_id: str, chunk_id: str, excerpt: str, policy_version: int,
                         ) -> tuple[DesignStatus, str | None, str]:
        """Store a design (accepted or rejected, with its reason); (status, env_id, reason)."""
        ...

    async def record_play(self, env_id: str, unhinted: list[float], hinted: list[float],
                          params: dict[str, Any] | None = None,
                          hint_copies: list[float] | None = None,
                          sandbox_failures: int = 0) -> None:
        """Episodes of environment `env_id` played at `params` (resolved; None: defaults);
        `hint_copies`, one per hinted episode: how far it won by copying the hint;
        `sandbox_failures`: episodes its code failed (counted, not scored)."""
        ...

    async def record_failures(self, env_id: str, n: int,
                              params: dict[str, Any] | None = None) -> None:
        """A play with no score on one side: its `n` episodes the environment's code failed."""
        ...

    async def sample_replay(self) -> StoredEnv | None: ...

    async def sample_played(self) -> StoredEnv | None:
        """A played variant by the replay sampler's priorities (None before any play)."""
        ...

    async def variants(self, env_id: str) -> list[Any]:
        """memory_db.records.VariantStats of `env_id`, most played first."""
        ...

    async def accepted_count(self) -> int: ...

    async def fixed_pool(self) -> list[StoredEnv]:
        """Every accepted environment (the fixed-environment baseline's pool)."""
        ...
