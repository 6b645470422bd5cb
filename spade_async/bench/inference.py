"""`spade bench inference`: the embedded inference stack's own figures, with anchors beside them.

In one run, on the host it prints (CPU model, cores, the bf16/AVX flags, the dtype and thread
settings chosen from them and why):
- vLLM as the Procfile's script starts it (`--enable-lora`): start time, decode tokens/s with 1
  and with N concurrent streams (through the endpoint pool, fixed-length generations via
  `ignore_eos`), LoRA adapter hot-load time, full-weight reload time (`/collective_rpc
  reload_weights`);
- the same server without `--enable-lora` (SPADE_VLLM_LORA=0; the base model, same dtype): start
  time and decode tokens/s, so the cost of LoRA support is a ratio from the same run;
- plain transformers `generate` at batch N and 1 (the same prompt, the same number of sampled
  tokens via min/max_new_tokens, the same dtype, every usable core), with no vLLM server alive,
  so the two never share cores.
With `--base-url` the given server is measured instead and the no-LoRA server is not started
(its figure needs a server started here). Never asserts anything: it reports.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx

from spade_async.core.config import EndpointConfig, PoolConfig, VllmLoraSwap
from spade_async.inference.cpu_profile import (
    CpuInfo,
    DtypeChoice,
    choose_dtype,
    choose_threads,
    effective_dtype,
    read_cpu,
    vllm_device,
)
from spade_async.inference.pool import EndpointPool
from trainer.swap.lora import LoraSwapper
from trainer.swap.reload import ReloadSwapper

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


async def _streams(pool: EndpointPool, n_streams: int, requests_each: int, max_tokens: int,
                   model: str = "policy") -> dict:
    tokens = 0

    async def stream(i: int) -> None:
        nonlocal tokens
        for j in range(requests_each):
            out = await pool.chat(PROMPT, model=model, max_tokens=max_tokens, temperature=1.0,
                                  seed=1000 * i + j, extra={"ignore_eos": True})
            tokens += len(out.token_ids)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n_streams):
            tg.start_soon(stream, i)
    seconds = time.perf_counter() - start
    return {"streams": n_streams, "tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 1)}


def _make_adapter(model_dir: Path, out: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, init_lora_weights=False,
                                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    model.save_pretrained(out)
    return out


def _pool(base_url: str, streams: int) -> EndpointPool:
    ep = EndpointConfig(name="bench", base_url=base_url, max_concurrency=max(streams, 1),
                        request_timeout_s=600, weight_swap=VllmLoraSwap())
    return EndpointPool([ep], PoolConfig(wait_for_endpoint_s=30))


async def _decode(pool: EndpointPool, streams: int, max_tokens: int,
                  progress: Callable[[str], None]) -> dict[str, Any]:
    """Warm-up, then 1 stream x 4 requests and N streams x 2 requests of `max_tokens` each."""
    progress("warm-up request")
    await pool.chat(PROMPT, model="policy", max_tokens=8)
    progress(f"1 stream x 4 requests x {max_tokens} tokens")
    one = await _streams(pool, 1, 4, max_tokens)
    progress(f"{streams} streams x 2 requests x {max_tokens} tokens")
    many = await _streams(pool, streams, 2, max_tokens)
    return {"single": one, "concurrent": many,
            "ratio": round(many["tokens_per_s"] / one["tokens_per_s"], 2)}


async def _version(base_url: str) -> str | None:
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
            r = await client.get("/version")
        return r.json().get("version") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


async def _measure(base_url: str, model_dir: Path, streams: int, max_tokens: int, swaps: int,
                   progress: Callable[[str], None]) -> dict[str, Any]:
    result: dict[str, Any] = {"vllm_version": await _version(base_url)}
    async with _pool(base_url, streams) as pool:
        result["decode"] = await _decode(pool, streams, max_tokens, progress)

        with tempfile.TemporaryDirectory(prefix="spade-bench-") as tmp:
            progress("building a rank-16 peft adapter")
            adapter = _make_adapter(model_dir, Path(tmp) / "adapter")
            lora = LoraSwapper(pool, "bench", "policy", max_loaded_adapters=1)
            times = []
            for v in range(1, swaps + 1):
                progress(f"LoRA hot-load {v}/{swaps}")
                times.append((await lora.swap(900 + v, adapter)).seconds)
            result["lora_load_s"] = {"first": round(times[0], 4),
                                     "median": round(statistics.median(times), 4), "n": len(times)}
            # What the loop really decodes through: every request names the policy's adapter.
            name = f"policy-v{900 + swaps}"
            progress(f"{streams} streams x 2 requests x {max_tokens} tokens through {name}")
            await pool.chat(PROMPT, model=name, max_tokens=8)
            result["decode_adapter"] = await _streams(pool, streams, 2, max_tokens, model=name)
            await lora.retire(900 + swaps)

        reload = ReloadSwapper(pool, "bench", "policy")
        times = []
        for v in range(1, swaps + 1):
            progress(f"full reload {v}/{swaps}")
            times.append((await reload.swap(v, model_dir)).seconds)
        await reload.swap(0, model_dir)
        result["full_reload_s"] = {"first": round(times[0], 4),
                                   "median": round(statistics.median(times), 4), "n": len(times)}
    return result


async def _measure_decode(base_url: str, streams: int, max_tokens: int,
                          progress: Callable[[str], None]) -> dict[str, Any]:
    async with _pool(base_url, streams) as pool:
        return await _decode(pool, streams, max_tokens, progress)


def hf_generate(model_dir: Path, dtype: str, *, batch: int, max_tokens: int, threads: int,
                progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Plain transformers `generate` on PROMPT: `batch` copies, exactly `max_tokens` sampled
    tokens each (min_new_tokens = max_new_tokens, so EOS cannot end it early, like
    `ignore_eos`), temperature 1 over the whole vocabulary (top_k 0, top_p 1) as the vLLM
    requests sample. One short unmeasured warm-up generation first."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    enc = tok.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)
    ids = enc["input_ids"].repeat(batch, 1)
    sample = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
              "attention_mask": torch.ones_like(ids), "pad_token_id": tok.eos_token_id}
    torch.manual_seed(0)
    with torch.inference_mode():
        model.generate(ids, min_new_tokens=8, max_new_tokens=8, **sample)
        progress(f"transformers generate: batch {batch} x {max_tokens} tokens ({dtype}, "
                 f"{threads} threads)")
        start = time.perf_counter()
        out = model.generate(ids, min_new_tokens=max_tokens, max_new_tokens=max_tokens, **sample)
        seconds = time.perf_counter() - start
    tokens = int(out.shape[0] * (out.shape[1] - ids.shape[1]))
    return {"batch": batch, "tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 1)}


def host_report(cpu: CpuInfo, dtype: DtypeChoice, device: str) -> dict[str, Any]:
    """The host and the settings scripts/inference.sh derives from it (the same functions)."""
    threads = choose_threads(cpu, exclusive=True)  # the servers started here run alone
    bind = threads.env.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    reason = threads.reason
    if os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
        bind, reason = os.environ["VLLM_CPU_OMP_THREADS_BIND"], "set in the environment"
    return {"cpu_model": cpu.model, "cores": len(cpu.cores), "flags": cpu.reported_flags(),
            "vllm_device": device, "dtype": dtype.dtype, "dtype_reason": dtype.reason,
            "omp_threads_bind": bind, "threads_reason": reason}


def run_inference_bench(model_dir: Path, *, base_url: str | None, dtype: str = "auto",
                        streams: int = 16, max_tokens: int = 128, swaps: int = 3,
                        progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """`dtype`: the model.dtype setting the servers run with (and the HF anchor follows)."""
    from spade_async.inference.launch import serving, vllm_python
    from trainer.model import checkpoint_dtype

    cpu = read_cpu()
    device = vllm_device(vllm_python())
    choice = choose_dtype(dtype, device=device, cpu=cpu)  # type: ignore[arg-type]
    host = host_report(cpu, choice, device)
    progress(f"host: {cpu.model}, {len(cpu.cores)} cores, "
             + " ".join(f"{f}={'yes' if v else 'no'}" for f, v in host["flags"].items()))
    progress(f"dtype {choice.dtype}: {choice.reason}; threads: {host['threads_reason']}")
    report: dict[str, Any] = {"model_dir": str(model_dir), "host": host}
    # The server resolves the dtype as `choice` did, and has the host to itself (the
    # transformers anchor gets every core too).
    env = {"SPADE__MODEL__DTYPE": dtype, "SPADE_VLLM_EXCLUSIVE": "1"}

    with serving(model_dir, base_url, progress=progress,
                 extra_env={**env, "SPADE_VLLM_LORA": "1"}) as (url, start_s):
        if start_s is not None:
            report["start_s"] = round(start_s, 1)
        report["base_url"] = url
        report.update(anyio.run(_measure, url, model_dir, streams, max_tokens, swaps, progress))

    if base_url is None:
        progress("the same server without --enable-lora")
        with serving(model_dir, None, progress=progress,
                     extra_env={**env, "SPADE_VLLM_LORA": "0"}) as (url, start_s):
            plain = anyio.run(_measure_decode, url, streams, max_tokens, progress)
        with_lora = report["decode"]
        report["no_lora"] = {"start_s": round(start_s or 0.0, 1), "decode": plain}
        # with --enable-lora / without: base-model requests at 1 and N streams, and N streams
        # through an adapter (what a vllm-lora endpoint serves all day) against the plain server.
        report["lora_cost"] = {
            **{f"{k}_ratio": round(with_lora[k]["tokens_per_s"] / plain[k]["tokens_per_s"], 3)
               for k in ("single", "concurrent")},
            "adapter_concurrent_ratio": round(report["decode_adapter"]["tokens_per_s"]
                                              / plain["concurrent"]["tokens_per_s"], 3)}
    else:
        report["lora_cost"] = {"skipped": "needs a server started here (--base-url given)"}

    hf_dtype = effective_dtype(choice, str(checkpoint_dtype(model_dir)).removeprefix("torch."))
    threads = len(cpu.cores)
    hf: dict[str, Any] = {"dtype": hf_dtype, "threads": threads}
    for key, batch in (("concurrent", streams), ("single", 1)):
        hf[key] = hf_generate(model_dir, hf_dtype, batch=batch, max_tokens=max_tokens,
                              threads=threads, progress=progress)
    report["hf_generate"] = hf
    report["vs_hf"] = {
        f"{k}_ratio": round(report["decode"][k]["tokens_per_s"] / hf[k]["tokens_per_s"], 3)
        for k in ("single", "concurrent")}
    return report
