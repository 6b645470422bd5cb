"""`spade bench inference`: the embedded inference stack's own figures.

Starts vLLM through the Procfile's script on a free port (or uses `--base-url`), then measures,
in one run: server start time, decode tokens/s with 1 and with N concurrent streams (through the
endpoint pool, fixed-length generations via `ignore_eos`), LoRA adapter hot-load time, and
full-weight reload time through `/collective_rpc reload_weights`. Never asserts anything: it
reports.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from spade_async.config import EndpointConfig, PoolConfig, VllmLoraSwap
from spade_async.endpoints.pool import EndpointPool
from spade_async.endpoints.swap import LoraSwapper, ReloadSwapper

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


async def _streams(pool: EndpointPool, n_streams: int, requests_each: int, max_tokens: int) -> dict:
    tokens = 0

    async def stream(i: int) -> None:
        nonlocal tokens
        for j in range(requests_each):
            out = await pool.chat(PROMPT, model="policy", max_tokens=max_tokens, temperature=1.0,
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


async def _measure(base_url: str, model_dir: Path, streams: int, max_tokens: int, swaps: int,
                   progress: Callable[[str], None]) -> dict[str, Any]:
    ep = EndpointConfig(name="bench", base_url=base_url, max_concurrency=max(streams, 1),
                        request_timeout_s=600, weight_swap=VllmLoraSwap())
    result: dict[str, Any] = {}
    async with EndpointPool([ep], PoolConfig(wait_for_endpoint_s=30)) as pool:
        progress("warm-up request")
        await pool.chat(PROMPT, model="policy", max_tokens=8)
        progress(f"1 stream x 4 requests x {max_tokens} tokens")
        one = await _streams(pool, 1, 4, max_tokens)
        progress(f"{streams} streams x 2 requests x {max_tokens} tokens")
        many = await _streams(pool, streams, 2, max_tokens)
        result["decode"] = {"single": one, "concurrent": many,
                            "ratio": round(many["tokens_per_s"] / one["tokens_per_s"], 2)}

        with tempfile.TemporaryDirectory(prefix="spade-bench-") as tmp:
            progress("building a rank-16 peft adapter")
            adapter = _make_adapter(model_dir, Path(tmp) / "adapter")
            lora = LoraSwapper(pool, "bench", "policy", max_loaded_adapters=1)
            times = []
            for v in range(1, swaps + 1):
                progress(f"LoRA hot-load {v}/{swaps}")
                times.append((await lora.swap(900 + v, adapter)).seconds)
            await lora.retire(900 + swaps)
            result["lora_load_s"] = {"first": round(times[0], 4),
                                     "median": round(statistics.median(times), 4), "n": len(times)}

        reload = ReloadSwapper(pool, "bench", "policy")
        times = []
        for v in range(1, swaps + 1):
            progress(f"full reload {v}/{swaps}")
            times.append((await reload.swap(v, model_dir)).seconds)
        await reload.swap(0, model_dir)
        result["full_reload_s"] = {"first": round(times[0], 4),
                                   "median": round(statistics.median(times), 4), "n": len(times)}
    return result


def run_inference_bench(model_dir: Path, *, base_url: str | None, streams: int = 16,
                        max_tokens: int = 128, swaps: int = 3,
                        progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    from spade_async.endpoints.launch import serving

    report: dict[str, Any] = {"model_dir": str(model_dir)}
    with serving(model_dir, base_url, progress=progress) as (url, start_s):
        if start_s is not None:
            report["start_s"] = round(start_s, 1)
        report["base_url"] = url
        report.update(anyio.run(_measure, url, model_dir, streams, max_tokens, swaps, progress))
    return report
