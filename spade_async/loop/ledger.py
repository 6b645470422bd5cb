"""Where every sample the loop plays ends up (DESIGN §8): each finished agent episode and each
design the endpoint answered is, exactly once, written to the spool or dropped for a named
reason. What is neither yet is in flight (its play or its document's group is not over).
Counted per role in status.json (`ledger`, what `spade status` shows) and in Prometheus
(spade_samples_played, spade_samples_dropped; written: spade_samples). It only counts: the
stages decide, and call it where they decide."""

from __future__ import annotations

from collections import Counter
from typing import Any

from spade_async.loop.metrics import Metrics

# Why a played sample never reached the spool, per role (the names status and report show).
DROP_REASONS: dict[str, dict[str, str]] = {
    "agent": {
        "failed": "the episode failed (endpoint, sandbox, deadline): it is no score",
        "no_tokens": "the episode sampled no trainable token (the chat path, or none at all)",
        "hinted": "a hinted episode: it estimates regret and is trained only with "
                  "regret.train_on_hinted",
        "zero_variance": "its group's scores do not vary (or it stood alone): no advantage",
        "stale": "more than daemon.max_staleness versions old when its batch was written",
        "write_failed": "its batch's spool write was given up",
    },
    "designer": {
        "failed": "its validation or memory write was given up: no reward",
        "unscored": "its environment's play was given up: no reward",
        "untrainable": "the server's choice constraint is not ours (an edit)",
        "frozen": "a frozen designer (another model): rewarded, never trained",
        "zero_variance": "its group's rewards do not vary: no advantage",
        "stale": "more than daemon.max_staleness versions old when its batch was written",
        "write_failed": "its batch's spool write was given up",
    },
}
ROLES = tuple(DROP_REASONS)


class SampleLedger:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self.played: Counter[str] = Counter()
        self.written: Counter[str] = Counter()
        self.dropped: dict[str, Counter[str]] = {role: Counter() for role in ROLES}

    def play(self, role: str, n: int = 1) -> None:
        """`n` samples of `role` came back from the endpoint (an episode ran to its end,
        failed or not; a design was answered)."""
        self.played[role] += n
        self._metrics.samples_played.labels(role).inc(n)

    def write(self, role: str, n: int) -> None:
        self.written[role] += n

    def drop(self, role: str, reason: str, n: int = 1) -> None:
        if reason not in DROP_REASONS[role]:
            raise ValueError(f"no drop reason '{reason}' for {role} samples "
                             f"(known: {', '.join(DROP_REASONS[role])})")
        if n <= 0:
            return
        self.dropped[role][reason] += n
        self._metrics.samples_dropped.labels(role, reason).inc(n)

    def in_flight(self, role: str) -> int:
        return self.played[role] - self.written[role] - sum(self.dropped[role].values())

    def as_dict(self) -> dict[str, Any]:
        """Per role: played = written + dropped (by reason) + in flight."""
        return {role: {"played": self.played[role], "written": self.written[role],
                       "dropped": dict(sorted(self.dropped[role].items())),
                       "in_flight": self.in_flight(role)} for role in ROLES}
