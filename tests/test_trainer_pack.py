"""Packing (trainer/pack.py): several sequences per row under a tree attention mask, a prefix
shared by several samples computed once, must score every token exactly as a separate forward
pass of its own sample does, and give the same gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer.data import TrainSample, collate
from trainer.model import load_policy
from trainer.pack import collate_rows, pack_rows, shared_prefix_groups
from trainer.testing import tiny_llama


def sample(i: int, ids: list[int], prompt: int, *, role: str = "agent") -> TrainSample:
    n = len(ids)
    mask = np.array([False] * prompt + [True] * (n - prompt))
    rng = np.random.default_rng(i)
    return TrainSample(row=i, sample_id=f"s{i}", role=role, policy_version=0,
                       token_ids=np.array(ids, dtype=np.int64), loss_mask=mask,
                       behaviour_logprobs=np.where(mask, -rng.random(n), 0).astype(np.float32),
                       advantage=float(rng.normal()), weight=1.0, staleness=0)


def workload() -> list[TrainSample]:
    rng = np.random.default_rng(0)
    system = rng.integers(3, 250, 40).tolist()  # a prompt three episodes share
    kit = rng.integers(3, 250, 24).tolist()  # a designer prompt two designs share
    out = []
    for i in range(3):  # own observation, then a reply
        obs = rng.integers(3, 250, 5 + i).tolist()
        out.append(sample(i, system + obs + rng.integers(3, 250, 7 + 2 * i).tolist(),
                          prompt=len(system) + len(obs)))
    for i in (3, 4):  # the whole prompt shared: the first sampled token follows the kit
        out.append(sample(i, kit + rng.integers(3, 250, 9 + i).tolist(), prompt=len(kit),
                          role="designer"))
    out.append(sample(5, rng.integers(3, 250, 30).tolist(), prompt=12))  # shares nothing
    return out


def per_sample(mb_order: list[TrainSample], flat: torch.Tensor) -> dict[str, torch.Tensor]:
    out, at = {}, 0
    for s in mb_order:
        out[s.sample_id] = flat[at:at + s.trained_tokens]
        at += s.trained_tokens
    return out


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    path = tiny_llama(tmp_path_factory.mktemp("tiny") / "m")
    return load_policy(path, mode="lora", lora_rank=4, lora_alpha=8.0, lora_dropout=0.0,
                       lora_targets=["q_proj", "v_proj", "gate_proj"], temperature=0.7)


def test_groups_share_prompt_prefixes_only():
    samples = workload()
    groups = {frozenset(m.sample_id for m in g.members): g.prefix_len
              for g in shared_prefix_groups(samples, min_prefix=16)}
    assert groups == {frozenset({"s0", "s1", "s2"}): 40,  # the system prompt, not the obs
                      frozenset({"s3", "s4"}): 24,  # the whole kit
                      frozenset({"s5"}): 0}
    # a prefix never reaches into a trained token
    for g in shared_prefix_groups(samples, min_prefix=16):
        assert all(g.prefix_len <= m.prompt_len for m in g.members)


@pytest.mark.parametrize("row_tokens", [512, 60])  # one row, or groups split across rows
def test_packed_rows_score_and_train_like_separate_sequences(policy, row_tokens):
    samples = workload()
    rows = pack_rows(samples, row_tokens=row_tokens, min_prefix=16)
    assert sorted(s.sample_id for r in rows for s in r.samples) == sorted(
        s.sample_id for s in samples)
    packed = collate_rows(rows)
    real = sum(s.length for s in samples)
    assert packed.real_tokens == real
    if row_tokens == 512:
        assert len(rows) == 1 and packed.padded_tokens == real - 2 * 40 - 24

    params = [p for p in policy.parameters() if p.requires_grad]
    torch.manual_seed(0)
    for p in params:  # a non-zero adapter, so the LoRA path matters
        p.data.normal_(0, 0.05)

    def run(mb, order):
        policy.zero_grad(set_to_none=True)
        lp, _ = policy(mb.input_ids, **mb.model_inputs())
        by = per_sample(order, lp)
        torch.stack([by[s.sample_id].sum() * (1 + s.row) for s in order]).sum().backward()
        return {k: v.detach() for k, v in by.items()}, [p.grad.clone() for p in params]

    packed_order = [s for r in rows for s in r.samples]
    got, got_grads = run(packed, packed_order)
    want, want_grads = run(collate(samples), samples)
    for s in samples:
        torch.testing.assert_close(got[s.sample_id], want[s.sample_id], atol=2e-5, rtol=1e-4)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-3)


def test_one_sequence_per_row_needs_no_mask():
    samples = [sample(i, list(range(3, 20 + i)), prompt=5) for i in range(3)]
    mb = collate_rows(pack_rows(samples, row_tokens=16, min_prefix=100))
    assert mb.attention_mask is None and mb.position_ids is None
    assert mb.num_tokens == sum(s.trained_tokens for s in samples)
