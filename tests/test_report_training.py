"""`spade report` on a synthetic trainer metrics.jsonl with the step keys of
spade_async/core/trainer_metrics.py and a daemon status.json with its sample ledger: the
summary's `training` entry (steps per hour, samples per step, padded/real, tokens/s, KL to the
base, both sides' ledgers), training.png, and the page's rows."""

from __future__ import annotations

import json
import time

from typer.testing import CliRunner

from spade_async.cli import app
from spade_async.core.trainer_metrics import step_stats

PNG = b"\x89PNG\r\n\x1a\n"


def _step(i: int, t0: float) -> dict:
    return {"event": "step", "step": i, "time": t0 + 120 * i, "version": i,
            "samples": 6 if i % 2 else 10, "agent_samples": 5, "designer_samples": 1,
            "tokens": 400, "real_tokens": 1000 + 100 * i, "computed_tokens": 1500,
            "padding_ratio": 1500 / (1000 + 100 * i), "tokens_per_s": 100.0,
            "seq_tokens_per_s": (1000 + 100 * i) / 4.0, "step_s": 4.0, "lr": 1e-4,
            "loss": -0.01, "kl_base": 0.0005 * i, "logprob_abs_diff_base": 0.01 * i,
            "logprob_abs_diff_mean": 0.05,
            "dropped": {"stale": 1} if i == 3 else {},
            "totals": {"trained": 8 * i, "dropped": {"stale": 1} if i >= 3 else {}},
            "buffered": 2}


def test_report_summarises_training_and_the_sample_ledger(tmp_path):
    cfg = tmp_path / "spade.toml"
    cfg.write_text(f'[paths]\ndata_dir = "{tmp_path / "data"}"\n')
    t0 = time.time() - 3600
    metrics = tmp_path / "data" / "trainer" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    steps = [_step(i, t0) for i in range(1, 5)]
    metrics.write_text("".join(json.dumps(s) + "\n" for s in steps))
    run = tmp_path / "data" / "run"
    run.mkdir(parents=True)
    ledger = {"agent": {"played": 30, "written": 20, "dropped": {"hinted": 10}, "in_flight": 0},
              "designer": {"played": 4, "written": 4, "dropped": {}, "in_flight": 0}}
    (run / "status.json").write_text(json.dumps({"ledger": ledger, "endpoints": []}))

    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["report", "--config", str(cfg), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    t = json.loads(res.stdout)["training"]
    assert t["steps"] == 4
    assert t["steps_per_hour"] == 30.0  # 3 intervals of 120 s
    assert t["samples_per_step"] == 8.0  # 6, 10, 6, 10
    # ratios of sums: 6000 computed / 5000 real tokens; 1600 trained tokens / 16 s
    assert t["padding_ratio"] == 1.2 and t["tokens_per_s"] == 100.0
    assert t["seq_tokens_per_s"] == 312.5
    assert t["kl_base"] == 0.002 and t["logprob_abs_diff_base"] == 0.04
    assert t["ledger"]["daemon"] == ledger
    assert t["ledger"]["trainer"] == {"trained": 32, "dropped": {"stale": 1}, "buffered": 2,
                                      "source": "totals"}
    png = (out / "training.png").read_bytes()
    assert png.startswith(PNG) and len(png) > 2_000
    page = (out / "index.html").read_text()
    assert "4 steps, 30.0 per hour, 8 samples per step, 100.0 tok/s trained (312.5 of " \
        "sequence), padded/real 1.20, last KL to base 0.002" in page
    assert "agent 30 played, 20 written, dropped hinted 10; designer 4 played, 4 written; " \
        "trainer 32 trained, dropped stale 1, 2 buffered" in page

    res = CliRunner().invoke(app, ["report", "--config", str(cfg), "--out", str(out)])
    assert "training: 4 steps, 30.0 per hour" in res.stdout


def test_step_stats_of_an_older_file_fall_back_to_the_lines_figures():
    """Lines without the token counts: means of what each line says, None where nothing does."""
    steps = [{"event": "step", "step": 1, "time": 0.0, "samples": 4, "tokens_per_s": 10.0},
             {"event": "step", "step": 2, "time": 60.0, "samples": 6, "tokens_per_s": 20.0,
              "padding_ratio": 1.5}]
    s = step_stats(steps)
    assert (s["steps_per_hour"], s["samples_per_step"]) == (60.0, 5.0)
    assert (s["tokens_per_s"], s["padding_ratio"]) == (15.0, 1.5)
    assert s["kl_base"] is None and s["seq_tokens_per_s"] is None
    assert step_stats([])["steps"] == 0
