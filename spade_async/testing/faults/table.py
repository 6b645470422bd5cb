"""The fault proxy's armed faults and its counters, shared by the test's thread (which arms and
clears faults, and reads the counters) and the proxy's event loop (which takes a fault for each
request and records what it did) under one lock."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

from spade_async.testing.faults.plan import Fault
from spade_async.testing.faults.wire import Request


class RequestRecord(NamedTuple):
    """One request as the proxy handled it. `outcome`: the fault kind applied, "ok" (relayed
    untouched) or "upstream-error" (the upstream failed; the client got a 502). `status`: what
    the client was sent, None when it got no status line."""

    t: float  # seconds since start()
    path: str
    outcome: str
    status: int | None


@dataclass(eq=False)
class Armed:
    fault: Fault
    remaining: int | None
    expires: float | None  # time.monotonic()
    generation: int  # a clear() ends every fault armed before it
    released: bool = False

    def ended(self, now: float) -> bool:
        return self.released or (self.expires is not None and now >= self.expires)


class FaultTable:
    """Faults apply first-armed-first; each `take` counts a request seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the armed faults and the counters
        self._armed: list[Armed] = []
        self._generation = 0
        self.seen = 0
        self.forwarded = 0
        self._applied: Counter[str] = Counter()
        self._log: list[RequestRecord] = []
        self.t0 = time.monotonic()  # the log's clock starts here (reset by the proxy's start)

    def arm(self, fault: Fault) -> Armed:
        expires = None if fault.duration is None else time.monotonic() + fault.duration
        with self._lock:
            armed = Armed(fault, fault.count, expires, self._generation)
            self._armed.append(armed)
        return armed

    def take(self, path: str) -> Armed | None:
        """The fault that applies to a request for `path`, used up by one if it has a count."""
        now = time.monotonic()
        with self._lock:
            self.seen += 1
            self._armed = [a for a in self._armed if not a.ended(now)]
            for armed in self._armed:
                if armed.fault.matches(path):
                    if armed.remaining is not None:
                        armed.remaining -= 1
                        if armed.remaining == 0:
                            self._armed.remove(armed)
                    self._applied[armed.fault.kind] += 1
                    return armed
        return None

    def release(self, armed: Armed) -> None:
        with self._lock:
            armed.released = True
            if armed in self._armed:
                self._armed.remove(armed)

    def release_all(self) -> None:
        with self._lock:
            self._generation += 1
            for armed in self._armed:
                armed.released = True
            self._armed.clear()

    def live(self, armed: Armed) -> bool:
        return not armed.ended(time.monotonic()) and armed.generation == self._generation

    def count_forwarded(self) -> None:
        with self._lock:
            self.forwarded += 1

    def count_outage(self) -> None:
        with self._lock:
            self._applied["down"] += 1

    def record(self, req: Request, outcome: str, status: int | None) -> None:
        req.logged = True
        with self._lock:
            self._log.append(RequestRecord(time.monotonic() - self.t0, req.path, outcome, status))

    @property
    def applied(self) -> Counter[str]:
        with self._lock:
            return Counter(self._applied)

    @property
    def log(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._log)
