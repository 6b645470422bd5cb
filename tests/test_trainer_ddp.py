"""Data parallelism under torchrun on CPU (gloo): one optimizer step on the same batch gives the
same loss and the same parameters with 1 rank, 2 DDP ranks and 2 FSDP2 ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.testing import tiny_llama, write_batches, write_config, write_trainer_config

TORCHRUN = Path(sys.executable).with_name("torchrun")
REPO = Path(__file__).resolve().parents[1]


def run_trainer(data_dir: Path, nproc: int, *args: str, timeout: float = 180) -> None:
    cmd = [str(TORCHRUN), "--standalone", f"--nproc-per-node={nproc}", "-m", "trainer",
           "--config", str(data_dir / "cfg.toml"), "--trainer-config",
           str(data_dir / "trainer.toml"), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"trainer failed ({proc.returncode}):\n{proc.stderr[-4000:]}"


def final_params(data_dir: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpts = data_dir / "trainer" / "checkpoints"
    latest = json.loads((ckpts / "latest.json").read_text())["dir"]
    out = data_dir / "params.pt"
    dcp_to_torch_save(ckpts / latest, out)
    return torch.load(out, weights_only=True)["model"]


def prepare(tmp: Path, name: str, model: Path, parallel: str) -> Path:
    d = tmp / name
    (d / "models").mkdir(parents=True)
    (d / "models" / "tiny").symlink_to(model)
    # Ten samples of uneven length, agents and designers weighted differently, one batch.
    write_batches(d / "spool", 1, samples_per_batch=10, seed=7)
    write_config(d / "cfg.toml", d, checkpoint_name="tiny")
    write_trainer_config(d / "trainer.toml", mode="full", parallel=parallel, lr=1e-3,
                         micro_batch_tokens=64, row_tokens=64, designer_weight=0.5,
                         samples_per_step=6, designer_max_share=0.7,  # all 10: one step
                         publish_every_steps=0,
                         checkpoint_every_steps=1, grad_clip=0.0,
                         autocast_bf16=False)  # fp32: bf16 rounding differs with the split
    return d


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp")
    model = tiny_llama(tmp / "tiny")
    d = prepare(tmp, "ddp-1", model, "ddp")
    run_trainer(d, 1, "--max-steps", "1")
    return tmp, model, d


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_ranks_match_one_rank_after_a_step(one_rank, parallel):
    tmp, model, single = one_rank
    double = prepare(tmp, f"{parallel}-2", model, parallel)
    run_trainer(double, 2, "--max-steps", "1")

    assert_same_step(single, double, model)


def test_two_nodes_by_c10d_rendezvous_match_one_rank(one_rank):
    """`torchrun --nnodes 2`: two node agents (here both on localhost) meet by c10d
    rendezvous and train over gloo as one DDP group, reading one spool directory (the shared
    filesystem of a real cluster): the same step as one rank."""
    from spade_async.inference.launch import free_port

    tmp, model, single = one_rank
    double = prepare(tmp, "ddp-2-nodes", model, "ddp")
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    procs = [subprocess.Popen(
        [str(TORCHRUN), "--nnodes=2", f"--node-rank={rank}", "--nproc-per-node=1",
         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=spade-test",
         "-m", "trainer", "--config", str(double / "cfg.toml"), "--trainer-config",
         str(double / "trainer.toml"), "--max-steps", "1"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in (0, 1)]
    for p in procs:
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0, f"node agent failed ({p.returncode}):\n{out[-4000:]}"
    assert_same_step(single, double, model)


def assert_same_step(single: Path, double: Path, model: Path) -> None:
    (m1,) = [json.loads(x) for x in (single / "trainer" / "metrics.jsonl").read_text().splitlines()]
    (m2,) = [json.loads(x) for x in (double / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert m1["tokens"] == m2["tokens"] > 0 and m1["samples"] == m2["samples"] == 10
    # each of the 2 ranks ran fewer micro-batches than the single rank: the data was split
    assert m2["micro_batches"] < m1["micro_batches"]
    assert m2["loss"] == pytest.approx(m1["loss"], rel=1e-5, abs=1e-7)
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
    assert m2["entropy"] == pytest.approx(m1["entropy"], rel=1e-6)

    p1, p2 = final_params(single), final_params(double)
    assert set(p1) == set(p2) and len(p1) > 10
    base = final_params_base(model)
    moved = 0
    for name, v in p1.items():
        torch.testing.assert_close(p2[name], v, atol=2e-6, rtol=1e-5, msg=name)
        if name in base and not torch.equal(v, base[name]):
            moved += 1
    assert moved > 10  # the step changed the weights, identically on both sides


def final_params_base(model: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {f"lm.{k}": v.float() for k, v in load_file(model / "model.safetensors").items()}
