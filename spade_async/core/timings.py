"""Recent durations of one kind of operation, bounded: the last `keep` of them and how many in
all, with their quantiles (what status.json shows of memory operations and status ticks, and
what `spade bench soak` samples over a long run). Never grows with the run's age."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class RecentTimes:
    def __init__(self, keep: int = 2048) -> None:
        self._recent: deque[float] = deque(maxlen=keep)
        self.count = 0

    def add(self, seconds: float) -> None:
        self._recent.append(seconds)
        self.count += 1

    @contextmanager
    def timed(self, clock: Callable[[], float] = time.perf_counter) -> Iterator[None]:
        """Times the block, whether it returns or raises (`clock`: wall time, or e.g.
        time.thread_time for the CPU time the block's own thread spent)."""
        t0 = clock()
        try:
            yield
        finally:
            self.add(clock() - t0)

    def as_dict(self) -> dict[str, Any]:
        """count (all time); n, p50_ms, p99_ms, max_ms over the last `keep`."""
        xs = sorted(self._recent)
        if not xs:
            return {"count": self.count, "n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}

        def q(p: float) -> float:
            return round(1000 * xs[min(len(xs) - 1, int(p * len(xs)))], 3)

        return {"count": self.count, "n": len(xs), "p50_ms": q(0.5), "p99_ms": q(0.99),
                "max_ms": round(1000 * xs[-1], 3)}
