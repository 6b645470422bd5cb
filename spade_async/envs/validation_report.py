"""The validation report: one Check per step of the pipeline (passed, failed or skipped, with
its reason) and the verdict over all of them, as the memory stores it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from spade_async.envs.contract import EnvMeta

STATIC_CHECKS = ("static.size", "static.parse", "static.imports", "static.names",
                 "static.class", "static.params")
SANDBOXED_CHECKS = ("load", "determinism", "hint", "types", "not_exploitable", "hint_leak",
                    "solution")
MODEL_CHECKS = ("hint_reader",)  # not run (skipped) where no endpoint answers: no verdict
ALL_CHECKS = STATIC_CHECKS + SANDBOXED_CHECKS + MODEL_CHECKS


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool | None  # None: skipped
    reason: str = ""
    credit: float = 0.0  # a failed check's partial progress in [0, 1) (a syntax error's line)


@dataclass(frozen=True)
class ValidationReport:
    accepted: bool
    checks: tuple[Check, ...]
    meta: EnvMeta | None = None
    seconds: float = 0.0
    probe_scores: dict[str, float] = field(default_factory=dict)  # worst over seeds and points
    points: tuple[dict[str, Any], ...] = ()  # the knob settings the sandboxed checks ran at

    @property
    def progress(self) -> float:
        """Share of the whole pipeline's checks passed, plus a failed check's partial credit:
        the dense signal behind `regret.invalid_partial_credit`. The denominator is every check
        there is, so failing early always scores below failing late."""
        # a model check that did not run (no endpoint, or an earlier check failed) is no
        # verdict either way: it leaves the denominator
        unrun = sum(c.passed is None and c.name in MODEL_CHECKS for c in self.checks)
        passed = sum(c.passed is True for c in self.checks)
        credit = sum(c.credit for c in self.checks if c.passed is False)
        return min(1.0, (passed + credit) / (len(ALL_CHECKS) - unrun))

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.passed is False]

    @property
    def reason(self) -> str:
        """The first failure's reason: what the memory stores for a rejected environment."""
        f = self.failures
        return f"{f[0].name}: {f[0].reason}" if f else ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "reason": self.reason,
            "seconds": round(self.seconds, 4),
            "meta": None if self.meta is None else asdict(self.meta),
            "checks": [asdict(c) for c in self.checks],
            "probe_scores": self.probe_scores,
            "points": [dict(p) for p in self.points],
        }
