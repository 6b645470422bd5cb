"""`spade bench trainer`'s two paths compute the same update (so the ratio compares speed, not
different math), and the benchmark runs end to end on a tiny checkpoint (throughput part)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spade_async.bench.trainer import PlainHF, _samples
from spade_async.core.config.trainer import TrainerConfig
from trainer.parallel import process_group
from trainer.step import StepRunner
from trainer.testing import tiny_llama, write_config

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny")


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_plain_hf_step_and_ours_give_the_same_parameters(tiny, mode):
    tcfg = TrainerConfig(mode=mode, lr=1e-2, lora_targets=["q_proj", "v_proj"],
                         micro_batch_tokens=128, backend="gloo", autocast_bf16=False)
    samples = _samples(tiny, 6, (12, 40), seed=3)
    with process_group("gloo", timeout_s=60) as d:
        ours = StepRunner(tcfg, d, tiny)
        plain = PlainHF(tcfg, tiny)
        before = {n: p.detach().clone() for n, p in plain.model.named_parameters()
                  if p.requires_grad}
        assert len(samples) == 6 and len(before) > 0
        ours.step(samples, step_index=0)
        plain.step(samples)
        mine = {n.removeprefix("module.").removeprefix("lm."): p
                for n, p in ours.model.named_parameters() if p.requires_grad}
        moved = 0.0
        for name, p in plain.model.named_parameters():
            if p.requires_grad:
                # The same (clipped) gradient; the parameters after AdamW's first step agree
                # too, except where a gradient within float noise of 0 flips lr * sign(g).
                torch.testing.assert_close(mine[name].grad, p.grad, atol=1e-6, rtol=1e-3)
                close = torch.isclose(mine[name], p, atol=1e-5, rtol=1e-4)
                assert close.float().mean() > 0.999, name
                moved = max(moved, float((p.detach() - before[name]).abs().max()))
        assert moved > 1e-3  # the step really changed the weights


def test_bench_trainer_json_runs_on_a_tiny_checkpoint(tiny, tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny").symlink_to(tiny)
    cfg = write_config(tmp_path / "cfg.toml", tmp_path, checkpoint_name="tiny",
                       extra='\n[trainer]\nlora_targets = ["q_proj", "v_proj"]\n')
    out = subprocess.run(
        [sys.executable, "-m", "spade_async.cli", "bench", "trainer", "-c", str(cfg),
         "--no-publish", "--samples", "4", "--min-len", "12", "--max-len", "40", "--steps", "2",
         "--json"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    t = r["throughput"]
    assert r["mode"] == "lora" and r["samples"] == 4 and t["steps"] == 2
    assert t["ours_tokens_per_s"] > 0 and t["plain_hf_tokens_per_s"] > 0
    assert t["ratio"] == pytest.approx(t["plain_hf_step_s"] / t["ours_step_s"], rel=0.1)
    assert "[bench] step 0 (warm-up)" in out.stderr


def test_bench_trainer_names_a_missing_checkpoint(tmp_path):
    cfg = write_config(tmp_path / "cfg.toml", tmp_path, checkpoint_name="absent")
    out = subprocess.run(
        [sys.executable, "-m", "spade_async.cli", "bench", "trainer", "-c", str(cfg),
         "--no-publish"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "no prepared checkpoint at" in out.stderr
    assert "spade model prepare" in out.stderr
