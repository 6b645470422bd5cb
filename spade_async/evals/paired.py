"""Paired comparisons: two evaluations of the same tasks (two policy versions, or two arms of an
experiment), matched task by task, as the mean per-task difference with a 95% interval.

On a fixed task list (the probe: the same variants, episode seeds and request seeds on every
version) the pairing takes out what the tasks share, so a change is measured against the
spread of the per-task changes, not against two independent intervals of the solve rate: at
200 episodes a rise of a tenth sits outside the paired interval where it would sit inside the
unpaired one. A task scored in only one of the two (not asked, or failed on the endpoint or in
the sandbox) is left out and named.

Plain functions over numbers and per-task records; `load_tasks` alone reads a file
(<data_dir>/eval/v<N>/<suite>.jsonl, written by `store_result`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spade_async.core.io import read_jsonl


def paired_difference(before: Sequence[float], after: Sequence[float], z: float = 1.96,
                      ) -> dict[str, Any]:
    """after - before over the same tasks, in the same order: the mean per-task difference
    with its 95% interval (with the default z; the normal approximation on the differences,
    clipped to [-1, 1]; [-1, 1] itself below two tasks: nothing is known of their spread), and
    how many tasks gained (after > before) and lost. Scores are in [0, 1]; bools count 0/1."""
    if len(before) != len(after) or not before:
        raise ValueError("paired results need the same, non-empty task list")
    d = [float(a) - float(b) for a, b in zip(after, before, strict=True)]
    n = len(d)
    mean = math.fsum(d) / n
    if n < 2:
        lo, hi = -1.0, 1.0
    else:
        sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1))
        half = z * sd / math.sqrt(n)
        lo, hi = max(-1.0, mean - half), min(1.0, mean + half)
    return {"n": n, "difference": round(mean, 4), "ci95": [round(lo, 4), round(hi, 4)],
            "gained": sum(x > 0 for x in d), "lost": sum(x < 0 for x in d)}


def load_tasks(data_dir: Path, suite: str, version: int) -> list[dict[str, Any]] | None:
    """The per-task results stored for `version` on `suite` (its last run), None if none."""
    path = data_dir / "eval" / f"v{version}" / f"{suite}.jsonl"
    return read_jsonl(path) if path.is_file() else None


def pair_tasks(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]], *,
               key: str = "score") -> dict[str, Any]:
    """The paired difference of `key` (after - before) over the tasks both scored, matched by
    task_id, in `before`'s order; with the means of both sides over those tasks and the tasks
    left out: scored in only one (`failed` in the other), or asked in only one. `n` is 0 and
    the difference None when no task pairs."""
    scored_b = {t["task_id"]: float(t.get(key) or 0.0) for t in before if not t.get("failed")}
    scored_a = {t["task_id"]: float(t.get(key) or 0.0) for t in after if not t.get("failed")}
    ids_b = [t["task_id"] for t in before]
    asked_b, asked_a = set(ids_b), {t["task_id"] for t in after}
    common = [i for i in ids_b if i in scored_b and i in scored_a]
    unpaired = {
        "only_before": [i for i in ids_b if i not in asked_a],
        "only_after": [t["task_id"] for t in after if t["task_id"] not in asked_b],
        "failed": [i for i in ids_b if i in asked_a and not (i in scored_b and i in scored_a)],
    }
    if not common:
        return {"n": 0, "difference": None, "ci95": None, "gained": 0, "lost": 0,
                "before_mean": None, "after_mean": None, "unpaired": unpaired}
    b, a = [scored_b[i] for i in common], [scored_a[i] for i in common]
    return {**paired_difference(b, a), "before_mean": round(math.fsum(b) / len(b), 4),
            "after_mean": round(math.fsum(a) / len(a), 4), "unpaired": unpaired}


def compare_stored(suite: str, before: tuple[Path, int], after: tuple[Path, int]
                   ) -> dict[str, Any] | None:
    """`pair_tasks` of two stored runs, each (data dir, version): the same run's versions, or
    two arms' data dirs. None when either has no per-task results stored."""
    b, a = load_tasks(before[0], suite, before[1]), load_tasks(after[0], suite, after[1])
    if b is None or a is None:
        return None
    return {"suite": suite, "before": before[1], "after": after[1], **pair_tasks(b, a)}


def first_to_last(data_dir: Path, evals: Sequence[dict[str, Any]], suite: str
                  ) -> dict[str, Any] | None:
    """The last evaluated version of `suite` against the first (results.jsonl rows `evals`,
    an external model's left out), paired on their stored tasks; None with fewer than two
    versions or without their per-task files."""
    versions = sorted({int(r.get("version", 0)) for r in evals
                       if r.get("suite") == suite and not r.get("external")})
    if len(versions) < 2:
        return None
    return compare_stored(suite, (data_dir, versions[0]), (data_dir, versions[-1]))


def verdict(p: dict[str, Any]) -> str:
    """Where the interval lies: above 0, below 0, or across it (within noise)."""
    if not p.get("n"):
        return "nothing paired"
    lo, hi = p["ci95"]
    return "above 0" if lo > 0 else "below 0" if hi < 0 else "within noise"


def paired_text(p: dict[str, Any]) -> str:
    """`+0.085 [+0.031, +0.139] (n=200, 31 gained, 14 lost; above 0)`."""
    if not p.get("n"):
        return "no task scored in both"
    lo, hi = p["ci95"]
    return (f"{p['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}] (n={p['n']}, {p['gained']} "
            f"gained, {p['lost']} lost; {verdict(p)})")


def unpaired_text(p: dict[str, Any], before: str, after: str, show: int = 5) -> str:
    """The tasks left out, by reason, each with its first `show` ids; "" when none."""
    parts = []
    for k, what in (("failed", f"not scored in {before} or {after}"),
                    ("only_before", f"only in {before}"), ("only_after", f"only in {after}")):
        ids = p["unpaired"][k]
        if ids:
            more = f", +{len(ids) - show} more" if len(ids) > show else ""
            parts.append(f"{len(ids)} {what} ({', '.join(ids[:show])}{more})")
    return "; ".join(parts)
