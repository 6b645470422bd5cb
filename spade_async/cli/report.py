"""`spade report`: a run's plots written to disk, and its summary on the terminal."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from spade_async.cli.common import ConfigOpt, JsonOpt, config_or_exit


def make_report(
    config: Path = ConfigOpt,
    out: Path = typer.Option(None, "--out", help="directory for the PNGs and index.html "
                             "(default <data_dir>/report)"),
    as_json: bool = JsonOpt,
) -> None:
    """Plots of a run (live or finished): regret and solve rates, acceptance and rejection
    reasons, memory diversity, the embedding map, trainer loss and log-prob mismatch, the
    trainer's drift from the base model, throughput and padding, held-out scores, designer
    moves, the curriculum the edits set per family, the probe's solve rate per version
    (sampled and greedy) and its last version against its first, paired task by task; PNG
    files plus one HTML page that holds them."""
    from spade_async.report.curriculum import (
        CURRICULUM_HEAD,
        curriculum_cells,
        moves_text,
        probe_paired_text,
        probe_text,
    )
    from spade_async.report.frontier import frontier_text
    from spade_async.report.training import ledger_text, training_text
    from spade_async.report.write import write_report

    cfg = config_or_exit(config)
    out = out or cfg.paths.data_dir / "report"
    s = write_report(cfg, out, progress=lambda m: typer.echo(f"[report] {m}", err=True))
    if as_json:
        typer.echo(json.dumps(s, indent=2))
        return
    typer.echo(f"{s['designs']} designs ({s['accepted']} accepted), {s['episodes']} episodes, "
               f"{s['trainer_steps']} trainer steps, versions {s['versions_published']}")
    typer.echo(f"training: {training_text(s['training'])}")
    typer.echo(f"samples: {ledger_text(s['training']['ledger'])}")
    typer.echo(f"moves: {moves_text(s['moves'])}")
    typer.echo(f"frontier: {frontier_text(s['frontier'])}")
    if s["curriculum"]:
        rows = [CURRICULUM_HEAD, *(curriculum_cells(r) for r in s["curriculum"])]
        widths = [max(len(r[i]) for r in rows) for i in range(len(CURRICULUM_HEAD))]
        typer.echo("curriculum:")
        for r in rows:
            typer.echo("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
                       .rstrip())
    if s["probe"]:
        typer.echo("probe: " + "; ".join(probe_text(r) for r in s["probe"]))
    if s["probe_greedy"]:
        typer.echo("probe-greedy: " + "; ".join(probe_text(r) for r in s["probe_greedy"]))
    for suite, p in s["probe_paired"].items():
        typer.echo(f"paired: {probe_paired_text(suite, p)}")
    typer.echo(f"report: {out / 'index.html'}")
