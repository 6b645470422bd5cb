"""The spool's interface: an ordered, durable hand-off of batches between processes, whatever
stores them (FileSpool, in files.py, is the one implementation)."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable

from spade_async.core.spool.batch import Batch, Sample


class BatchSpool(ABC):
    """Ordered, durable hand-off of batches from one writer to readers in other processes.

    Sequence numbers start at 1 and never repeat. A reader keeps its own cursor (the trainer
    stores the last consumed seq in its checkpoint) and asks for the batch after it; `ack(seq)`
    says every batch up to seq is safely consumed, and only acknowledged batches may be
    collected by `gc`.
    """

    @abstractmethod
    def write(self, samples: Iterable[Sample]) -> int:
        """Validate, persist atomically, return the batch's sequence number."""

    @abstractmethod
    def claim_next(self, after_seq: int) -> Batch | None:
        """The batch numbered after_seq + 1, or None while it is not there (never a later one)."""

    @abstractmethod
    def ack(self, seq: int) -> None:
        """Every batch up to and including seq is consumed; it may be collected."""

    @abstractmethod
    def gc(self, upto_seq: int | None = None) -> int:
        """Delete acknowledged batches up to upto_seq (default: the ack mark); return how many."""

    @abstractmethod
    def last_seq(self) -> int:
        """The highest sequence number ever written (0 before the first batch)."""

    @abstractmethod
    def acked_seq(self) -> int:
        """The acknowledgement mark (0 before the first ack)."""

    @abstractmethod
    def mark_taken(self, seq: int) -> None:
        """The reader has taken every batch up to seq into training. Progress only, for the
        writer's back-pressure: not durable (a restarted reader takes from its checkpoint)."""

    @abstractmethod
    def taken_seq(self) -> int:
        """How far the reader has got: the later of the progress and acknowledgement marks."""

    def wait_next(
        self, after_seq: int, *, timeout_s: float, poll_interval_s: float = 0.2
    ) -> Batch | None:
        """`claim_next`, polling until a batch arrives or timeout_s passes (for sync readers)."""
        deadline = time.monotonic() + timeout_s
        while True:
            batch = self.claim_next(after_seq)
            remaining = deadline - time.monotonic()
            if batch is not None or remaining <= 0:
                return batch
            time.sleep(min(poll_interval_s, remaining))

    def close(self) -> None:  # noqa: B027 - optional hook; the base holds nothing
        """Release what the spool holds (a writer's lock)."""

    def __enter__(self) -> BatchSpool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
