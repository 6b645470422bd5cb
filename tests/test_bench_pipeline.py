"""`spade bench pipeline` against the fake endpoint: both paths send the very same requests, in
two rounds of opposite order, and the ratio is what the totals say."""

from __future__ import annotations

import pytest

from spade_async.bench.pipeline import run_pipeline_bench


def test_pipeline_bench_replays_the_same_requests_in_both_orders(checkpoint):
    r = run_pipeline_bench(checkpoint, concurrency=4, episodes=8, tokens=16,
                           token_latency_s=0.001, real=False)
    f = r["fake"]
    d, b = f["daemon"], f["bare"]
    assert d["requests"] == 8 * 4  # 8 episodes x 4 turns, all replayed by the bare client
    assert d["tokens"] == b["tokens"] == 2 * 8 * 4 * 16  # two rounds each, full turns
    assert len(d["rounds_tokens_per_s"]) == len(b["rounds_tokens_per_s"]) == 2
    assert d["tokens_per_s"] == pytest.approx(d["tokens"] / d["seconds"], rel=0.01)
    assert f["ratio"] == pytest.approx(d["tokens_per_s"] / b["tokens_per_s"], abs=0.002)
    assert 0 < f["ratio"] < 2
