"""`spade status` accounting for every sample, from real files: the daemon's status.json (its
ledger and token counts), a spool with batches the trainer has not taken, the trainer's
metrics.jsonl (the step keys of spade_async/core/trainer_metrics.py, or an older file without
`totals`) and a saved `spade bench inference` result."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from typer.testing import CliRunner

from spade_async.cli import app
from spade_async.core.spool.batch import Sample
from spade_async.core.spool.files import FileSpool


def _config(tmp: Path) -> Path:
    cfg = tmp / "spade.toml"
    cfg.write_text(f'[paths]\ndata_dir = "{tmp / "data"}"\n'
                   '[[endpoints]]\nname = "cpu"\nbase_url = "http://127.0.0.1:1"\n'
                   '[endpoints.weight_swap]\ntype = "vllm-lora"\n'
                   "[daemon]\nmax_batches_ahead = 2\nmax_staleness = 3\n"
                   "[trainer]\nmax_staleness = 3\n")
    return cfg


def _status(tmp: Path, **extra) -> None:
    run = tmp / "data" / "run"
    run.mkdir(parents=True, exist_ok=True)
    st = {"pid": os.getpid(), "updated_at": time.time(), "uptime_s": 600.0, "iterations": 7,
          "policy_version": 4, "model": "policy-v4", "endpoints": [], "stopped": False,
          "counters": {"episodes": 40, "designs": 8, "batches": 3, "samples": 6,
                       "samples_stale_dropped": 1, "tokens_sampled": 5000}, **extra}
    (run / "status.json").write_text(json.dumps(st))


LEDGER = {"agent": {"played": 40, "written": 5, "in_flight": 5,
                    "dropped": {"hinted": 16, "zero_variance": 12, "failed": 2}},
          "designer": {"played": 8, "written": 1, "in_flight": 0,
                       "dropped": {"zero_variance": 6, "stale": 1}}}
TOKENS = {"roles": {"agent": {"requests": 120, "sampled": 5000, "prompt": 90000},
                    "designer": {"requests": 8, "sampled": 1000, "prompt": 8000}},
          "sampled": 6000, "prompt": 98000, "seconds": 600.0, "sampled_per_s": 10.0,
          "prompt_per_s": 163.33,
          "window": {"seconds": 60.0, "sampled_per_s": 20.0, "prompt_per_s": 300.0}}


def _spool(tmp: Path, batches: list[int], taken: int) -> None:
    spool = FileSpool(tmp / "data" / "spool", writer=True)
    for b, n in enumerate(batches):
        spool.write([Sample(f"s{b}-{i}", "agent", "e", 0, [1, 2, 3], [0, 1, 1],
                            [0.0, -1.0, -0.5], 1.0, 1.0) for i in range(n)])
    spool.mark_taken(taken)
    spool.close()


def _metrics(tmp: Path, rows: list[dict]) -> None:
    path = tmp / "data" / "trainer" / "metrics.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _step(i: int, t0: float, **kw) -> dict:
    return {"event": "step", "step": i, "time": t0 + 60 * i, "version": i, "samples": 4,
            "agent_samples": 3, "designer_samples": 1, "tokens": 200, "real_tokens": 800,
            "computed_tokens": 1000, "padding_ratio": 1.25, "tokens_per_s": 50.0,
            "seq_tokens_per_s": 200.0, "step_s": 4.0, "lr": 1e-4, "loss": -0.01,
            "kl_base": 0.001 * i, "logprob_abs_diff_base": 0.01 * i,
            "logprob_abs_diff_mean": 0.05, "staleness_mean": 1.0, **kw}


def test_status_accounts_for_every_sample_and_compares_the_loop_with_the_bench(tmp_path):
    cfg = _config(tmp_path)
    _status(tmp_path, ledger=LEDGER, tokens=TOKENS)
    _spool(tmp_path, [2, 2, 2], taken=1)  # batches 2 and 3 (4 samples) wait for the trainer
    t0 = time.time() - 600
    _metrics(tmp_path, [
        _step(1, t0, dropped={}, totals={"trained": 4, "dropped": {}}, buffered=0),
        _step(2, t0, dropped={"stale": 2}, totals={"trained": 8, "dropped": {"stale": 2}},
              buffered=1),
        # a line after the newest totals (no totals of its own): its drops still count
        {"event": "skipped", "time": t0 + 150, "step": 2, "dropped": {"designer_cap": 1}},
    ])
    bench = tmp_path / "data" / "bench" / "inference.json"
    bench.parent.mkdir(parents=True)
    bench.write_text(json.dumps({"measured_at": time.time(),
                                 "decode": {"concurrent": {"streams": 16, "tokens_per_s": 300.0}},
                                 "decode_adapter": {"streams": 16, "tokens_per_s": 200.0}}))

    res = CliRunner().invoke(app, ["status", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    lines = {ln[:10].strip(): ln[11:] for ln in res.stdout.splitlines()}
    assert lines["samples"] == (
        "48 played this daemon run (40 agent episodes, 8 designs): 6 written to the spool, 37 "
        "dropped by the daemon (agent: hinted 16, zero_variance 12, failed 2; designer: "
        "zero_variance 6, stale 1), 5 in flight; the trainer (over its life): 8 trained, 3 "
        "dropped (stale 2, designer_cap 1), 1 buffered, 4 waiting in the spool")
    assert lines["batches"] == ("3 written (6 samples); dropped as stale: 1 by the daemon, 2 by "
                                "the trainer")
    # the loop's 20 tok/s over the last minute and 10 over the run against 200 (16 streams
    # through an adapter: the endpoint is vllm-lora)
    assert lines["tokens"].startswith(
        "sampled 20.0 tok/s over the last 60 s, 10.0 over the run (designs 1000, episodes 5000 "
        "tokens), prompt 300.0 tok/s; 0.10x (last 60 s), 0.05x (run) of spade bench "
        "inference: 200.0 tok/s, 16 streams through a LoRA adapter, measured ")
    trainer = lines["trainer"]
    assert "last 2 steps: 4 samples/step, 60.0 steps/h" in trainer
    assert "50.0 tok/s trained (200.0 tok/s of sequence), padded/real 1.25" in trainer
    assert "KL to base 0.002" in trainer

    res = CliRunner().invoke(app, ["status", "--config", str(cfg), "--json"])
    st = json.loads(res.stdout)
    s = st["samples"]
    assert s["played"] == {"agent": 40, "designer": 8} and s["written"] == 6
    assert s["in_flight"] == 5 and s["waiting_in_spool"] == 4
    assert s["trainer"] == {"trained": 8, "dropped": {"designer_cap": 1, "stale": 2},
                            "buffered": 1, "source": "totals"}
    assert (st["tokens"]["ratio_window"], st["tokens"]["ratio_run"]) == (0.1, 0.05)
    assert st["trainer"]["recent"]["padding_ratio"] == 1.25
    # played = written + dropped + in flight, as the daemon counted it
    dropped = sum(sum(d.values()) for d in s["dropped_by_daemon"].values())
    assert sum(s["played"].values()) == s["written"] + dropped + s["in_flight"]


def test_status_reads_an_older_trainer_file_and_says_when_there_is_no_bench(tmp_path):
    """The case that hid: whole batches dropped as stale by the trainer ("skipped" lines, no
    totals) while status said 0; a batch trained again after a restart counts once."""
    cfg = _config(tmp_path)
    _status(tmp_path, ledger=LEDGER, tokens=TOKENS)
    _spool(tmp_path, [2, 3], taken=1)
    t0 = time.time() - 600
    path = tmp_path / "data" / "trainer" / "metrics.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"event": "step", "time": t0, "step": 1, "seq": 1, "samples": 8,
         "dropped": {"first_token_masked": 3},  # tokens, not samples: left out
         "tokens": 300, "tokens_per_s": 30.0, "loss": 0.1},
        {"event": "step", "time": t0 + 10, "step": 2, "seq": 2, "samples": 6,
         "dropped": {"stale": 1}, "tokens_per_s": 31.0, "loss": 0.1},
        {"event": "step", "time": t0 + 20, "step": 2, "seq": 2, "samples": 6,  # retrained
         "dropped": {"stale": 1}, "tokens_per_s": 31.0, "loss": 0.1},
        {"event": "skipped", "time": t0 + 30, "step": 2, "seq": 3, "dropped": {"stale": 12}},
        {"event": "skipped", "time": t0 + 40, "step": 2, "seq": 4, "dropped": {"stale": 12}},
    ]) + '{"event": "step", "ti')  # a torn last line
    res = CliRunner().invoke(app, ["status", "--config", str(cfg), "--json"])
    assert res.exit_code == 0, res.output
    st = json.loads(res.stdout)
    assert st["samples"]["trainer"] == {"trained": 14, "dropped": {"stale": 25},
                                        "buffered": None, "source": "summed"}
    assert st["tokens"]["ratio_run"] is None and "no `spade bench inference` result at " \
        f"{tmp_path / 'data' / 'bench' / 'inference.json'}" in st["tokens"]["bench"]["missing"]
    res = CliRunner().invoke(app, ["status", "--config", str(cfg)])
    lines = {ln[:10].strip(): ln[11:] for ln in res.stdout.splitlines()}
    assert lines["batches"].endswith("dropped as stale: 1 by the daemon, 25 by the trainer")
    assert lines["samples"].endswith("14 trained, 25 dropped (stale 25), ? buffered, 3 waiting "
                                     "in the spool")
    assert "no `spade bench inference` result at" in lines["tokens"]
    assert "KL to base -" in lines["trainer"] and "padded/real -" in lines["trainer"]


def test_status_of_a_daemon_without_a_ledger_says_so(tmp_path):
    cfg = _config(tmp_path)
    _status(tmp_path)
    res = CliRunner().invoke(app, ["status", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    assert "samples    no sample ledger in the daemon's status" in res.stdout
    assert "trainer    no step yet; taken 0 of 0 batches" in res.stdout


def _bench_report(adapter: float, base: float, no_lora: float | None = None) -> dict:
    report = {"host": {"cpu_model": "test cpu", "cores": 2, "flags": {}, "dtype": "bfloat16",
                       "dtype_reason": "test", "omp_threads_bind": "auto",
                       "threads_reason": "test"},
              "decode": {"single": {"streams": 1, "tokens_per_s": 20.0},
                         "concurrent": {"streams": 16, "tokens_per_s": base}, "ratio": 1.0},
              "decode_adapter": {"streams": 16, "tokens_per_s": adapter},
              "lora_load_s": {"first": 0.02, "median": 0.02, "n": 1},
              "full_reload_s": {"first": 0.2, "median": 0.2, "n": 1},
              "lora_cost": {"skipped": "test"},
              "hf_generate": {"dtype": "bfloat16", "threads": 2,
                              "single": {"tokens_per_s": 10.0},
                              "concurrent": {"tokens_per_s": 100.0}},
              "vs_hf": {"single_ratio": 2.0, "concurrent_ratio": 2.0}}
    if no_lora is not None:
        report["no_lora"] = {"start_s": 1.0,
                             "decode": {"concurrent": {"streams": 16, "tokens_per_s": no_lora}}}
    return report


def test_bench_inference_saves_what_status_compares_the_loop_with(tmp_path, monkeypatch):
    import spade_async.bench.inference as bench

    cfg = _config(tmp_path)
    _status(tmp_path, ledger=LEDGER, tokens=TOKENS)
    monkeypatch.setattr(bench, "run_inference_bench",
                        lambda *a, **kw: _bench_report(adapter=80.0, base=120.0))
    res = CliRunner().invoke(app, ["bench", "inference", "--config", str(cfg), "--json"])
    assert res.exit_code == 0, res.output
    saved = json.loads((tmp_path / "data" / "bench" / "inference.json").read_text())
    assert saved["decode_adapter"]["tokens_per_s"] == 80.0 and saved["measured_at"] > 0
    st = json.loads(CliRunner().invoke(app, ["status", "--config", str(cfg), "--json"]).stdout)
    # a vllm-lora endpoint: the adapter's 80 tok/s; the loop did 20 (last minute) and 10 (run)
    assert st["tokens"]["bench"]["tokens_per_s"] == 80.0
    assert (st["tokens"]["ratio_window"], st["tokens"]["ratio_run"]) == (0.25, 0.125)


def test_the_bench_figure_follows_each_endpoints_swap():
    from spade_async.bench.saved import loop_reference
    from spade_async.core.config import EndpointConfig, SpadeConfig

    def cfg(*swaps: str) -> SpadeConfig:
        return SpadeConfig(endpoints=[
            EndpointConfig(name=f"e{i}", base_url="http://x", weight_swap={"type": s})
            for i, s in enumerate(swaps)])

    with_plain = _bench_report(adapter=80.0, base=120.0, no_lora=150.0)
    assert loop_reference(cfg("vllm-lora"), with_plain)["tokens_per_s"] == 80.0
    # vllm-reload serves the base model without --enable-lora: that server's figure, else the
    # base model on the LoRA server (a bench run against --base-url measures only that one)
    assert loop_reference(cfg("vllm-reload"), with_plain)["tokens_per_s"] == 150.0
    assert loop_reference(cfg("vllm-reload"), _bench_report(80.0, 120.0))["tokens_per_s"] == 120.0
    two = loop_reference(cfg("vllm-lora", "vllm-lora"), with_plain)
    assert (two["tokens_per_s"], two["endpoints"]) == (160.0, 2)
    assert "endpoint e1: no bench figure for a 'none' endpoint" in \
        loop_reference(cfg("vllm-lora", "none"), with_plain)["missing"]
    assert "no `spade bench inference` result" in loop_reference(cfg("vllm-lora"), None)["missing"]
