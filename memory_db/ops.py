"""What producers hand the memory's single writer: one typed payload per kind of write, the `Op`
that carries it through the queue to its result, and `MemoryClosed`, the error of a memory
that has no writer to take it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import numpy as np

from memory_db.records import NewEnv
from memory_db.stats import Episodes


class MemoryClosed(RuntimeError):
    """The memory has no running writer (opened read-only, or already closed)."""


@dataclass(frozen=True)
class InsertPayload:
    """Store `env` (embedded as `vector`) through the novelty filter: an InsertResult."""

    env: NewEnv
    vector: np.ndarray


@dataclass(frozen=True)
class RecordPayload:
    """Episodes of environment `env_id` played at `params` (canonical JSON), which is the
    variant `variant_id`."""

    env_id: str
    params: str
    variant_id: str
    episodes: Episodes


@dataclass(frozen=True)
class SamplePayload:
    """Draw a played variant by P_replay (`u` uniform in [0, 1)) and mark it visited:
    (variant id, probability) or None."""

    u: float


@dataclass(frozen=True)
class MaintainPayload:
    """Compaction and (re)indexing now, between batches: what was done."""

    optimize: bool = True
    index: Literal["auto", "force", "skip"] = "auto"


Payload = InsertPayload | RecordPayload | SamplePayload | MaintainPayload
_KINDS: dict[type, str] = {InsertPayload: "insert", RecordPayload: "record",
                           SamplePayload: "sample", MaintainPayload: "maintain"}


@dataclass
class Op:
    """One queued operation; its kind (the stage that runs it) follows from its payload."""

    payload: Payload
    done: anyio.Event = field(default_factory=anyio.Event)
    result: Any = None
    error: BaseException | None = None
    # Set by the writer when it takes the op into a batch; from then on the op commits (or
    # fails) whatever its producer does. An op its producer left before that is abandoned:
    # the writer drops it, so a cancelled or timed-out call never commits behind its back.
    taken: bool = False
    abandoned: bool = False

    @property
    def kind(self) -> str:
        return _KINDS[type(self.payload)]

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()
