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

from dataclasses import dataclass, field
from pathlib import Path

from spade_async.core.config import SpadeConfig, run_dir
from spade_async.core.io import read_jsonl
from spade_async.core.rolling import iter_jsonl


@dataclass
class RunData:
    designs: list[dict] = field(default_factory=list)
    episodes: list[EpisodeRow] = field(default_factory=list)
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
        times = [float(r["time"]) for src in (self.designs, self.episodes, self.plays, self.steps)
                 for r in src if "time" in r]
        return min(times) if times else 0.0


class EpisodeRow:
    """One episode as the report reads it, without its transcript: the fields the plots, the
    summary and the cost ledger use, in slots (a run of millions of episodes reports in
    bounded memory: ~150 bytes an episode). Reads like the record's dict: `row["time"]`,
    `row.get("score", 0.0)`."""

    __slots__ = ("time", "hinted", "score", "error", "error_kind", "policy_version",
                 "seconds", "sampled_tokens")

    def __init__(self, rec: dict) -> None:
        for k in self.__slots__:
            setattr(self, k, rec.get(k))
        if isinstance(self.error, str):
            self.error = self.error[:120]

    def get(self, key: str, default: object = None) -> object:
        value = getattr(self, key, None) if key in self.__slots__ else None
        return default if value is None else value

    def __getitem__(self, key: str) -> object:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None


def slim_episodes(path: Path) -> list[EpisodeRow]:
    """episodes.jsonl and its rolled segments, streamed, each as an EpisodeRow."""
    return [EpisodeRow(e) for e in iter_jsonl(path) if "time" in e]


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
