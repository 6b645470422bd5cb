"""The work items that travel between the loop's stages: a play of one environment (PlayJob)
and the designs of one document or edited variant until their rewards are known (DocGroup)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio

from memory_db.schema import variant_id
from spade_async.core.spool.batch import Sample
from spade_async.corpus.documents import Chunk
from spade_async.design.designer import Design
from spade_async.loop.admission import Reservation
from spade_async.reward.regret import DesignStatus, EnvRegret


@dataclass
class PlayJob:
    env_id: str
    code: str
    name: str
    group: DocGroup | None  # None: a replayed environment
    params: dict[str, Any] | None = None  # a variant's knobs (None: the environment's defaults)
    move: str = "write"  # how it came to be played: write, edit, replay or fixed

    def group_key(self) -> str:
        """What its group scores a design by: the environment (write) or the variant (edit)."""
        if self.group is not None and self.group.move == "edit":
            return variant_id(self.env_id, self.params or {})
        return self.env_id


@dataclass
class DocGroup:
    """The G designs of one document (move "write"), or the G edits of one stored variant
    (move "edit", `chunk` None), until all their rewards are known. `env_of` maps a design to
    what it is scored by: its environment id (write) or its variant id (edit)."""

    chunk: Chunk | None
    designs: list[Design] = field(default_factory=list)
    status: dict[str, DesignStatus] = field(default_factory=dict)
    env_of: dict[str, str] = field(default_factory=dict)
    regrets: dict[str, EnvRegret] = field(default_factory=dict)
    checks_passed: dict[str, float] = field(default_factory=dict)
    agent_samples: list[Sample] = field(default_factory=list)
    request_failures: list[str] = field(default_factory=list)  # kinds, this attempt
    unscored: set[str] = field(default_factory=set)  # env ids whose play was given up
    move: str = "write"
    label: str = ""  # the chunk id, or "edit:<variant id>"
    untrainable: set[str] = field(default_factory=set)  # designs with no trustworthy sample
    answered: int = 0  # design requests the endpoint answered (in group.designs unless the
    # design's validation or memory write was given up)
    streams: Reservation | None = None  # its design requests' admission (one per request)
    pending: int = 0
    done: anyio.Event = field(default_factory=anyio.Event)
