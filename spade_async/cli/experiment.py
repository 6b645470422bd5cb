"""`spade experiment run` / `report`: arms from the same base, on the same budget, side by side
(spade_async.experiment)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from spade_async.cli.common import ConfigOpt, JsonOpt, config_or_exit, fail

experiment_app = typer.Typer(help="Experiments: SPADE against the fixed-environment baseline "
                             "(and variants), side by side.", no_args_is_help=True)


def _experiment_config(config: Path, arms: str | None, budget: str | None, name: str | None):
    """The config with --arms / --budget / --name laid over [experiment] (checked again)."""
    from spade_async.core.config import ConfigError

    cfg = config_or_exit(config)
    over = {k: v for k, v in (("arms", [a.strip() for a in arms.split(",") if a.strip()]
                                       if arms else None),
                              ("budget", budget), ("name", name)) if v}
    if not over:
        return cfg
    try:
        exp = type(cfg.experiment).model_validate({**cfg.experiment.model_dump(), **over})
    except ValueError as exc:
        msg = str(exc).splitlines()
        raise fail(f"{msg[-1].strip() if msg else exc}", 2) from None
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    return cfg.model_copy(update={"experiment": exp})


@experiment_app.command("run")
def experiment_run(
    config: Path = ConfigOpt,
    arms: str = typer.Option(None, "--arms", help="comma-separated arms (default: "
                             "experiment.arms): spade, fixed, or arm_overrides names"),
    budget: str = typer.Option(None, "--budget", help="versions=N, minutes=M or tokens=T "
                               "per arm (default: experiment.budget)"),
    name: str = typer.Option(None, "--name", help="the experiment's name (its directory)"),
) -> None:
    """Run each arm's stack (inference, daemon, trainer) one after another from the same base
    checkpoint, seed environments and eval seed until it has spent its budget, evaluating the
    held-out suites at v0, every experiment.eval_every_versions, and the last version.
    Resumable: run it again after a crash or Ctrl-C and it goes on where it stopped."""
    from spade_async.core.config import ConfigError
    from spade_async.experiment.runner import ArmFailed, Runner
    from spade_async.experiment.state import ExperimentMismatch

    cfg = _experiment_config(config, arms, budget, name)
    try:
        runner = Runner(cfg, config, echo=lambda m: typer.echo(m, err=True))
        runner.run()
    except (ExperimentMismatch, ConfigError) as exc:
        raise fail(str(exc), 2) from None
    except ArmFailed as exc:
        raise fail(str(exc), 1) from None
    except KeyboardInterrupt:
        raise fail("interrupted: the arm's stack was stopped; run again to resume", 130) from None


@experiment_app.command("report")
def experiment_report(
    config: Path = ConfigOpt,
    name: str = typer.Option(None, "--name", help="the experiment's name (its directory)"),
    as_json: bool = JsonOpt,
) -> None:
    """The arms side by side: per suite the strict and lenient scores with 95% intervals per
    version, the difference at the last common version, the paired differences task by task
    (each arm's last version against its first; arm against arm at their last versions), the
    diversity of what each arm played and accepted over time, and the cost ledger; PNGs,
    index.html and summary.json in <experiment>/report/."""
    from spade_async.experiment import report
    from spade_async.experiment.layout import experiment_dir
    from spade_async.experiment.state import STATE_FILE

    cfg = _experiment_config(config, None, None, name)
    exp = experiment_dir(cfg)
    if not (exp / STATE_FILE).exists():
        raise fail(f"no experiment at {exp}: run `spade experiment run --config {config}` first",
                   2)
    rep = report.collect(exp)
    out = report.write(exp, rep)
    if as_json:
        typer.echo(json.dumps(rep, indent=1))
        return
    typer.echo(report.text(rep))
    typer.echo(f"\nplots and tables: {out / 'index.html'}")
