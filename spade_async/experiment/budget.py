"""An arm's budget (versions=N, minutes=M or tokens=T) and how far the arm has got, read from
the files its processes write: the published version (weights/current.json), the tokens its
designer and agent sampled (run/designs.jsonl, run/episodes.jsonl, read incrementally), the
versions evaluated (eval/results.jsonl) and the wall time its loop has run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from spade_async.core.policy import read_current
from spade_async.core.rolling import JsonlTail


@dataclass
class Progress:
    version: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    designs: int = 0
    accepted: int = 0
    episodes: int = 0
    evaluated: set[int] = field(default_factory=set)


class ArmProgress:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._designs = JsonlTail(data_dir / "run" / "designs.jsonl")
        self._episodes = JsonlTail(data_dir / "run" / "episodes.jsonl")
        self._evals = JsonlTail(data_dir / "eval" / "results.jsonl")
        self.now = Progress()

    def read(self, elapsed_s: float) -> Progress:
        p = self.now
        for d in self._designs.lines():
            p.designs += 1
            p.accepted += d.get("status") == "accepted"
            p.tokens += int(d.get("completion_tokens") or 0)
        for e in self._episodes.lines():
            p.episodes += 1
            p.tokens += int(e.get("sampled_tokens") or 0)
        for r in self._evals.lines():
            if not r.get("external"):
                p.evaluated.add(int(r.get("version", -1)))
        current = read_current(self.data_dir) or {}
        p.version = int(current.get("version") or 0)
        p.elapsed_s = elapsed_s
        return p


def spent(kind: str, amount: float, p: Progress) -> bool:
    """Whether the arm has used its budget."""
    if kind == "versions":
        return p.version >= amount
    if kind == "minutes":
        return p.elapsed_s >= amount * 60
    return p.tokens >= amount


def describe(kind: str, amount: float, p: Progress) -> str:
    if kind == "versions":
        return f"v{p.version} of {amount:g}"
    if kind == "minutes":
        return f"{p.elapsed_s / 60:.1f} of {amount:g} min"
    return f"{p.tokens} of {amount:g} tokens"
