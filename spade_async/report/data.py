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
    episodes: list[dict] = field(default_factory=list)
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


# An episode's transcript: what the report never plots, left out as the file streams, so that
# a run of any age reports in bounded memory (a few hundred bytes an episode).
EPISODE_BULK = ("turns", "first_observation", "hint", "hint_copy", "chat_completion_tokens")


def slim_episodes(path: Path) -> list[dict]:
    """episodes.jsonl and its rolled segments, streamed, each record without its transcript."""
    out = []
    for e in iter_jsonl(path):
        if "time" in e:
            for k in EPISODE_BULK:
                e.pop(k, None)
            out.append(e)
    return out


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
