"""The `spade` console script: the only place that wires components together."""

from __future__ import annotations

from pathlib import Path

import typer

from spade_async.config import ConfigError, load_config

app = typer.Typer(help="SPADE-async: self-play environment design on vLLM.", no_args_is_help=True)
endpoints_app = typer.Typer(help="Inference endpoints.", no_args_is_help=True)
app.add_typer(endpoints_app, name="endpoints")

DEFAULT_CONFIG = Path("configs/embedded.toml")


def _config(path: Path):
    try:
        return load_config(path)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command("config")
def show_config(config: Path = typer.Option(DEFAULT_CONFIG, "--config")) -> None:
    """Validate a config file and print the resolved tree as JSON."""
    typer.echo(_config(config).model_dump_json(indent=2))
