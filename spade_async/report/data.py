"""A run's records, read from what the processes already write, so it works on a live run or a
finished one:
  <data_dir>/run/designs.jsonl     one line per design: time, status, rejection reason, version
  <data_dir>/run/episodes.jsonl    one line per episode: time, hinted, score, version
  <data_dir>/run/plays.jsonl       one line per played environment: regret, hinted/unhinted means
  the memory (LanceDB)             every stored environment, its embedding and regret stats
  <trainer root>/metrics.jsonl     one line per trainer step: loss, log-prob mismatch, version
  <data_dir>/eval/results.jsonl    evaluation scores per policy version (`spade eval`): the
                                   held-out suites, and the probe's solve rate on fixed training
                                   variants (with its 95% Wilson interval)
  <data_dir>/eval/v<N>/<suite>.jsonl  per-task results: the probe suites' first and last
                                   versions, paired task by task
The designer's moves (write / edit, DESIGN §12) and the curriculum its edits set per family come
from the `move`, `family`/`name`, `params` and `variant_id` fields of designs.jsonl and
plays.jsonl (the numbers: curriculum.py); records written before those fields existed count as
writes (or replays).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from spade_async.core.config import SpadeConfig, run_dir
from spade_async.core.io import read_jsonl
from spade_async.core.rolling import iter_jsonl


class Episodes:
    """The run's episodes as the report reads them, without their transcripts: one column per
    field the plots, the summary and the cost ledger use, filled as the records stream by
    (`array` while reading, numpy views after), so a run of millions of episodes reports in
    bounded memory: 44 bytes an episode, where a dict per episode cost ~1 kB and a slotted
    object ~300 bytes. A failed episode (an endpoint or sandbox error: it never scored) keeps
    its error kind, as a code into `kinds`."""

    _COLUMNS = (("time", "d"), ("hinted", "b"), ("score", "f"), ("failed", "b"),
                ("kind", "h"), ("policy_version", "l"), ("seconds", "f"),
                ("sampled_tokens", "l"), ("prompt_len", "l"))

    def __init__(self, records: Iterable[dict] = ()) -> None:
        cols = {name: array(code) for name, code in self._COLUMNS}
        self.kinds: list[str] = []
        codes: dict[str, int] = {}
        for rec in records:
            if "time" not in rec:
                continue
            failed = bool(rec.get("error"))
            kind = -1
            if failed:
                name = rec.get("error_kind") or "unknown"
                if (kind := codes.get(name, -1)) < 0:
                    kind = codes[name] = len(self.kinds)
                    self.kinds.append(name)
            cols["time"].append(float(rec["time"]))
            cols["hinted"].append(bool(rec.get("hinted")))
            score = rec.get("score")
            cols["score"].append(float("nan") if score is None else float(score))
            cols["failed"].append(failed)
            cols["kind"].append(kind)
            cols["policy_version"].append(int(rec.get("policy_version") or 0))
            cols["seconds"].append(float(rec.get("seconds") or 0.0))
            cols["sampled_tokens"].append(int(rec.get("sampled_tokens") or 0))
            cols["prompt_len"].append(int(rec.get("prompt_len") or 0))
        for name, code in self._COLUMNS:
            dtype = bool if name in ("hinted", "failed") else np.dtype(code)
            setattr(self, name, np.frombuffer(cols[name], dtype=np.dtype(code)).astype(dtype)
                    if cols[name] else np.zeros(0, dtype=dtype))

    def __len__(self) -> int:
        return len(self.time)

    def __bool__(self) -> bool:
        return len(self) > 0

    def failures(self) -> dict[str, int]:
        """Failed episodes by error kind."""
        if not self.kinds:
            return {}
        n = np.bincount(self.kind[self.failed], minlength=len(self.kinds))
        return {k: int(c) for k, c in zip(self.kinds, n, strict=True) if c}

    def total(self, column: str) -> float:
        return float(getattr(self, column).sum(dtype=np.float64)) if len(self) else 0.0


def slim_episodes(path: Path) -> Episodes:
    """episodes.jsonl and its rolled segments, streamed into columns."""
    return Episodes(iter_jsonl(path))


@dataclass
class RunData:
    designs: list[dict] = field(default_factory=list)
    episodes: Episodes = field(default_factory=Episodes)
    plays: list[dict] = field(default_factory=list)
    envs: list[dict] = field(default_factory=list)  # memory export, with embeddings
    steps: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    # per probe suite, its last evaluated version against its first, paired task by task on
    # the stored per-task results (evals/paired.py); a suite with fewer than two is left out
    probe_paired: dict[str, dict] = field(default_factory=dict)
    memory_error: str | None = None

    @property
    def t0(self) -> float:
        times = [float(r["time"]) for src in (self.designs, self.plays, self.steps)
                 for r in src if "time" in r]
        if len(self.episodes):
            times.append(float(self.episodes.time.min()))
        return min(times) if times else 0.0

    @property
    def t_last(self) -> float | None:
        """The last record's time (None before any)."""
        times = [float(r["time"]) for src in (self.designs, self.steps) for r in src
                 if "time" in r]
        if len(self.episodes):
            times.append(float(self.episodes.time.max()))
        return max(times) if times else None


def load_run(cfg: SpadeConfig) -> RunData:
    from spade_async.core.config.eval import PROBE_SUITES
    from spade_async.core.config.trainer import trainer_root
    from spade_async.evals.base import load_results
    from spade_async.evals.paired import first_to_last

    rdir = run_dir(cfg)
    data = RunData(designs=read_jsonl(rdir / "designs.jsonl"),
                   episodes=slim_episodes(rdir / "episodes.jsonl"),
                   plays=read_jsonl(rdir / "plays.jsonl"),
                   steps=[s for s in read_jsonl(trainer_root(cfg, cfg.trainer) / "metrics.jsonl")
                          if s.get("event") == "step"],
                   # the policy's versions; an external model's scores (spade eval --model)
                   # are no point on its curve
                   evals=[r for r in load_results(cfg.paths.data_dir) if not r.get("external")])
    for suite in PROBE_SUITES:
        if (p := first_to_last(cfg.paths.data_dir, data.evals, suite)) is not None:
            data.probe_paired[suite] = p
    try:
        data.envs = _memory_rows(cfg)
    except Exception as exc:  # a report without the memory is still a report
        data.memory_error = f"{type(exc).__name__}: {exc}"
    return data


def _memory_rows(cfg: SpadeConfig) -> list[dict]:
    import anyio

    from memory_db.store import EnvMemory
    from spade_async.core.config import memory_config

    mcfg, uri = memory_config(cfg)
    if "://" not in uri and not Path(uri).is_dir():
        return []

    async def main() -> list[dict]:
        mem = EnvMemory(mcfg, uri, writable=False)
        await mem.open()
        return [r async for r in mem.export(code=False, embeddings=True)]

    return anyio.run(main)


def design_outcome(design: dict) -> str:
    """A design's outcome: "accepted", or the reason it was rejected."""
    if design.get("status") == "accepted":
        return "accepted"
    return design.get("reason") or design.get("status") or "rejected"
