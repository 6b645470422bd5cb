"""`spade bench report` at a test size: a synthetic run in rolled segments, `spade report` read
every episode of it (in a child process whose peak RSS is the figure)."""

from __future__ import annotations

from spade_async.bench.report_rss import run_report_bench


def test_report_bench_reads_every_rolled_episode(tmp_path):
    r = run_report_bench(tmp_path, gb=0.004)
    assert r["transcripts_gb"] >= 0.0035 and r["episodes"] > 1000
    assert r["episodes_reported"] == r["episodes"]
    assert 0 < r["report_peak_rss_mb"] < 4096 and r["report_seconds"] > 0
    assert not (tmp_path / "data").exists()  # removed unless kept
