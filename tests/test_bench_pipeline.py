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
    # the daemon side's own CPU per episode (its process and its sandbox workers)
    assert d["episodes"] == 16 and d["client_cpu_s"] > 0
    assert d["cpu_s_per_1k_episodes"] == pytest.approx(1000 * d["client_cpu_s"] / 16, rel=0.01)
    assert d["episodes_per_min_per_core"] == pytest.approx(
        60 * 1000 / d["cpu_s_per_1k_episodes"], rel=0.02)


def test_mixed_workload_measures_every_endpoint_and_both_request_kinds(checkpoint):
    """The whole daemon (real sandbox, LanceDB memory, spool) against two fake endpoints of
    different capacities; the bare client replays the daemon's own requests."""
    from spade_async.bench.mixed import run_mixed_bench

    r = run_mixed_bench(checkpoint, capacities=(4, 2), token_latency_s=0.004, warmup_s=6.0,
                        window_s=6.0)
    d, b = r["daemon"], r["bare"]
    assert r["endpoints"] == {"fake0": 4, "fake1": 2}
    assert set(d["saturation"]) == {"fake0", "fake1"}
    assert all(0 < s <= 1 for s in d["saturation"].values())
    assert r["saturation_min"] == min(d["saturation"].values())
    # designs (~700 tokens) beside episode turns, both inside the measured window
    assert 0 < d["design_requests"] < d["requests"]
    assert d["counters"]["designs_accepted"] > 0 and d["counters"]["episodes"] > 0
    assert d["tokens"] > 0 and b["tokens"] > 0 and b["requests"] > 0
    assert r["ratio"] == pytest.approx(d["tokens_per_s"] / b["tokens_per_s"], abs=0.002)
