"""Held-out scores of one arm, per suite and version, read from its eval/results.jsonl: strict
and lenient, each with its 95% interval and task counts, on two clocks (the policy version and
the minutes since the arm's loop first ran). A version evaluated twice keeps its last run."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spade_async.core.io import read_jsonl


@dataclass
class Point:
    suite: str
    version: int
    minutes: float | None  # since the arm's loop first ran
    n: int
    scored: int
    strict: float
    strict_ci: list[float]
    lenient: float
    lenient_ci: list[float]
    passed: float
    lenient_passed: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def arm_points(data_dir: Path, first_started: float | None) -> dict[str, list[Point]]:
    """suite -> its points, by version."""
    by_key: dict[tuple[str, int], dict] = {}
    for r in read_jsonl(data_dir / "eval" / "results.jsonl"):
        if r.get("external") or "suite" not in r:
            continue
        by_key[(r["suite"], int(r.get("version", 0)))] = r
    out: dict[str, list[Point]] = {}
    for (suite, version), r in sorted(by_key.items()):
        strict = float(r.get("score", 0.0))
        minutes = ((float(r["time"]) - first_started) / 60
                   if first_started and r.get("time") else None)
        out.setdefault(suite, []).append(Point(
            suite=suite, version=version, minutes=minutes, n=int(r.get("n", 0)),
            scored=int(r.get("scored", r.get("n", 0))), strict=strict,
            strict_ci=list(r.get("score_ci95") or [0.0, 1.0]),
            lenient=float(r.get("lenient_score", strict)),
            lenient_ci=list(r.get("lenient_score_ci95") or r.get("score_ci95") or [0.0, 1.0]),
            passed=float(r.get("passed", 0.0)),
            lenient_passed=float(r.get("lenient_passed", r.get("passed", 0.0)))))
    return out


def difference(a: Point, b: Point, lenient: bool = False) -> tuple[float, float, float]:
    """a - b of the mean score, with a 95% interval from the two intervals' half-widths
    (independent arms: the half-widths add in quadrature)."""
    (ma, ca), (mb, cb) = ((a.lenient, a.lenient_ci), (b.lenient, b.lenient_ci)) if lenient \
        else ((a.strict, a.strict_ci), (b.strict, b.strict_ci))
    half = math.hypot((ca[1] - ca[0]) / 2, (cb[1] - cb[0]) / 2)
    d = ma - mb
    return d, d - half, d + half
