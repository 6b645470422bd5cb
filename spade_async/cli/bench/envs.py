"""`spade bench sandbox` and `ladder`: what an environment costs to start and step in the
sandbox, and how often the served policy solves the seed families at each rung."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import typer

from spade_async.cli.common import ConfigOpt, JsonOpt, config_or_exit, fail


def bench_sandbox(
    config: Path = ConfigOpt,
    runs: int = typer.Option(30, "--runs", min=3, help="starts of each kind"),
    steps: int = typer.Option(2000, "--steps", min=10, help="steps timed for the round trip"),
    as_json: bool = JsonOpt,
) -> None:
    """Environment cold start / bare interpreter started the same way, warm start, step RTT."""
    from spade_async.bench.sandbox import run_sandbox_bench
    from spade_async.sandbox.isolation import SandboxUnavailable

    cfg = config_or_exit(config)
    typer.echo(f"[bench] {runs} starts of each kind, {steps} steps ...", err=True)
    try:
        r = run_sandbox_bench(cfg.sandbox, runs=runs, steps=steps)
    except SandboxUnavailable as exc:
        raise fail(str(exc), 2) from None
    if as_json:
        typer.echo(json.dumps(r, indent=2))
        return
    on = [k for k, v in r["layers"].items() if v]
    off = [k for k, v in r["layers"].items() if not v]
    typer.echo(f"isolation: {r['isolation']}; layers on: {', '.join(on)}"
               + (f"; off: {', '.join(off)}" if off else ""))
    for label, key in [("bare python3 -I -S, sandboxed", "bare_python_sandboxed"),
                       ("bare python3 -I -S, no sandbox", "bare_python_unsandboxed"),
                       ("environment cold start", "cold_start"),
                       ("environment warm start (pool)", "warm_start")]:
        m = r[key]
        typer.echo(f"{label:32s} median {m['median_ms']:7.2f} ms   p90 {m['p90_ms']:7.2f} ms")
    typer.echo(f"cold start / bare (same way):    {r['cold_over_bare']:.2f}x")
    s = r["step_roundtrip_us"]
    typer.echo(f"step round trip:                 median {s['median']:.0f} us   p90 {s['p90']:.0f} us")


def bench_ladder(
    config: Path = ConfigOpt,
    family: list[str] = typer.Option(None, "--family", help="seed family (repeatable; default: "
                                     "all 18)"),
    rung: list[str] = typer.Option(None, "--rung", help="easiest, middle or default "
                                   "(repeatable; default: easiest and middle)"),
    episodes: int = typer.Option(24, "--episodes", min=1, help="unhinted episodes per rung"),
    hinted: int = typer.Option(None, "--hinted", min=0, help="hinted episodes per rung "
                               "(default: half of --episodes)"),
    temperature: list[float] = typer.Option(None, "--temperature", help="sampling temperature "
                                            "(repeatable, measured side by side; default: "
                                            "rollout.temperature)"),
    model: str = typer.Option(None, "--model", help="served model name (default: the config's; "
                              "policy-vN for a published LoRA version)"),
    concurrency: int = typer.Option(16, "--concurrency", min=1),
    as_json: bool = JsonOpt,
) -> None:
    """Solve rates of the served policy on seed families at knob settings (rungs), unhinted and
    hinted, with Wilson 95% intervals: the daemon's own episode path and sandbox, against the
    config's endpoints (start them first, e.g. scripts/inference.sh)."""
    from spade_async.bench.ladder import default_rungs, measure_rungs
    from spade_async.core.config import checkpoint_dir
    from spade_async.inference.chat_tokens import ChatTokens
    from spade_async.inference.errors import EndpointError
    from spade_async.inference.pool import EndpointPool
    from spade_async.sandbox.isolation import SandboxUnavailable
    from spade_async.sandbox.runtime import Sandbox

    cfg = config_or_exit(config)
    try:
        rungs = default_rungs(family or None, labels=rung or ("easiest", "middle"))
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    temps = list(temperature or [cfg.rollout.temperature])
    if any(t < 0 for t in temps):
        raise fail("--temperature must be >= 0", 2)
    tokenizer = cfg.model.tokenizer or checkpoint_dir(cfg)
    n_hinted = episodes // 2 if hinted is None else hinted
    typer.echo(f"[bench] {len(rungs)} rungs x {len(temps)} temperatures, {episodes} unhinted + "
               f"{n_hinted} hinted episodes each ...", err=True)

    async def main():
        chat = await anyio.to_thread.run_sync(ChatTokens.from_pretrained, tokenizer)
        rows = []
        async with EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb:
            for t in temps:
                rows += await measure_rungs(
                    cfg, pool, chat, sb, rungs, episodes, hinted=n_hinted,
                    concurrency=concurrency, model=model, temperature=t,
                    progress=lambda m, t=t: typer.echo(f"[bench] T={t}: {m}", err=True))
        return rows

    try:
        rows = anyio.run(main)
    except EndpointError as exc:
        raise fail(str(exc)) from None
    except SandboxUnavailable as exc:
        raise fail(str(exc), 2) from None
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return

    def rate(s: dict) -> str:
        if s["rate"] is None:
            return f"{'-':>5}  n=0"
        return f"{s['rate']:5.2f} [{s['ci95'][0]:.2f},{s['ci95'][1]:.2f}] n={s['n']}"

    typer.echo(f"{'family':20s} {'rung':8s} {'T':>4s}  {'unhinted (95% CI)':26s} "
               f"{'hinted (95% CI)':26s} hinted-unhinted")
    for r in rows:
        u, h = r["unhinted"], r["hinted"]
        gap = (f"{h['rate'] - u['rate']:+.2f}" if u["rate"] is not None
               and h["rate"] is not None else "-")
        typer.echo(f"{r['family']:20s} {r['label']:8s} {r['temperature']:4.2f}  {rate(u):26s} "
                   f"{rate(h):26s} {gap}")


