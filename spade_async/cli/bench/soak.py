"""`spade bench soak`: the daemon and trainer against a fast fake endpoint for a long time, and
whether disk, RSS and latencies level off (issue 32's acceptance)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from spade_async.cli.common import ConfigOpt, JsonOpt, config_or_exit


def bench_soak(
    config: Path = ConfigOpt,
    episodes: int = typer.Option(200_000, "--episodes", min=1, help="run until this many "
                                 "episodes (and the designs and steps below)"),
    designs: int = typer.Option(50_000, "--designs", min=0),
    steps: int = typer.Option(2_000, "--steps", min=0, help="trainer steps (published versions)"),
    minutes: float = typer.Option(0.0, "--minutes", min=0.0, help="stop after this long "
                                  "whatever was reached (0: no cap)"),
    sample_s: float = typer.Option(30.0, "--sample-s", min=0.5, help="seconds between samples"),
    segment_mb: float = typer.Option(0.25, "--segment-mb", min=0.001, help="the soak's "
                                     "retention.segment_mb (small, so records roll)"),
    keep_mb: float = typer.Option(1.0, "--keep-mb", min=0.0, help="the soak's "
                                  "retention.keep_mb (small, so rolled segments are pruned)"),
    concurrency: int = typer.Option(16, "--concurrency", min=1, help="the fake endpoint's "
                                    "max_concurrency"),
    name: str = typer.Option("", "--name", help="results under <data_dir>/bench/soak/<name> "
                             "(default: the UTC time)"),
    keep: bool = typer.Option(False, "--keep/--no-keep", help="keep the soak's data dir"),
    as_json: bool = JsonOpt,
) -> None:
    """Daemon + trainer (tiny checkpoint) against a ~0-latency fake endpoint: disk by
    directory, RSS per process, memory-op p50/p99 and status-tick time over the run; the
    level-off and drift verdicts and a week of the embedded default extrapolated."""
    from spade_async.bench.soak import render, run_soak
    from spade_async.core.config import checkpoint_dir

    cfg = config_or_exit(config)
    tokenizer = (cfg.model.tokenizer or checkpoint_dir(cfg)).resolve()
    out = (cfg.paths.data_dir / "bench" / "soak" /
           (name or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))).resolve()
    r = run_soak(tokenizer, out, episodes=episodes, designs=designs, steps=steps,
                 minutes=minutes, sample_s=sample_s, segment_mb=segment_mb, keep_mb=keep_mb,
                 concurrency=concurrency, keep=keep, progress=lambda m: typer.echo(f"[soak] {m}", err=True))
    if as_json:
        typer.echo(json.dumps({k: v for k, v in r.items() if k != "series"}, indent=2))
        return
    typer.echo(render(r))
    typer.echo(f"series and verdicts: {out / 'soak.json'}")
