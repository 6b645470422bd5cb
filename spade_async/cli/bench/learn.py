"""`spade bench learn`: the fixed loop on one family's easiest rung for N minutes, and whether
the policy got better (probe before/after with the loop stopped, teacher-forced log-probs,
the solve rate over time)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from spade_async.cli.common import JsonOpt, fail

LearnConfigOpt = typer.Option(Path("configs/learn.toml"), "--config", "-c",
                              help="the config the bench lays its tables over")


def bench_learn(
    config: Path = LearnConfigOpt,
    family: str = typer.Option("arithmetic", "--family", help="the seed family played (at "
                               "its easiest point)"),
    minutes: float = typer.Option(30.0, "--minutes", min=0.5, help="how long the loop runs"),
    probe_seeds: int = typer.Option(200, "--probe-seeds", min=10, help="probe episodes per "
                                    "version and temperature"),
    name: str = typer.Option(None, "--name", help="the run's directory name under "
                             "<data_dir>/bench/learn (default: a timestamp)"),
    overrides: list[str] = typer.Option(None, "--set", help="KEY=VALUE laid over the "
                                        "config, a TOML value (repeatable): trainer.lr=1e-3, "
                                        "endpoints.0.weight_swap.type=\"vllm-reload\""),
    base_url: str = typer.Option(None, "--base-url", help="use this running vLLM (serving the "
                                 "config's model with its weight-swap backend) instead of "
                                 "starting one"),
    as_json: bool = JsonOpt,
) -> None:
    """Does the optimiser learn? Probe (sampled and greedy) before and after with a paired
    95% interval, teacher-forced log p of the base model's right and wrong replies, the loop's
    solve rate over time, and the trainer's throughput."""
    from spade_async.bench.learn import LearnBenchError, run_learn_bench
    from spade_async.core.config import ConfigError
    from spade_async.inference.launch import LaunchError

    try:
        r = run_learn_bench(config, family=family, minutes=minutes, probe_seeds=probe_seeds,
                            name=name, overrides=overrides or (), base_url=base_url,
                            progress=lambda m: typer.echo(f"[learn] {m}", err=True))
    except (ConfigError, ValueError) as exc:
        raise fail(str(exc), 2) from None
    except (LearnBenchError, LaunchError) as exc:
        raise fail(str(exc)) from None
    if as_json:
        typer.echo(json.dumps(r, indent=2))
        return
    typer.echo(f"{r['family']} at {json.dumps(r['params'])}, {r['loop_s'] / 60:.1f} minutes "
               f"of the loop, v0 -> v{r['version']} ({r['dir']})")
    for label, p in r["probe"].items():
        b, a, d = p["before"], p["after"], p["paired"] or {}
        typer.echo(f"probe {label:7s} (T={p['temperature']}): {b['rate']} {b['ci95']} -> "
                   f"{a['rate']} {a['ci95']}; paired {d.get('difference')} "
                   f"{d.get('ci95')} ({d.get('gained')} gained, {d.get('lost')} lost, "
                   f"n={d.get('n')})")
    tf = r["teacher_forced"]
    typer.echo(f"teacher-forced mean log p per token of v0's replies: solved "
               f"{tf['before']['solved']} -> {tf['after']['solved']} "
               f"({tf['solved_change']:+}), unsolved {tf['before']['unsolved']} -> "
               f"{tf['after']['unsolved']} ({tf['unsolved_change']:+})"
               if tf["solved_change"] is not None and tf["unsolved_change"] is not None else
               f"teacher-forced: {json.dumps(tf)}")
    curve = ", ".join(f"{c['minutes'][0]:g}-{c['minutes'][1]:g} min {c['rate']} (n={c['n']})"
                      for c in r["solve_rate_over_time"])
    typer.echo(f"loop's unhinted solve rate: {curve or 'no plays'}")
    t = r["trainer"]
    typer.echo(f"trainer: {t['steps']} steps ({t['steps_per_hour']} per hour), "
               f"{t['samples_per_step']} samples/step, {t['tokens_per_s']} tok/s trained "
               f"({t['seq_tokens_per_s']} of sequence), padded/real {t['padding_ratio']}, "
               f"KL to base {t['kl_base']}")
