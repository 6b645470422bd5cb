"""`spade bench trainer`: train-step throughput against plain HF, and step end -> served."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from spade_async.cli.common import ConfigOpt, JsonOpt, config_or_exit, fail


def bench_trainer(
    config: Path = ConfigOpt,
    base_url: str = typer.Option(None, "--base-url", help="publish into this running vLLM "
                                 "(it gets the base weights back at the end) instead of "
                                 "starting one"),
    samples: int = typer.Option(16, "--samples", min=1, help="samples in the batch"),
    min_len: int = typer.Option(128, "--min-len", min=4, help="shortest sample, tokens"),
    max_len: int = typer.Option(384, "--max-len", min=5, help="longest sample, tokens"),
    steps: int = typer.Option(3, "--steps", min=1, help="timed steps of each path"),
    publishes: int = typer.Option(3, "--publishes", min=1, help="publishes of each kind"),
    publish: bool = typer.Option(True, "--publish/--no-publish",
                                 help="also time step end -> every endpoint serving"),
    as_json: bool = JsonOpt,
) -> None:
    """Train-step tokens/s, ours vs plain HF on the same batch; step end -> served latency."""
    from spade_async.bench.trainer import run_trainer_bench
    from spade_async.core.config import checkpoint_dir
    from spade_async.inference.launch import LaunchError
    from trainer.publish import PublishError

    cfg = config_or_exit(config)
    if max_len <= min_len:
        raise fail(f"--max-len ({max_len}) must exceed --min-len ({min_len})", 2)
    try:
        r = run_trainer_bench(cfg, checkpoint_dir(cfg).resolve(), base_url=base_url,
                              samples=samples, length=(min_len, max_len), steps=steps,
                              publishes=publishes, publish=publish,
                              progress=lambda m: typer.echo(f"[bench] {m}", err=True))
    except (FileNotFoundError, LaunchError, PublishError) as exc:
        raise fail(str(exc)) from None
    if as_json:
        typer.echo(json.dumps(r, indent=2))
        return
    t = r["throughput"]
    typer.echo(f"train step ({r['mode']}, {t['trained_tokens_per_step']} trained tokens, "
               f"{r['torch_threads']} threads): ours {t['ours_tokens_per_s']:.1f} tok/s "
               f"({t['ours_step_s']:.2f} s; {t['ours_seq_tokens_per_s']:.1f} tok/s of sequence)"
               f"   plain HF {t['plain_hf_tokens_per_s']:.1f} tok/s "
               f"({t['plain_hf_step_s']:.2f} s)   ratio {t['ratio']:.2f}x")
    for key, label in (("lora", "LoRA publish (vllm-lora)"),
                       ("full_reload", "full publish (vllm-reload)")):
        if key in r.get("publish", {}):
            p = r["publish"][key]
            typer.echo(f"{label:28s} step end -> served: median "
                       f"{p['step_end_to_served_s_median']:.3f} s, max "
                       f"{p['step_end_to_served_s_max']:.3f} s (swap alone "
                       f"{p['swap_s_median']:.3f} s)")
