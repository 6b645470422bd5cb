"""Trainer pieces in one process: the loss against hand values, batch selection and packing,
the model's log-probs against a plain HF forward, LoRA merging, saved state, config errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from spade_async.core.config import EndpointConfig, SpadeConfig, VllmLoraSwap, VllmReloadSwap
from spade_async.core.config.trainer import TrainerConfig, TrainerConfigError, load_trainer_config
from spade_async.core.spool.files import FileSpool
from trainer.checkpoint import TrainerState
from trainer.data import collate, micro_batches, select_samples, split_across_ranks
from trainer.loss import LossConfig, StepMetrics, policy_loss
from trainer.model import load_policy, merged_state_dict
from trainer.publish import PublishConfigError, artifact_kind
from trainer.testing import synthetic_sample, tiny_llama

CFG = LossConfig(clip_eps_low=0.2, clip_eps_high=0.3, kl_coef=0.0)


def _loss(new, old, adv, w=None, ref=None, cfg=CFG, normaliser=None):
    new = torch.tensor(new, dtype=torch.float64, requires_grad=True)
    n = new.numel()
    w = torch.ones(n, dtype=torch.float64) if w is None else torch.tensor(w, dtype=torch.float64)
    loss, m = policy_loss(
        new, torch.tensor(old, dtype=torch.float64), torch.tensor(adv, dtype=torch.float64), w,
        torch.zeros(n), torch.zeros(n),
        None if ref is None else torch.tensor(ref, dtype=torch.float64),
        normaliser=normaliser or n, cfg=cfg)
    loss.backward()
    return loss.item(), new.grad.tolist(), m


def test_loss_unclipped_tokens_match_the_policy_gradient_by_hand():
    # ratios e^0.1 and e^-0.1 both lie inside [0.8, 1.3]
    new, old, adv = [-1.0, -2.0], [-1.1, -1.9], [2.0, -1.0]
    loss, grad, m = _loss(new, old, adv)
    r = [math.exp(0.1), math.exp(-0.1)]
    assert loss == pytest.approx(-(r[0] * 2.0 + r[1] * -1.0) / 2)
    # d(-r A)/d logp = -r A, divided by the 2 tokens
    assert grad == pytest.approx([-r[0] * 2.0 / 2, r[1] * 1.0 / 2])
    assert float(m["clipped"]) == 0
    assert float(m["logprob_abs_diff"]) == pytest.approx(0.2)


def test_loss_clipped_tokens_carry_no_gradient_and_count_as_clipped():
    # token 0: ratio e^0.5 = 1.65 > 1.3 with A > 0 -> clipped; token 1: ratio e^-0.5 = 0.61 < 0.8
    # with A < 0 -> clipped; token 2: ratio 1.65 with A < 0 -> NOT clipped (pessimistic side)
    new, old, adv = [-1.0, -1.5, -1.0], [-1.5, -1.0, -1.5], [1.0, -1.0, -1.0]
    loss, grad, m = _loss(new, old, adv)
    r = math.exp(0.5)
    expected = (-(1.3 * 1.0) + -(0.8 * -1.0) + -(r * -1.0)) / 3
    assert loss == pytest.approx(expected)
    assert grad[0] == 0 and grad[1] == 0
    assert grad[2] == pytest.approx(r / 3)
    assert float(m["clipped"]) == 2
    summary = _summary(m)
    assert summary["clip_fraction"] == pytest.approx(2 / 3)
    assert summary["ratio_max"] == pytest.approx(r) and summary["ratio_min"] == pytest.approx(1 / r)


def _summary(m):
    acc = StepMetrics()
    acc.add(m)
    return acc.summary()


def test_loss_kl_role_weights_and_the_step_normaliser():
    cfg = LossConfig(0.2, 0.3, kl_coef=0.5)
    new, old, adv, ref = [-1.0, -1.0], [-1.0, -1.0], [1.0, 1.0], [-1.2, -0.7]
    loss, _, m = _loss(new, old, adv, w=[1.0, 0.25], ref=ref, cfg=cfg, normaliser=8)
    k3 = [math.exp(d) - d - 1 for d in (-0.2, 0.3)]
    per_token = [(-1.0 + 0.5 * k3[0]) * 1.0, (-1.0 + 0.5 * k3[1]) * 0.25]
    assert loss == pytest.approx(sum(per_token) / 8)
    assert float(m["kl"]) == pytest.approx(sum(k3))


def test_step_metrics_reduce_like_one_big_batch():
    a = _loss([-1.0, -2.0], [-1.5, -1.0], [1.0, -1.0])[2]
    b = _loss([-0.5], [-0.1], [0.5])[2]
    whole = _loss([-1.0, -2.0, -0.5], [-1.5, -1.0, -0.1], [1.0, -1.0, 0.5])[2]
    parts = [StepMetrics(), StepMetrics()]
    parts[0].add(a)
    parts[1].add(b)
    sums = parts[0].vectors()[0] + parts[1].vectors()[0]
    maxs = torch.maximum(parts[0].vectors()[1], parts[1].vectors()[1])
    merged = StepMetrics.from_vectors(sums, maxs).summary()
    assert merged == pytest.approx(_summary(whole))


# ---- data ------------------------------------------------------------------------------------


def _spool_batch(tmp_path: Path, samples):
    with FileSpool(tmp_path / "spool", writer=True) as spool:
        seq = spool.write(samples)
    return FileSpool(tmp_path / "spool").claim_next(seq - 1)


def test_selection_drops_stale_and_zero_weight_samples(tmp_path):
    rng = np.random.default_rng(0)
    samples = [synthetic_sample(rng, "fresh", vocab=64, policy_version=5),
               synthetic_sample(rng, "old", vocab=64, policy_version=2),
               synthetic_sample(rng, "edge", vocab=64, policy_version=3),
               synthetic_sample(rng, "designer", vocab=64, policy_version=5, role="designer")]
    batch = _spool_batch(tmp_path, samples)
    sel = select_samples(batch, current_version=5, max_staleness=2,
                         role_weights={"agent": 1.0, "designer": 0.0})
    assert [s.sample_id for s in sel.samples] == ["fresh", "edge"]
    assert sel.dropped == {"stale": 1, "zero_weight_designer": 1}
    assert [s.staleness for s in sel.samples] == [0, 2]
    assert sel.tokens == sum(int(np.sum(s.loss_mask)) for s in samples[::2])


def test_split_and_micro_batches_cover_every_sample_once_within_the_budget():
    rng = np.random.default_rng(1)
    from trainer.data import TrainSample

    samples = []
    for i in range(11):
        n = int(rng.integers(5, 60))
        samples.append(TrainSample(i, f"s{i}", "agent", 0, np.arange(n), np.r_[False, np.ones(
            n - 1, bool)], np.zeros(n, np.float32), 1.0, 1.0, 0))
    shares = split_across_ranks(samples, 3)
    assert sorted(s.row for share in shares for s in share) == list(range(11))
    loads = [sum(s.length for s in share) for share in shares]
    assert max(loads) - min(loads) <= max(s.length for s in samples)
    assert split_across_ranks(samples, 3) == shares  # deterministic
    for share in shares:
        mbs = micro_batches(share, 100)
        assert sorted(s.row for mb in mbs for s in mb) == sorted(s.row for s in share)
        for mb in mbs:
            assert len(mb) == 1 or len(mb) * max(s.length for s in mb) <= 100


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny") / "model")


def test_policy_logprobs_match_a_plain_hf_forward_at_shifted_positions(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    rng = np.random.default_rng(2)
    samples = [synthetic_sample(rng, f"s{i}", vocab=256) for i in range(4)]
    sel = select_samples(_spool_batch(tmp_path, samples), current_version=0, max_staleness=0,
                         role_weights={"agent": 1.0, "designer": 1.0})
    mb = collate(sel.samples)
    for temperature in (1.0, 0.7):
        policy = load_policy(tiny, mode="full", lora_rank=4, lora_alpha=8, lora_dropout=0,
                             lora_targets=["q_proj"], temperature=temperature)
        with torch.no_grad():
            ours, entropy = policy(mb.input_ids, mb.target_mask)
        hf = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
        expected, expected_h = [], []
        with torch.no_grad():
            for s in sel.samples:  # one unpadded sequence at a time
                ids = torch.from_numpy(s.token_ids)[None]
                logp = torch.log_softmax(hf(ids).logits[0].float() / temperature, -1)
                for t in np.flatnonzero(s.loss_mask):
                    expected.append(logp[t - 1, s.token_ids[t]])
                    expected_h.append(-(logp[t - 1].exp() * logp[t - 1]).sum())
        # collate orders rows as given; compare as multisets per row order
        assert ours.shape == (mb.num_tokens,)
        torch.testing.assert_close(ours, torch.stack(expected), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(entropy, torch.stack(expected_h), atol=1e-4, rtol=1e-4)
    # the flat per-token tensors line up with the model's output order
    flat = np.concatenate([s.behaviour_logprobs[s.loss_mask] for s in sel.samples])
    np.testing.assert_array_equal(mb.behaviour_logprobs.numpy(), flat)


def test_lora_merge_equals_peft_merge_and_unload(tiny):
    policy = load_policy(tiny, mode="lora", lora_rank=4, lora_alpha=8, lora_dropout=0,
                         lora_targets=["q_proj", "v_proj"], temperature=1.0)
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    full = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    ours = merged_state_dict(full, lora=True, scaling=8 / 4, tied=True)
    reference = policy.lm.merge_and_unload().state_dict()
    assert set(ours) == set(reference) - {"lm_head.weight"}
    for k, v in ours.items():
        torch.testing.assert_close(v, reference[k], atol=1e-6, rtol=1e-6)


def test_trainer_state_reads_format_1_checkpoints():
    """A checkpoint of the one-step-per-batch trainer: its last_seq was wholly done."""
    old = {"step": 4, "last_seq": 6, "trained": [[1, 2, 1], [5, 6, 3]], "skipped": [[3, 4]],
           "samples": 20, "tokens": 400, "dropped": {"stale": 2}, "format": 1}
    st = TrainerState.from_json(old)
    assert (st.step, st.last_seq, st.open, st.samples, st.dropped) == (4, 6, {}, 20,
                                                                       {"stale": 2})
    with pytest.raises(ValueError, match="format 9"):
        TrainerState.from_json({**old, "format": 9})


def test_trainer_config_names_unknown_and_bad_keys(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text("[trainer]\nlr = 1e-4\nlora_rnk = 8\n")
    with pytest.raises(TrainerConfigError, match=r"unknown key 'trainer\.lora_rnk'"):
        load_trainer_config(f)
    f.write_text("[trainer]\nclip_eps_low = 1.5\n")
    with pytest.raises(TrainerConfigError, match="clip_eps_low"):
        load_trainer_config(f)
    f.write_text("[trainer]\nmode = 'full'\nparallel = 'fsdp2'\n")
    assert load_trainer_config(f) == TrainerConfig(mode="full", parallel="fsdp2")


def test_publish_refuses_endpoint_mixes_that_cannot_share_a_model_name():
    def cfg(*swaps):
        return SpadeConfig(endpoints=[EndpointConfig(name=f"e{i}", base_url="http://x",
                                                     weight_swap=s) for i, s in enumerate(swaps)])

    assert artifact_kind(cfg(VllmLoraSwap()), TrainerConfig()) == "adapter"
    assert artifact_kind(cfg(VllmReloadSwap()), TrainerConfig()) == "full"  # merged LoRA
    with pytest.raises(PublishConfigError, match="mix"):
        artifact_kind(cfg(VllmLoraSwap(), VllmReloadSwap()), TrainerConfig())
    with pytest.raises(PublishConfigError, match="full"):
        artifact_kind(cfg(VllmLoraSwap()), TrainerConfig(mode="full"))
    with pytest.raises(PublishConfigError, match="no endpoint"):
        artifact_kind(cfg(), TrainerConfig())


def test_checkpoint_retention_keeps_the_newest_and_one_per_period(tmp_path):
    """keep_checkpoints newest, plus (keep_checkpoint_every_hours) the first of each period."""
    import os

    from trainer.checkpoint import STATE_FILE, Checkpointer

    ck = Checkpointer.__new__(Checkpointer)
    ck.dir, ck.keep, ck.keep_every_s = tmp_path, 2, 3600.0
    hour = 1_800_000_000 // 3600 * 3600
    for step, at in enumerate([0, 600, 1200, 4000, 4100, 8000, 8100, 8200], start=1):
        d = tmp_path / f"step-{step:09d}-seq-{step:012d}"
        d.mkdir()
        (d / STATE_FILE).write_text("{}")
        os.utime(d / STATE_FILE, (hour + at, hour + at))
    ck._prune(keep_name="step-000000008-seq-000000000008")
    kept = sorted(int(p.name[5:14]) for p in tmp_path.glob("step-*"))
    assert kept == [1, 4, 6, 7, 8]  # first of hours 0, 1, 2; and the newest two
    ck.keep_every_s = 0.0
    ck._prune(keep_name="step-000000008-seq-000000000008")
    assert sorted(int(p.name[5:14]) for p in tmp_path.glob("step-*")) == [7, 8]
