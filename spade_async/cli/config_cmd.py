"""`spade config`: validate a config and print it resolved, or, with --shell, the inference
server's settings as shell assignments for scripts/inference.sh."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from spade_async.cli.common import ConfigOpt, config_or_exit, fail
from spade_async.core.config import logprobs_mode


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
    cfg = config_or_exit(config)
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
        raise fail(f"{config}: no endpoint named {endpoint!r}" if endpoint else
                   f"{config}: no [[endpoints]] to serve", 2)
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
        "cfg_enforce_eager": int(cfg.model.enforce_eager),
    }
    device = vllm_device(vllm_python) if vllm_python is not None else "cpu"
    dtype = choose_dtype(cfg.model.dtype, device=device)
    values.update(cfg_device=device, cfg_dtype=dtype.dtype, cfg_dtype_reason=dtype.reason)
    if device == "cpu":
        # alternate phases: the server is paused while the trainer runs, so it takes every core
        threads = choose_threads(exclusive=os.environ.get("SPADE_VLLM_EXCLUSIVE") == "1"
                                 or cfg.trainer.phases == "alternate")
        values.update(cfg_omp_threads_bind=threads.env.get("VLLM_CPU_OMP_THREADS_BIND", ""),
                      cfg_threads_reason=threads.reason)
    typer.echo("\n".join(f"{k}={shlex.quote(str(v))}" for k, v in values.items()))
