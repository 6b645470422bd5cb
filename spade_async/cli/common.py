"""What every `spade` command shares: the --config and --json options, loading the config, and
ending a command with one line on stderr (`error: ...`) and an exit code."""

from __future__ import annotations

from pathlib import Path

import typer

from spade_async.core.config import ConfigError, SpadeConfig
from spade_async.envs.seed_checks import load_checked_config

DEFAULT_CONFIG = Path("configs/embedded.toml")
ConfigOpt = typer.Option(DEFAULT_CONFIG, "--config", "-c", help="TOML config file")
JsonOpt = typer.Option(False, "--json", help="machine-readable output")


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `error: message` to stderr and return the exit for the caller to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def config_or_exit(path: Path) -> SpadeConfig:
    """The config at `path`; one that does not load ends the command (exit 2)."""
    try:
        return load_checked_config(path)
    except ConfigError as exc:
        raise fail(str(exc), 2) from None


def check_endpoint_secrets(cfg: SpadeConfig) -> None:
    """Every endpoint's api_key_env is set (ConfigError, exit 2, names the variable)."""
    try:
        for e in cfg.endpoints:
            e.request_headers()
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
