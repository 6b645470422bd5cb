"""The trainer's sample buffer (trainer/buffer.py): a step is a sample budget gathered across
spool batches; every sample taken ends trained or dropped with a reason, once; a batch is
wholly done only when all its rows are; a restart from the saved position skips done rows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from spade_async.core.config.trainer import TrainerConfig
from spade_async.core.spool.files import FileSpool
from trainer.buffer import OpenBatches, SampleBuffer
from trainer.testing import synthetic_sample, write_batches

WEIGHTS = {"agent": 1.0, "designer": 1.0}


def tcfg(**kw) -> TrainerConfig:
    return TrainerConfig(**{"samples_per_step": 6, "designer_max_share": 0.25,
                            "max_staleness": 100, **kw})


def drain(buf: SampleBuffer, spool: FileSpool, version: int = 0) -> list[list]:
    """Claim like the loop does (only while a step's agents are missing), step when ready;
    at the end, force out what is left."""
    steps = []
    while True:
        plan = buf.take(version)
        if plan is not None:
            steps.append(plan)
            buf.done(plan.samples)
            continue
        batch = spool.claim_next(buf.claimed_seq) if buf.wants_more() else None
        if batch is None:
            break
        buf.claim(batch, version)
    while (plan := buf.take(version, force=True)) is not None:
        steps.append(plan)
        buf.done(plan.samples)
    return steps


def test_steps_are_sample_budgets_across_batches_and_account_for_every_row(tmp_path):
    write_batches(tmp_path, 5, samples_per_batch=6, seed=1)  # 4 agent + 2 designer each
    spool = FileSpool(tmp_path)
    batches = OpenBatches()
    buf = SampleBuffer(tcfg(), WEIGHTS, batches)
    steps = drain(buf, spool)
    # 20 agent samples: three full steps of 6 and a forced one of 2; designers ride along,
    # at most ceil(0.25 * 6) = 2 per step, and beyond 2 steps' worth the oldest are dropped
    assert [sum(s.role == "agent" for s in p.samples) for p in steps] == [6, 6, 6, 2]
    assert all(sum(s.role == "designer" for s in p.samples) <= 2 for p in steps)
    trained = Counter((s.seq, s.row) for p in steps for s in p.samples)
    dropped = sum(sum(p.dropped.values()) for p in steps)
    assert max(trained.values()) == 1 and len(trained) + dropped == 30
    assert {k for p in steps for k in p.dropped} <= {"designer_cap"}
    assert batches.last_seq == 5 and batches.open == {}  # every batch wholly done


def test_a_batch_is_done_only_when_every_row_is(tmp_path):
    write_batches(tmp_path, 2, samples_per_batch=6, seed=2)
    spool = FileSpool(tmp_path)
    batches = OpenBatches()
    buf = SampleBuffer(tcfg(samples_per_step=3, designer_max_share=0.0), WEIGHTS, batches)
    buf.claim(spool.claim_next(0), 0)
    plan = buf.take(0)
    buf.done(plan.samples)
    # 3 of batch 1's 4 agent rows trained, its 2 designer rows dropped (a cap of 0): the
    # fourth agent row still waits, so batch 1 is not done
    assert plan.dropped == {"designer_cap": 2} and len(plan.samples) == 3
    assert batches.last_seq == 0 and len(batches.done(1)) == 5
    buf.claim(spool.claim_next(1), 0)
    buf.done(buf.take(0).samples)
    assert batches.last_seq == 1


def test_restart_from_the_saved_position_trains_each_row_once(tmp_path):
    write_batches(tmp_path, 4, samples_per_batch=6, seed=3)
    spool = FileSpool(tmp_path)
    first = OpenBatches()
    buf = SampleBuffer(tcfg(samples_per_step=5), WEIGHTS, first)
    while buf.wants_more():
        buf.claim(spool.claim_next(buf.claimed_seq), 0)
    plan = buf.take(0)
    buf.done(plan.samples)
    saved = (first.last_seq, first.as_json())  # what a checkpoint holds
    before = {(s.seq, s.row) for s in plan.samples}
    # the process dies; a new one resumes from the saved position
    again = OpenBatches.from_json(saved[0], saved[1])
    steps = drain(SampleBuffer(tcfg(samples_per_step=5), WEIGHTS, again), spool)
    after = [(s.seq, s.row) for p in steps for s in p.samples]
    assert not before & set(after) and len(after) == len(set(after))
    dropped = sum(sum(p.dropped.values()) for p in steps)
    assert len(before) + len(after) + dropped == 24 and again.last_seq == 4


def test_stale_samples_are_dropped_when_their_step_comes(tmp_path):
    rng = np.random.default_rng(0)
    with FileSpool(tmp_path, writer=True) as w:
        w.write([synthetic_sample(rng, f"s{i}", vocab=64, policy_version=v)
                 for i, v in enumerate([0, 0, 3, 3])])
    spool = FileSpool(tmp_path)
    buf = SampleBuffer(tcfg(samples_per_step=4, max_staleness=2), WEIGHTS, OpenBatches())
    buf.claim(spool.claim_next(0), 2)  # all fresh enough at claim time
    plan = buf.take(3, force=True)  # version 3 when the step comes: v0 samples are stale
    assert [s.sample_id for s in plan.samples] == ["s2", "s3"]
    assert plan.dropped == {"stale": 2}


def test_separate_designer_steps_alternate_with_agent_steps(tmp_path):
    write_batches(tmp_path, 6, samples_per_batch=6, seed=4)
    spool = FileSpool(tmp_path)
    buf = SampleBuffer(tcfg(samples_per_step=4, designer_max_share=0.5,
                            designer_steps="separate"), WEIGHTS, OpenBatches())
    roles = [{s.role for s in p.samples} for p in drain(buf, spool)]
    assert all(len(r) == 1 for r in roles)  # never mixed
    assert roles[0] == {"agent"} and {"designer"} in roles
    for a, b in zip(roles, roles[1:], strict=False):
        assert not (a == b == {"designer"})  # at most one designer step after an agent step


def test_selection_drops_are_counted_once_across_a_restart(tmp_path: Path):
    write_batches(tmp_path, 1, samples_per_batch=6, seed=5)
    spool = FileSpool(tmp_path)
    batches = OpenBatches()
    buf = SampleBuffer(tcfg(), {"agent": 1.0, "designer": 0.0}, batches)
    buf.claim(spool.claim_next(0), 0)
    assert buf.dropped == {"zero_weight_designer": 2}
    again = OpenBatches.from_json(batches.last_seq, batches.as_json())
    buf2 = SampleBuffer(tcfg(), {"agent": 1.0, "designer": 0.0}, again)
    buf2.claim(spool.claim_next(0), 0)
    assert buf2.dropped == {} and len(buf2.pending) == 4


def test_a_designer_only_stream_is_bounded_and_its_oldest_sample_sets_the_wait(tmp_path):
    """Designer samples never fill an agent step: the buffer keeps at most two steps' worth
    (the oldest dropped as they come), and the wait the loop compares with step_wait_s runs
    from the oldest pending sample's claim, not from the last batch (a daemon writing a
    designer batch every few seconds must not postpone the step forever)."""
    rng = np.random.default_rng(7)
    with FileSpool(tmp_path, writer=True) as w:
        for b in range(5):
            w.write([synthetic_sample(rng, f"d{b}.{i}", vocab=64, role="designer")
                     for i in range(2)])
    spool = FileSpool(tmp_path)
    buf = SampleBuffer(tcfg(samples_per_step=8), WEIGHTS, OpenBatches())  # cap 2, keep 4
    assert buf.waited_s() == 0.0
    buf.claim(spool.claim_next(0), 0)
    buf.claimed_at[1] -= 100.0  # the first batch came 100 s ago
    for seq in range(2, 6):
        assert buf.wants_more()
        buf.claim(spool.claim_next(seq - 1), 0)
    assert len(buf.pending) == 4 and buf.dropped == {"designer_cap": 6}
    # the first batch's samples were dropped: the oldest pending is batch 4's, just claimed
    assert min(s.seq for s in buf.pending) == 4 and buf.waited_s() < 50
    buf.claimed_at[4] -= 200.0
    assert buf.waited_s() >= 200 and not buf.ready() and buf.ready(force=True)
    plan = buf.take(0, force=True)
    assert [s.sample_id for s in plan.samples] == ["d3.0", "d3.1"]  # up to the cap, oldest first
    assert plan.dropped == {"designer_cap": 6}