def bench_validation(
    files: list[Path] = typer.Argument(None, help="environment modules (default: the 18 seeds)"),
    config: Path = ConfigOpt,
    reps: int = typer.Option(3, "--reps", min=1, help="validations per arm, the best one kept"),
    model_check: bool = typer.Option(True, "--model-check/--no-model-check",
                                     help="also time the model check of the hint, where an "
                                     "agent endpoint of the config answers"),
    as_json: bool = JsonOpt,
) -> None:
    """Validation seconds per environment, side by side: `before` (no observation echoes, no
    decoded hint answers), `rules` (the default checks), `model` (and the model check of the
    hint, on the config's agent endpoints); median and mean per arm, and their ratio to before."""
    from spade_async.bench.validation import run_validation_bench, seed_files
    from spade_async.cli.env import hint_reader_for
    from spade_async.sandbox.isolation import SandboxUnavailable

    cfg = config_or_exit(config)
    paths = list(files) if files else seed_files()
    if missing := [p for p in paths if not p.is_file()]:
        raise fail(f"no environment file {missing[0]}", 2)

    def progress(msg: str) -> None:
        typer.echo(f"[bench] {msg}", err=True)

    async def main():
        async with hint_reader_for(cfg, model_check) as (reader, why):
            return await run_validation_bench(cfg, paths, reps=reps, reader=reader,
                                              no_reader=why, progress=progress)

    try:
        r = anyio.run(main)
    except SandboxUnavailable as exc:
        raise fail(str(exc), 2) from None
    if as_json:
        typer.echo(json.dumps(r, indent=2))
        return
    typer.echo(f"{r['files']} environments, best of {r['reps']}; model check: {r['model_check']}")
    for arm, a in r["arms"].items():
        typer.echo(f"{arm:7s} median {a['median_s']:.3f} s ({a['median_ratio']:.2f}x before), "
                   f"mean {a['mean_s']:.3f} s ({a['mean_ratio']:.2f}x), max {a['max_s']:.3f} s, "
                   f"{len(a['rejected'])} rejected")
        for name, reason in a["rejected"].items():
            typer.echo(f"        {name}: {reason[:160]}")
