"""Paired comparisons of evaluations (spade_async/evals/paired.py) and where they are read:
the paired difference and its interval, tasks matched by id with the unpaired ones named,
`spade eval --compare-to` on stored results, `spade report`'s and `spade experiment report`'s
paired lines on synthetic stored results; and `probe-greedy`, the probe at temperature 0,
played through the real sandbox and episode runner against the fake endpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spade_async.cli import app
from spade_async.core.config import EndpointConfig, PoolConfig, SpadeConfig
from spade_async.evals import SUITES, make_suite
from spade_async.evals.base import EvalPolicy, SuiteResult, TaskResult, run_suite, store_result
from spade_async.evals.paired import (
    compare_stored,
    first_to_last,
    pair_tasks,
    paired_difference,
    paired_text,
    unpaired_text,
)
from spade_async.evals.probe import PROBE_SEED_BASE, ProbeSuite, probe_seeds
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.pool import EndpointPool
from spade_async.testing.fake.server import FakeOpenAIServer

# ---- the paired difference -----------------------------------------------------------------


def test_paired_difference_counts_gains_and_losses_with_an_interval():
    before = [True] * 20 + [False] * 80
    after = [True] * 18 + [False] * 2 + [True] * 22 + [False] * 58
    d = paired_difference(before, after)
    assert (d["n"], d["gained"], d["lost"]) == (100, 22, 2)
    assert d["difference"] == pytest.approx(0.20)
    # sd of the differences: 24 of 100 are +-1, mean 0.2 -> sqrt((0.24 - 0.04) * 100 / 99)
    half = 1.96 * ((0.24 - 0.04) * 100 / 99) ** 0.5 / 10
    assert d["ci95"] == pytest.approx([0.2 - half, 0.2 + half], abs=1e-4)
    assert d["ci95"][0] > 0  # a rise of 0.2 on 100 tasks is outside the paired interval
    # A fall is the mirror image.
    fall = paired_difference(after, before)
    assert (fall["difference"], fall["gained"], fall["lost"]) == (-0.2, 2, 22)
    assert fall["ci95"] == [-d["ci95"][1], -d["ci95"][0]]
    # No change at all: an interval of width 0; one task: nothing known of the spread.
    same = paired_difference(before, before)
    assert same["difference"] == 0 and same["ci95"] == [0.0, 0.0]
    assert paired_difference([0.0], [1.0])["ci95"] == [-1.0, 1.0]
    # Fractional scores (a held-out suite's) pair the same way.
    frac = paired_difference([0.5, 0.25, 1.0], [0.75, 0.25, 0.5])
    assert (frac["difference"], frac["gained"], frac["lost"]) == (round(-0.25 / 3, 4), 1, 1)
    with pytest.raises(ValueError):
        paired_difference([True], [True, False])
    with pytest.raises(ValueError):
        paired_difference([], [])


def test_the_bench_uses_the_one_paired_difference():
    from spade_async.bench import learn

    assert learn.paired_difference is paired_difference


def _task(task_id: str, score: float, failed: bool = False) -> dict:
    return {"task_id": task_id, "score": score, "passed": score >= 1.0, "failed": failed}


def test_tasks_pair_by_id_and_the_unpaired_are_named():
    before = [_task("a", 0), _task("b", 1), _task("c", 0), _task("d", 0, failed=True),
              _task("e", 1), _task("gone", 1)]
    after = [_task("e", 1), _task("c", 1), _task("b", 0, failed=True), _task("a", 1),
             _task("d", 1), _task("new", 0)]
    p = pair_tasks(before, after)
    # paired: a (0 -> 1), c (0 -> 1), e (1 -> 1); b failed after, d failed before
    assert (p["n"], p["gained"], p["lost"]) == (3, 2, 0)
    assert p["difference"] == round(2 / 3, 4)
    assert (p["before_mean"], p["after_mean"]) == (round(1 / 3, 4), 1.0)
    assert p["unpaired"] == {"only_before": ["gone"], "only_after": ["new"],
                             "failed": ["b", "d"]}
    assert paired_text(p).startswith("+0.667 [") and "(n=3, 2 gained, 0 lost;" in paired_text(p)
    assert unpaired_text(p, "v0", "v2") == ("2 not scored in v0 or v2 (b, d); 1 only in v0 "
                                            "(gone); 1 only in v2 (new)")
    assert unpaired_text(pair_tasks(before[:1], after[3:4]), "v0", "v2") == ""
    many = [_task(f"t{i}", 0, failed=True) for i in range(8)]
    assert unpaired_text(pair_tasks(many, many), "v0", "v1").endswith("t4, +3 more)")
    nothing = pair_tasks([_task("a", 1, failed=True)], [_task("a", 1)])
    assert nothing["n"] == 0 and nothing["difference"] is None
    assert paired_text(nothing) == "no task scored in both"


# ---- stored results ------------------------------------------------------------------------


def _store(data_dir: Path, suite: str, version: int, solved: list[bool],
           failed: frozenset[int] = frozenset(), time: float = 0.0) -> None:
    """One stored run of `suite` at `version`: task i is probe task `v/<seed i>`."""
    tasks = [TaskResult(f"v/{PROBE_SEED_BASE + i}", float(s), s, failed=i in failed)
             for i, s in enumerate(solved)]
    scored = [t for t in tasks if not t.failed]
    rate = sum(t.passed for t in scored) / len(scored)
    store_result(data_dir, SuiteResult(
        suite=suite, version=version, model=f"policy-v{version}", n=len(tasks),
        scored=len(scored), score=rate, passed=rate, errors=len(failed), seconds=1.0,
        time=time or 1_000.0 + version, tasks=tasks))


# 200 tasks: v0 solves the first 50; v4 keeps 45 of them and gains 40 more (a rise of 0.175)
V0 = [i < 50 for i in range(200)]
V4 = [i < 45 or 100 <= i < 140 for i in range(200)]


def _config(tmp: Path, extra: str = "") -> Path:
    cfg = tmp / "spade.toml"
    cfg.write_text(f'[paths]\ndata_dir = "{tmp / "data"}"\n[memory]\n'
                   f'embedding_model = "hash-384"\n{extra}')
    return cfg


def test_compare_stored_versions(tmp_path):
    data = tmp_path / "data"
    _store(data, "probe", 0, V0, failed=frozenset({199}))
    _store(data, "probe", 4, V4, failed=frozenset({47}))
    p = compare_stored("probe", (data, 0), (data, 4))
    assert (p["suite"], p["before"], p["after"]) == ("probe", 0, 4)
    assert (p["n"], p["gained"], p["lost"]) == (198, 40, 4)  # task 47 (a loss) is not paired
    assert p["difference"] == round(36 / 198, 4) and p["ci95"][0] > 0
    assert p["unpaired"]["failed"] == [f"v/{PROBE_SEED_BASE + i}" for i in (47, 199)]
    assert compare_stored("probe", (data, 0), (data, 5)) is None  # v5 is not stored
    # first to last over results.jsonl rows; an external model's rows are not versions
    rows = [{"suite": "probe", "version": 0}, {"suite": "probe", "version": 4},
            {"suite": "probe", "version": 9, "external": True}, {"suite": "x", "version": 7}]
    assert first_to_last(data, rows, "probe") == p
    assert first_to_last(data, rows[:1], "probe") is None


def test_spade_eval_compare_to_on_stored_results(tmp_path):
    cfg = _config(tmp_path)
    data = tmp_path / "data"
    for suite in ("probe", "probe-greedy"):
        _store(data, suite, 0, V0)
        _store(data, suite, 4, V4 if suite == "probe" else V0, failed=frozenset({3}))
    runner = CliRunner()
    res = runner.invoke(app, ["eval", "--config", str(cfg), "--suite", "probe", "--suite",
                              "probe-greedy", "--version", "4", "--compare-to", "0",
                              "--stored", "--json"])
    assert res.exit_code == 0, res.output
    probe, greedy = json.loads(res.stdout)
    assert (probe["suite"], probe["version"], probe["scored"]) == ("probe", 4, 199)
    p = probe["paired"]
    assert (p["before"], p["after"], p["n"], p["gained"], p["lost"]) == (0, 4, 199, 40, 5)
    assert p["difference"] == round(35 / 199, 4) and p["ci95"][0] > 0
    assert p["unpaired"] == {"only_before": [], "only_after": [],
                             "failed": [f"v/{PROBE_SEED_BASE + 3}"]}
    g = greedy["paired"]
    assert (g["n"], g["difference"], g["ci95"], g["gained"], g["lost"]) == (
        199, 0.0, [0.0, 0.0], 0, 0)

    res = runner.invoke(app, ["eval", "--config", str(cfg), "--suite", "probe", "--version",
                              "4", "--compare-to", "0", "--stored"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith("probe v4 (stored): score 0.42")
    lo, hi = p["ci95"]
    assert lines[1] == (f"  paired v4 - v0: +0.176 [{lo:+.3f}, {hi:+.3f}] (n=199, 40 gained, "
                        f"5 lost; above 0); v0 0.246 -> v4 0.422")
    assert lines[2] == f"    not paired: 1 not scored in v0 or v4 (v/{PROBE_SEED_BASE + 3})"

    # A version with nothing stored: said, and exit 1; --stored alone is a usage error.
    res = runner.invoke(app, ["eval", "--config", str(cfg), "--suite", "probe", "--version",
                              "6", "--compare-to", "0", "--stored"])
    assert res.exit_code == 1
    assert "paired v6 - v0: no per-task results of probe stored for v6" in res.stdout
    res = runner.invoke(app, ["eval", "--config", str(cfg), "--suite", "probe", "--stored"])
    assert res.exit_code == 2 and "give --compare-to N" in res.output
    # Evaluating against a base that was never stored fails before anything is evaluated.
    res = runner.invoke(app, ["eval", "--config", str(cfg), "--suite", "probe", "--version",
                              "0", "--compare-to", "3"])
    assert res.exit_code == 2 and "no per-task results of probe stored for v3" in res.output


def test_report_pairs_the_probe_suites_first_and_last_versions(tmp_path):
    cfg = _config(tmp_path)
    data = tmp_path / "data"
    _store(data, "probe", 0, V0)
    _store(data, "probe", 2, V0)
    _store(data, "probe", 4, V4)
    _store(data, "probe-greedy", 0, V0)
    _store(data, "probe-greedy", 4, V0[::-1])  # the same rate, other tasks: 50 up, 50 down
    out = tmp_path / "report"
    runner = CliRunner()
    res = runner.invoke(app, ["report", "--config", str(cfg), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert [r["version"] for r in s["probe"]] == [0, 2, 4]
    assert [(r["version"], r["solved"], r["n"]) for r in s["probe_greedy"]] == [
        (0, 50, 200), (4, 50, 200)]
    pp, pg = s["probe_paired"]["probe"], s["probe_paired"]["probe-greedy"]
    assert (pp["before"], pp["after"], pp["n"], pp["gained"], pp["lost"]) == (0, 4, 200, 40, 5)
    assert pp["difference"] == 0.175 and pp["ci95"][0] > 0
    assert (pg["difference"], pg["gained"], pg["lost"]) == (0.0, 50, 50)
    assert pg["ci95"][0] < 0 < pg["ci95"][1]
    page = (out / "index.html").read_text()
    assert "probe v4 - v0: +0.175 [" in page and "probe-greedy v4 - v0: +0.000 [" in page
    assert "<td>probe-greedy</td><td>4</td><td>50</td><td>200</td>" in page

    res = runner.invoke(app, ["report", "--config", str(cfg), "--out", str(out)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    lo, hi = pp["ci95"]
    assert (f"paired: probe v4 - v0: +0.175 [{lo:+.3f}, {hi:+.3f}] (n=200, 40 gained, 5 lost; "
            f"above 0)") in lines
    assert any(x.startswith("paired: probe-greedy v4 - v0: +0.000 [") and
               x.endswith("(n=200, 50 gained, 50 lost; within noise)") for x in lines)
    assert any(x.startswith("probe-greedy: v0: 25% of 200 solved") for x in lines)


def test_experiment_report_pairs_each_arm_and_arm_against_arm(tmp_path):
    from spade_async.core.config import load_config
    from spade_async.experiment import report
    from spade_async.experiment.layout import arm_dir, write_arm_config
    from spade_async.experiment.state import ExperimentState

    base = _config(tmp_path, '[experiment]\nname = "e"\nsuites = ["probe", "probe-greedy"]\n')
    cfg = load_config(base, environ={})
    exp = tmp_path / "exp"
    ExperimentState.open(exp, name="e", arms=["spade", "fixed"], budget="versions=4",
                         config=base)
    for arm in ("spade", "fixed"):
        write_arm_config(cfg, base, exp, arm)
    spade, fixed = arm_dir(exp, "spade"), arm_dir(exp, "fixed")
    for suite in ("probe", "probe-greedy"):
        _store(spade, suite, 0, V0)
        _store(spade, suite, 4, V4)
        _store(fixed, suite, 0, V0)
    _store(fixed, "probe", 3, [i < 45 for i in range(200)])  # fixed stops on v3, 5 lost
    rep = report.collect(exp)

    sp = rep["arms"]["spade"]["paired"]["probe"]
    assert (sp["before"], sp["after"], sp["n"], sp["difference"]) == (0, 4, 200, 0.175)
    fx = rep["arms"]["fixed"]["paired"]
    assert set(fx) == {"probe"}  # probe-greedy has v0 alone in the fixed arm
    assert (fx["probe"]["after"], fx["probe"]["difference"], fx["probe"]["lost"]) == (
        3, -0.025, 5)
    arms = rep["paired_arms"]
    vs = arms["spade - fixed / probe"]
    assert (vs["arms"], vs["versions"], vs["n"]) == (["spade", "fixed"], [4, 3], 200)
    assert (vs["difference"], vs["gained"], vs["lost"]) == (0.2, 40, 0)
    assert arms["spade - fixed / probe-greedy"]["versions"] == [4, 0]
    # the unpaired difference at the last common version is still there
    assert rep["comparison"]["spade vs fixed / probe"]["version"] == 0

    text = report.text(rep).splitlines()
    lo, hi = vs["ci95"]
    assert (f"  spade - fixed / probe (v4 vs v3): +0.200 [{lo:+.3f}, {hi:+.3f}] (n=200, 40 "
            f"gained, 0 lost; above 0)") in text
    assert any(x.startswith("  spade / probe: v4 - v0: +0.175 [") for x in text)
    assert any(x.startswith("  fixed / probe: v3 - v0: -0.025 [") for x in text)
    assert not any(x.startswith("  fixed / probe-greedy:") for x in text)


# ---- probe-greedy, played ------------------------------------------------------------------


def test_probe_greedy_is_a_suite_of_the_same_tasks():
    cfg = SpadeConfig.model_validate({"rollout": {"temperature": 0.7},
                                      "daemon": {"designer_temperature": 0.7},
                                      "eval": {"probe_seeds": 2}})
    sampled, greedy = make_suite("probe", cfg), make_suite("probe-greedy", cfg)
    assert "probe-greedy" in SUITES
    assert isinstance(greedy, ProbeSuite) and greedy.name == "probe-greedy"
    assert [t.task_id for t in greedy.tasks()] == [t.task_id for t in sampled.tasks()]
    assert (sampled.play_cfg.temperature, greedy.play_cfg.temperature) == (0.7, 0.0)
    assert greedy.play_cfg.top_p == sampled.play_cfg.top_p and cfg.rollout.temperature == 0.7


@pytest.fixture(scope="module")
def chat(checkpoint) -> ChatTokens:
    return ChatTokens.from_pretrained(checkpoint)


async def test_probe_greedy_plays_at_temperature_zero(chat):
    """The same episodes as the sampled probe, request seeds and all; only the temperature
    the fake endpoint receives differs."""
    cfg = SpadeConfig.model_validate({
        "rollout": {"temperature": 0.7, "max_tokens_per_turn": 8},
        "daemon": {"designer_temperature": 0.7},
        "sandbox": {"slots": 2, "warm_workers": 1},
        "eval": {"probe_seeds": 2, "probe_variants": [{"family": "date_arithmetic"}]}})
    server = FakeOpenAIServer()
    server.start()
    try:
        async with EndpointPool([EndpointConfig(name="fake", base_url=server.base_url)],
                                PoolConfig()) as pool:
            policy = EvalPolicy(pool, chat, model="policy", version=0)
            got = {}
            for greedy in (False, True):
                sent = len(server.state.completions)
                suite = ProbeSuite.from_config(cfg, greedy=greedy)
                async with suite:
                    got[suite.name] = (await run_suite(suite, policy, concurrency=2),
                                       server.state.completions[sent:])
    finally:
        server.stop()
    (sampled, s_sent), (greedy, g_sent) = got["probe"], got["probe-greedy"]
    assert (greedy.suite, greedy.n, greedy.scored) == ("probe-greedy", 2, 2)
    assert {b["temperature"] for b in g_sent} == {0.0}
    assert {b["temperature"] for b in s_sent} == {0.7}
    seeds = sorted(b["seed"] for b in g_sent)
    assert seeds == sorted(b["seed"] for b in s_sent) and set(probe_seeds(2)) <= set(seeds)
    assert [t.task_id for t in greedy.tasks] == [t.task_id for t in sampled.tasks]
    assert {t.detail["temperature"] for t in greedy.tasks} == {0.0}
    assert {t.detail["temperature"] for t in sampled.tasks} == {0.7}


# ---- a past version on a full-weight server --------------------------------------------------


def test_eval_of_a_past_version_reloads_its_weights_then_the_newest(fake, checkpoint, tmp_path):
    """A vllm-reload server holds one version: `spade eval --version 0` reloads the base
    checkpoint, evaluates, and reloads the newest published version after; refused while the
    daemon runs."""
    import os

    server, _chat = fake
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    (data / "models" / "smollm2").symlink_to(checkpoint)
    v2 = data / "weights" / "v2"
    v2.mkdir(parents=True)
    (v2 / "model.safetensors").write_bytes(b"stand-in: the fake server never reads it")
    (data / "weights" / "current.json").write_text(json.dumps(
        {"version": 2, "model": "policy"}))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[paths]\ndata_dir = "{data}"\n[model]\ncheckpoint_name = "smollm2"\n'
                   f'[[endpoints]]\nname = "fake"\nbase_url = "{server.base_url}"\n'
                   '[endpoints.weight_swap]\ntype = "vllm-reload"\n'
                   '[eval]\nprobe_seeds = 1\nprobe_variants = [{family = "arithmetic"}]\n'
                   '[sandbox]\nslots = 2\nwarm_workers = 1\n')
    server.state.calls.clear()
    runner = CliRunner()
    res = runner.invoke(app, ["eval", "-c", str(cfg), "--version", "0", "--suite", "probe",
                              "--json"], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.exit_code == 0, res.output
    assert server.state.calls.count("reload_weights") == 2
    assert server.state.weights_path == str(v2.resolve())  # the newest is back
    assert server.state.weight_version == "2"
    rows = json.loads(res.stdout[res.stdout.index("["):])
    assert rows[0]["version"] == 0 and rows[0]["scored"] == 1
    # a running daemon (its status names a live pid): refused, nothing reloaded
    run = data / "run"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"pid": os.getpid(), "updated_at": 0}))
    server.state.calls.clear()
    res = runner.invoke(app, ["eval", "-c", str(cfg), "--version", "0", "--suite", "probe"])
    assert res.exit_code == 2 and "stop the loop first" in res.output
    assert "reload_weights" not in server.state.calls


def test_eval_asks_a_full_weight_server_which_version_it_holds(fake, checkpoint, tmp_path):
    """A fresh vllm-reload server (scripts/inference.sh) holds the base, whatever current.json
    names: vLLM reports weight_version "default" until a swap sets one. `--version 0` then
    evaluates without reloading; the newest version is reloaded before it is evaluated
    (it used to be evaluated on the base weights), and left there."""
    import os

    server, _chat = fake
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    (data / "models" / "smollm2").symlink_to(checkpoint)
    v2 = data / "weights" / "v2"
    v2.mkdir(parents=True)
    (v2 / "model.safetensors").write_bytes(b"stand-in: the fake server never reads it")
    (data / "weights" / "current.json").write_text(json.dumps(
        {"version": 2, "model": "policy"}))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[paths]\ndata_dir = "{data}"\n[model]\ncheckpoint_name = "smollm2"\n'
                   f'[[endpoints]]\nname = "fake"\nbase_url = "{server.base_url}"\n'
                   '[endpoints.weight_swap]\ntype = "vllm-reload"\n'
                   '[eval]\nprobe_seeds = 1\nprobe_variants = [{family = "arithmetic"}]\n'
                   '[sandbox]\nslots = 2\nwarm_workers = 1\n')
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    runner = CliRunner()
    server.state.calls.clear()
    server.state.weight_version = "default"  # a fresh server: the base it started from
    res = runner.invoke(app, ["eval", "-c", str(cfg), "--version", "0", "--suite", "probe",
                              "--json"], env=env)
    assert res.exit_code == 0, res.output
    assert "reload_weights" not in server.state.calls and server.state.weight_version == "default"
    res = runner.invoke(app, ["eval", "-c", str(cfg), "--version", "2", "--suite", "probe",
                              "--json"], env=env)
    assert res.exit_code == 0, res.output
    assert server.state.calls.count("reload_weights") == 1  # v2 in, and no reload back
    assert server.state.weights_path == str(v2.resolve()) and server.state.weight_version == "2"
    # a version not published yet: a clear error, nothing reloaded
    res = runner.invoke(app, ["eval", "-c", str(cfg), "--version", "3", "--suite", "probe"],
                        env=env)
    assert res.exit_code == 2 and "not published yet" in res.output
    assert server.state.calls.count("reload_weights") == 1
