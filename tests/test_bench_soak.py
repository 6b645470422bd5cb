"""`spade bench soak` at its test size: the real daemon (sandbox, LanceDB memory, spool, rolled
records) and the real trainer (a tiny LoRA) as processes against the fake endpoint for about a
minute; every series is sampled, the verdicts are computed from them and written to soak.json.
The verdict arithmetic is checked on series whose answers are known."""

from __future__ import annotations

import json

import pytest

from spade_async.bench.soak import drift, level_off, render, run_soak


def test_level_off_and_drift_on_known_series():
    ts = [float(t) for t in range(0, 101, 10)]
    flat_after_growth = [min(t, 40.0) for t in ts]          # grows, then flat from t = 40
    linear = [1.0 + t for t in ts]                           # grows to the end
    assert level_off(ts, flat_after_growth) == {
        "final": 40.0, "at_three_quarters": 40.0, "growth_last_quarter_pct": 0.0,
        "end_to_end_pct": 0.0, "ok": True}
    grown = level_off(ts, linear)  # the last half's slope 1 x 25 over its last quarter's mean
    assert grown["growth_last_quarter_pct"] == pytest.approx(100 * 25 / 91, abs=0.01)
    assert grown["end_to_end_pct"] == pytest.approx(100 * (101 - 81) / 101, abs=0.01)
    assert grown["ok"] is False
    # a saw on a level (versions piling up, then pruned): its two ends say +17%, its fit ~0
    fine = [2.5 * i for i in range(41)]
    sawed = level_off(fine, [(10.0, 12.0, 14.0)[i % 3] for i in range(41)])
    assert sawed["end_to_end_pct"] > 15 and abs(sawed["growth_last_quarter_pct"]) < 2
    assert sawed["ok"] is True
    assert drift(ts, [2.0] * 6 + [None] + [3.0] * 4)["ok"] is True      # 1.5x
    slow = drift(ts, [2.0] * 6 + [5.0] * 5)
    assert slow["first"] == 2.0 and slow["end"] == 5.0 and slow["ratio"] == 2.5
    assert slow["ok"] is False
    assert drift(ts[:3], [1.0, 2.0, None])["ratio"] is None  # too few points to say


def test_soak_test_size_records_every_series_and_writes_its_verdicts(checkpoint, tmp_path):
    out = tmp_path / "soak"
    lines: list[str] = []
    r = run_soak(checkpoint, out, episodes=300, designs=60, steps=3, minutes=1.3,
                 sample_s=2.5, segment_mb=0.01, keep_mb=0.03, documents=200, concurrency=4,
                 keep=True,
                 progress=lines.append)
    series = r["series"]
    assert len(series) >= 5 and len(lines) == len(series) + 1  # a progress line a sample
    last = series[-1]
    # the whole stack ran: designs stored, episodes played, batches trained and published
    assert last["designs"] > 0 and last["designs_accepted"] > 0 and last["episodes"] > 0
    assert r["reached"]["batches"] > 0 and last["steps"] >= 1
    assert {"run", "memory", "spool", "trainer", "weights"} <= set(last["disk"])
    assert last["disk_total"] == sum(last["disk"].values()) > 0
    assert all(last["rss"][p] > 50 << 20 for p in ("daemon", "trainer", "fake"))
    assert any(s["workers"] > 0 for s in series)  # the daemon's sandbox workers were seen
    assert last["memory_ops"] > 0 and last["memory_p99_ms"] >= last["memory_p50_ms"] > 0
    assert last["tick_p50_ms"] > 0
    assert 0 < last["memory_cache_mb"] <= 256 + 64  # LanceDB's caches, bounded
    assert all(a["t"] < b["t"] and a["episodes"] <= b["episodes"]
               for a, b in zip(series, series[1:], strict=False))
    # rotation ran inside the soak (segments of 10 KB) and pruned to keep_mb
    assert "episodes.rolled" in r["rolled"]
    rolled = out / "data" / "run" / "episodes.rolled"
    assert 0 < sum(p.stat().st_size for p in rolled.iterdir()) <= 0.03 * (1 << 20)
    # the verdicts are those of the series
    v = r["verdicts"]
    ts = [s["t"] for s in series]
    assert v["disk"]["total"] == level_off(ts, [s["disk_total"] for s in series])
    assert set(v["rss"]) == {"fake", "daemon", "trainer", "daemon_workers"}
    assert v["rss"]["daemon"] == level_off(ts, [s["rss"]["daemon"] for s in series])
    assert v["latency"]["memory_p99_ms"] == drift(ts, [s["memory_p99_ms"] for s in series])
    assert v["latency"]["memory_p99_ms"]["ratio"] is not None
    assert v["latency"]["tick_p50_ms"]["ratio"] is not None
    w = r["week"]
    assert w["disk_growth_gb_per_week"] == pytest.approx(
        sum(d["gb_per_week"] for d in w["disk_growth"].values()), abs=1e-3)
    assert w["units_last_half"]["episodes"] > 0
    assert w["written"]["daemon"]["bytes_per_unit"] > 0
    # the record files as produced, pruned segments counted: more than the disk keeps
    made = w["records"]["run/episodes.rolled"]
    assert made["bytes_per_unit"] * last["episodes"] > sum(
        p.stat().st_size for p in rolled.iterdir())
    # the week: the records as produced, the other directories' growth (none when they
    # shrank), the memory as a row for every design of the week at its bytes a row here
    mem = w["memory_per_row"]
    assert mem["rows"] > 0 and mem["rows_a_week"] == 108 * 24 * 7
    assert mem["bytes_per_row"] == pytest.approx(last["disk"]["memory"] / mem["rows"], abs=0.1)
    assert w["embedded_default_gb_per_week"] == pytest.approx(
        w["records_gb_per_week"] + mem["gb_per_week"]
        + sum(max(0.0, d["gb_per_week"]) for n, d in w["disk_growth"].items()
              if n not in ("run", "memory")), abs=1e-3)
    # written where the CLI says, the same figures
    saved = json.loads((out / "soak.json").read_text())
    assert saved["verdicts"] == v and len(saved["series"]) == len(series)
    text = render(r)
    assert "last quarter" in text and "memory_p99_ms" in text and "GB" in text
