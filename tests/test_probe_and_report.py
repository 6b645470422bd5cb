"""Designer moves and the curriculum in `spade status` and `spade report`, and the probe suite.

The status line and the report are checked on fixture files in the form the daemon writes
(status.json counters, designs.jsonl / plays.jsonl with move, family, params, variant_id). The
probe suite's task list is checked to be fixed; it is played end to end through the real sandbox
and the real episode runner against the fake endpoint (a scripted agent that solves only the
easy variant, so the solve rate is known exactly) and, marked slow, against the real vLLM server.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memory_db.schema import variant_id
from spade_async.cli import app
from spade_async.core.config import (
    ConfigError,
    EndpointConfig,
    PoolConfig,
    RolloutConfig,
    SandboxConfig,
    SpadeConfig,
)
from spade_async.envs.knobs import easiest_point, resolve_params
from spade_async.envs.seed_checks import load_checked_config as load_config
from spade_async.evals import SUITES
from spade_async.evals.base import EvalPolicy, run_suite, store_result, wilson_interval
from spade_async.evals.probe import (
    PROBE_SEED_BASE,
    SEEDS_DIR,
    ProbeSuite,
    default_probe_variants,
    family_knobs,
    probe_seeds,
    resolve_probe_variants,
    seed_families,
)
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.pool import EndpointPool
from spade_async.report.figures import PLOTS
from spade_async.testing.fake.server import FakeOpenAIServer

PNG = b"\x89PNG\r\n\x1a\n"

# A seed with knobs of every type: the number to echo has `digits` digits.
ECHO = '''import random


class Environment:
    name = "echo_digits"
    description = "Reply with the number you are shown."
    max_turns = 1
    tools = []
    params = {
        "digits": {"type": "int", "min": 1, "max": 6, "default": 3},
        "scale": {"type": "float", "min": 0.5, "max": 2.0, "default": 1.0},
        "style": {"type": "choice", "choices": ["plain", "spaced"], "default": "spaced"},
        "loud": {"type": "bool", "default": True},
    }

    def reset(self, seed, params=None):
        p = params or {}
        d = p.get("digits", 3)
        self.n = random.Random(seed).randint(10 ** (d - 1), 10 ** d - 1)
        return f"say {self.n}", {}

    def step(self, action):
        ok = action.strip() == str(self.n)
        return "done", 1.0 if ok else 0.0, True, False, {}

    def hint(self):
        return "repeat the number"
'''

PLAIN = '''class Environment:
    name = "plain"
    description = "Reply ok."
    max_turns = 1

    def reset(self, seed):
        return "say ok", {}

    def step(self, action):
        return "done", float(action.strip() == "ok"), True, False, {}

    def hint(self):
        return "ok"
'''


def _config(tmp: Path, extra: str = "") -> Path:
    cfg = tmp / "spade.toml"
    cfg.write_text(f'[paths]\ndata_dir = "{tmp / "data"}"\n[memory]\n'
                   f'embedding_model = "hash-384"\n{extra}')
    return cfg


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# ---- spade status ------------------------------------------------------------------------


def _status(tmp: Path, counters: dict) -> None:
    (tmp / "data" / "run").mkdir(parents=True)
    (tmp / "data" / "run" / "status.json").write_text(json.dumps({
        "pid": os.getpid(), "updated_at": time.time(), "uptime_s": 90, "iterations": 3,
        "policy_version": 1, "model": "policy-v1", "counters": counters}))


def test_status_shows_moves_by_kind(tmp_path):
    cfg = _config(tmp_path)
    _status(tmp_path, {"designs": 100, "designs_accepted": 58,
                       "moves_write_proposed": 40, "moves_write_accepted": 0,
                       "moves_write_played": 0, "moves_edit_proposed": 60,
                       "moves_edit_accepted": 58, "moves_edit_played": 55})
    runner = CliRunner()
    res = runner.invoke(app, ["status", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    assert ("moves      write 40 proposed, 0 accepted, 0 played; edit 60 proposed, 58 "
            "accepted, 55 played (92%)") in res.stdout.splitlines()
    res = runner.invoke(app, ["status", "--config", str(cfg), "--json"])
    st = json.loads(res.stdout)
    assert st["counters"]["moves_edit_played"] == 55
    assert st["moves"]["edit"] == {"proposed": 60, "accepted": 58, "played": 55,
                                   "played_share": round(55 / 60, 4)}
    assert st["moves"]["write"]["played_share"] == 0.0


def test_status_of_a_daemon_without_move_counters_has_no_moves_line(tmp_path):
    cfg = _config(tmp_path)
    _status(tmp_path, {"designs": 3})
    res = CliRunner().invoke(app, ["status", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    assert "moves " not in res.stdout and "designs    3 proposed" in res.stdout


# ---- spade report: moves, curriculum, probe -------------------------------------------------


def _run_files(tmp: Path) -> float:
    """A run where the designer wrote `echo_digits` (knob digits at its default 3), then edited
    it twice, to 2 and to 1; one edit was invalid; `plain` (no knobs) was written too."""
    t0 = time.time() - 3600
    run = tmp / "data" / "run"
    e = "e" * 16
    p3 = {"digits": 3, "loud": True}
    vid = {d: variant_id(e, p3 | {"digits": d}) for d in (1, 2, 3)}
    base = {"doc_id": "d", "chunk_id": "c", "policy_version": 0, "reason": "",
            "completion_tokens": 10, "progress": 1.0}
    _write_jsonl(run / "designs.jsonl", [
        {**base, "time": t0, "design_id": "w1", "move": "write", "parent": None,
         "params": None, "variant_id": e, "family": "echo_digits", "status": "accepted",
         "env_id": e},
        {**base, "time": t0 + 5, "design_id": "w2", "move": "write", "parent": None,
         "params": None, "variant_id": None, "family": None, "status": "invalid",
         "reason": "static.parse", "env_id": None},
        {**base, "time": t0 + 6, "design_id": "w3", "move": "write", "parent": None,
         "params": None, "variant_id": "p" * 16, "family": "plain", "status": "accepted",
         "env_id": "p" * 16},
        {**base, "time": t0 + 600, "design_id": "x1", "move": "edit", "parent": e,
         "params": {"digits": 2}, "variant_id": vid[2], "family": "echo_digits",
         "status": "accepted", "env_id": e},
        {**base, "time": t0 + 700, "design_id": "x2", "move": "edit", "parent": e,
         "params": {"digits": 9}, "variant_id": None, "family": "echo_digits",
         "status": "invalid", "reason": "static.params", "env_id": e},
        {**base, "time": t0 + 1200, "design_id": "x3", "move": "edit", "parent": e,
         "params": {"digits": 1}, "variant_id": vid[1], "family": "echo_digits",
         "status": "accepted", "env_id": e},
    ])

    def play(t: float, digits: int | None, move: str, unhinted: list[float]) -> dict:
        params = {} if digits is None else p3 | {"digits": digits}
        return {"time": t, "env_id": e if digits else "p" * 16,
                "variant_id": vid[digits] if digits else "p" * 16, "params": params,
                "name": "echo_digits" if digits else "plain", "move": move,
                "replayed": move == "replay", "policy_version": 0, "unhinted": unhinted,
                "hinted": [1.0, 1.0], "r_unhinted": sum(unhinted) / len(unhinted),
                "r_hinted": 1.0, "regret": 0.5, "feasible": True, "designer_reward": 0.5,
                "learnability": 0.2, "signal": 0.5}

    _write_jsonl(run / "plays.jsonl", [
        play(t0 + 60, 3, "write", [0.0, 0.0, 0.0, 0.5]),
        play(t0 + 70, None, "write", [1.0, 1.0, 0.0, 0.0]),
        play(t0 + 660, 2, "edit", [0.0, 1.0, 0.0, 0.0]),
        play(t0 + 1260, 1, "edit", [1.0, 1.0, 1.0, 0.0]),
        play(t0 + 1900, 1, "replay", [1.0, 1.0, 0.0, 1.0]),
        play(t0 + 1950, 3, "replay", [1.0, 1.0, 0.0, 0.0]),
    ])
    _write_jsonl(tmp / "data" / "eval" / "results.jsonl", [
        {"suite": "probe", "version": 0, "model": "policy", "n": 16, "scored": 16,
         "score": 0.25, "passed": 0.25, "errors": 0, "seconds": 3.0, "time": t0 + 100},
        {"suite": "reasoning-gym", "version": 0, "model": "policy", "n": 6, "scored": 6,
         "score": 0.5, "passed": 0.5, "errors": 0, "seconds": 3.0, "time": t0 + 110},
        {"suite": "probe", "version": 1, "model": "policy-v1", "n": 16, "scored": 15,
         "score": 0.6, "passed": 0.6, "errors": 1, "seconds": 3.0, "time": t0 + 2000},
    ])
    return t0


def test_report_shows_moves_curriculum_and_probe(tmp_path):
    cfg = _config(tmp_path)
    _run_files(tmp_path)
    out = tmp_path / "report"
    runner = CliRunner()
    res = runner.invoke(app, ["report", "--config", str(cfg), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)

    m = s["moves"]
    assert m["write"] == {"proposed": 3, "accepted": 2, "played": 2, "played_share": 0.6667}
    assert m["edit"] == {"proposed": 3, "accepted": 2, "played": 2, "played_share": 0.6667}
    assert m["replay"] == {"played": 2} and m["fixed"] == {"played": 0}
    total = sum(v for row in m["timeline"] for k, v in row.items() if k != "minute")
    assert total == 3 + 2 + 3 + 2 + 6  # every design, acceptance and play, in some bin

    # The knob moved 3 -> 2 -> 1; `loud` never moved; `plain` has no knobs: no curriculum.
    assert s["curriculum"] == [
        {"family": "echo_digits", "knob": "digits", "first": 3, "last": 1, "edits": 2,
         "changes": 2, "solve_first": 0.25, "n_first": 8, "solve_last": 0.75, "n_last": 8},
        {"family": "echo_digits", "knob": "loud", "first": True, "last": True, "edits": 2,
         "changes": 0, "solve_first": 0.25, "n_first": 8, "solve_last": 0.75, "n_last": 8}]
    (fam,) = s["curriculum_families"]
    assert [pt["params"]["digits"] for pt in fam["series"]] == [3, 2, 1]
    assert [pt["by"] for pt in fam["series"]] == ["write", "edit", "edit"]
    assert fam["edits_proposed"] == 3 and fam["plays"] == 5
    assert fam["solve_last"]["ci95"] == [round(x, 4) for x in wilson_interval(6, 8)]

    # The probe per version (the held-out suite is not in it), with Wilson intervals.
    assert s["probe"] == [
        {"version": 0, "solve_rate": 0.25, "solved": 4, "n": 16,
         "ci95": [round(x, 4) for x in wilson_interval(4, 16)]},
        {"version": 1, "solve_rate": 0.6, "solved": 9, "n": 15,
         "ci95": [round(x, 4) for x in wilson_interval(9, 15)]}]

    page = (out / "index.html").read_text()
    for name, title, _ in PLOTS:
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 2_000, name
        assert f'src="{name}"' in page and title in page
    assert "<td>echo_digits</td><td>digits</td><td>3</td><td>1</td><td>2</td>" in page
    assert "25% of 8" in page and "75% of 8" in page

    res = runner.invoke(app, ["report", "--config", str(cfg), "--out", str(out)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert ("moves: write 3 proposed, 2 accepted, 2 played (67%); edit 3 proposed, 2 "
            "accepted, 2 played (67%); replay 2 played") in lines
    row = next(line for line in lines if re.match(r"\s+echo_digits\s+digits", line))
    assert row.split() == ["echo_digits", "digits", "3", "1", "2", "25%", "of", "8", "75%",
                           "of", "8"]
    assert any(line.startswith("probe: v0: 25% of 16 solved, 95% interval [0.10, 0.49]")
               for line in lines)


def test_report_of_records_without_move_fields(tmp_path):
    """Logs from before moves existed: every design a write, plays writes or replays, and
    no curriculum (no knobs named)."""
    cfg = _config(tmp_path)
    t0 = time.time() - 60
    _write_jsonl(tmp_path / "data" / "run" / "designs.jsonl", [
        {"time": t0 + i, "status": "accepted" if i % 2 else "invalid"} for i in range(4)])
    _write_jsonl(tmp_path / "data" / "run" / "plays.jsonl", [
        {"time": t0 + 10 + i, "env_id": "e", "replayed": i == 2, "regret": 0.0,
         "unhinted": [0.0]} for i in range(3)])
    res = CliRunner().invoke(app, ["report", "--config", str(cfg), "--out",
                                   str(tmp_path / "r"), "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["moves"]["write"] == {"proposed": 4, "accepted": 2, "played": 2,
                                   "played_share": 0.5}
    assert s["moves"]["edit"]["proposed"] == 0 and s["moves"]["replay"] == {"played": 1}
    assert s["curriculum"] == [] and s["probe"] == []


def test_wilson_interval():
    lo, hi = wilson_interval(4, 8)
    assert (round(lo, 4), round(hi, 4)) == (0.2152, 0.7848)  # the textbook value
    assert wilson_interval(0, 8)[0] == 0.0 and 0.3 < wilson_interval(0, 8)[1] < 0.35
    assert wilson_interval(8, 8)[1] == 1.0 and wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(9, 8)


# ---- the probe suite's task list -----------------------------------------------------------


def _seed_dir(tmp: Path) -> Path:
    root = tmp / "seeds"
    root.mkdir()
    (root / "__init__.py").write_text('"""not a seed"""\n')
    (root / "echo_digits.py").write_text(ECHO)
    (root / "plain.py").write_text(PLAIN)
    return root


def test_easiest_and_default_points_resolve(tmp_path):
    root = _seed_dir(tmp_path)
    specs = family_knobs(ECHO)
    assert easiest_point(specs) == {"digits": 1, "scale": 0.5, "style": "plain", "loud": False}
    assert default_probe_variants(root) == [
        {"family": "echo_digits", "params": {"digits": 1, "scale": 0.5, "style": "plain",
                                             "loud": False}},
        {"family": "echo_digits", "params": {"digits": 3, "scale": 1.0, "style": "spaced",
                                             "loud": True}},
        {"family": "plain", "params": {}}]  # no knobs: its easiest point is its default
    # The built-in seeds: every family, at most two points each, each resolving to itself.
    entries = default_probe_variants()
    assert {x["family"] for x in entries} == set(seed_families())
    for fam in seed_families():
        points = [x["params"] for x in entries if x["family"] == fam]
        specs = family_knobs((SEEDS_DIR / f"{fam}.py").read_text())
        assert 1 <= len(points) <= 2 and resolve_params(specs, None) in points
        assert all(resolve_params(specs, p) == p for p in points)


def test_probe_task_list_is_fixed(tmp_path):
    root = _seed_dir(tmp_path)
    cfg = SpadeConfig()
    a = ProbeSuite.from_config(cfg, root=root)
    b = ProbeSuite.from_config(cfg, root=root)
    assert [(t.task_id, t.payload) for t in a.tasks()] == [(t.task_id, t.payload)
                                                          for t in b.tasks()]
    assert len(a.tasks()) == 3 * 8 and a.seeds == probe_seeds(8)
    assert a.seeds == tuple(range(PROBE_SEED_BASE, PROBE_SEED_BASE + 8))
    assert {t.payload["seed"] for t in a.tasks()} == set(a.seeds)
    # A limit samples every variant first.
    assert {t.payload["variant"] for t in a.tasks(limit=3)} == {0, 1, 2}
    assert a.tasks()[0].task_id == (f"echo_digits[digits=1,scale=0.5,style=\"plain\","
                                    f"loud=false]/{PROBE_SEED_BASE}")
    # The variants carry the memory's ids: env id of the code, variant id of the params.
    v = a.variants[1]
    assert v.variant_id == variant_id(v.env_id, v.params) and a.variants[2].variant_id == \
        a.variants[2].env_id
    # The config overrides the defaults, and is checked when it is loaded.
    f = _config(tmp_path, '[eval]\nprobe_seeds = 2\n[[eval.probe_variants]]\n'
                          'family = "date_arithmetic"\n[[eval.probe_variants]]\n'
                          'family = "word_guess"\n')
    c = load_config(f, environ={})
    s = ProbeSuite.from_config(c)
    assert [v.family for v in s.variants] == ["date_arithmetic", "word_guess"]
    assert [t.payload["seed"] for t in s.tasks()] == [PROBE_SEED_BASE] * 2 + \
        [PROBE_SEED_BASE + 1] * 2
    assert "probe" in SUITES and "probe" not in c.eval.suites
    f.write_text(f.read_text().replace('"word_guess"', '"no_such_family"'))
    with pytest.raises(ConfigError, match="eval.probe_variants.*no_such_family"):
        load_config(f, environ={})
    with pytest.raises(ValueError, match="digits.*int in \\[1, 6\\]"):
        resolve_probe_variants([{"family": "echo_digits", "params": {"digits": 0}}], root)
    with pytest.raises(ValueError, match="the same variant twice"):
        resolve_probe_variants([{"family": "plain"}, {"family": "plain", "params": {}}], root)


# ---- the probe suite, played ---------------------------------------------------------------


@pytest.fixture(scope="module")
def chat(checkpoint) -> ChatTokens:
    return ChatTokens.from_pretrained(checkpoint)


def _fake_agent(chat: ChatTokens, server: FakeOpenAIServer) -> None:
    """Echoes numbers of at most two digits; anything longer gets a wrong answer."""

    def script(prompt_ids: list[int]) -> list[int]:
        n = re.findall(r"say (\d+)", chat.tok.decode(prompt_ids))[-1]
        return chat.encode(n if len(n) <= 2 else "0") + [chat.tok.eos_token_id]

    server.state.script = script
    server.state.decode = chat.decode
    server.state.eos_token_id = chat.tok.eos_token_id


async def test_probe_suite_end_to_end_against_the_fake(tmp_path, chat):
    root = _seed_dir(tmp_path)
    variants = resolve_probe_variants([
        {"family": "echo_digits", "params": {"digits": 2}},   # solved by the fake agent
        {"family": "echo_digits", "params": {"digits": 4}},   # never solved
    ], root)
    server = FakeOpenAIServer()
    _fake_agent(chat, server)
    server.start()
    try:
        async with EndpointPool([EndpointConfig(name="fake", base_url=server.base_url)],
                                PoolConfig()) as pool:
            policy = EvalPolicy(pool, chat, model="policy", version=3)
            results = []
            for _ in range(2):
                suite = ProbeSuite(variants, probe_seeds(3), RolloutConfig(temperature=0.7),
                                   SandboxConfig(slots=2, warm_workers=1))
                async with suite:
                    results.append(await run_suite(suite, policy, concurrency=2))
                assert suite.sandbox is None  # its own sandbox closed with the run
    finally:
        server.stop()
    res = results[0]
    assert (res.suite, res.version, res.n, res.scored, res.errors) == ("probe", 3, 6, 6, 0)
    assert res.score == res.passed == 0.5
    by_seed_and_digits = {(t.detail["seed"], t.detail["params"]["digits"]): t.passed
                          for t in res.tasks}
    assert by_seed_and_digits == {(s, d): d == 2 for s in probe_seeds(3) for d in (2, 4)}
    # The same tasks with the same seeds on every run, down to the request seeds.
    assert [(t.task_id, t.score, t.answer) for t in res.tasks] == \
        [(t.task_id, t.score, t.answer) for t in results[1].tasks]
    sent = server.state.completions
    assert len(sent) == 12 and {b["temperature"] for b in sent} == {0.7}
    assert sorted(b["seed"] for b in sent) == sorted(list(probe_seeds(3)) * 4)  # turn 1
    # Stored like every suite's results: one summary line, one line per task.
    tasks_file = store_result(tmp_path / "data", res)
    assert tasks_file == tmp_path / "data" / "eval" / "v3" / "probe.jsonl"
    lines = [json.loads(x) for x in tasks_file.read_text().splitlines()]
    assert len(lines) == 6
    for line in lines:
        d = line["detail"]
        assert d["family"] == "echo_digits" and d["seed"] in probe_seeds(3)
        assert d["params"] == {"digits": d["params"]["digits"], "scale": 1.0,
                               "style": "spaced", "loud": True}
        assert d["variant_id"] == variant_id(d["env_id"], d["params"])
        assert line["score"] == float(d["episode_score"] >= 1.0) and line["turns"] == 1
    (summary,) = [json.loads(x) for x in (tmp_path / "data" / "eval" / "results.jsonl")
                  .read_text().splitlines()]
    assert (summary["suite"], summary["score"], summary["scored"]) == ("probe", 0.5, 6)


def test_spade_eval_probe_against_the_fake(tmp_path, checkpoint):
    """`spade eval --suite probe --version 0`: the built-in seeds in the config's probe list,
    played in a sandbox the command opens, results stored and reported."""
    server = FakeOpenAIServer()
    server.start()
    try:
        cfg = _config(tmp_path, f"""
[model]
tokenizer = "{checkpoint}"
[[endpoints]]
name = "fake"
base_url = "{server.base_url}"
[rollout]
max_tokens_per_turn = 8
[sandbox]
slots = 2
warm_workers = 1
[eval]
probe_seeds = 2
[[eval.probe_variants]]
family = "date_arithmetic"
[[eval.probe_variants]]
family = "modular_coins"
""")
        runner = CliRunner()
        res = runner.invoke(app, ["eval", "--config", str(cfg), "--suite", "probe",
                                  "--version", "0", "--json"])
    finally:
        server.stop()
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert (row["suite"], row["version"], row["n"], row["scored"]) == ("probe", 0, 4, 4)
    assert row["score"] == 0.0  # hashed tokens solve nothing
    tasks = [json.loads(x) for x in (tmp_path / "data" / "eval" / "v0" / "probe.jsonl")
             .read_text().splitlines()]
    assert [(t["detail"]["family"], t["detail"]["seed"]) for t in tasks] == [
        ("date_arithmetic", PROBE_SEED_BASE), ("modular_coins", PROBE_SEED_BASE),
        ("date_arithmetic", PROBE_SEED_BASE + 1), ("modular_coins", PROBE_SEED_BASE + 1)]
    assert all(t["completion_tokens"] > 0 and t["error"] is None for t in tasks)
    res = CliRunner().invoke(app, ["report", "--config", str(cfg), "--out",
                                   str(tmp_path / "r"), "--json"])
    assert res.exit_code == 0, res.output
    (probe,) = json.loads(res.stdout)["probe"]
    assert (probe["version"], probe["solved"], probe["n"]) == (0, 0, 4)


@pytest.mark.slow
def test_spade_eval_probe_against_vllm(vllm_server, checkpoint, tmp_path):
    cfg = _config(tmp_path, f"""
[model]
tokenizer = "{checkpoint}"
[[endpoints]]
name = "vllm"
base_url = "{vllm_server.base_url}"
[rollout]
max_tokens_per_turn = 48
[eval]
probe_seeds = 2
[[eval.probe_variants]]
family = "date_arithmetic"
[[eval.probe_variants]]
family = "modular_coins"
""")
    res = CliRunner().invoke(app, ["eval", "--config", str(cfg), "--suite", "probe",
                                   "--version", "0", "--json"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert (row["suite"], row["version"], row["model"], row["n"]) == ("probe", 0, "policy", 4)
    assert row["scored"] == 4 and row["errors"] == 0 and 0.0 <= row["score"] <= 1.0
    tasks = [json.loads(x) for x in (tmp_path / "data" / "eval" / "v0" / "probe.jsonl")
             .read_text().splitlines()]
    assert {(t["detail"]["family"], t["detail"]["seed"]) for t in tasks} == {
        (f, PROBE_SEED_BASE + i) for f in ("date_arithmetic", "modular_coins") for i in (0, 1)}
    assert all(t["completion_tokens"] > 0 and t["turns"] == 1 for t in tasks)
    assert all(t["score"] == float(t["detail"]["episode_score"] >= 1.0) for t in tasks)
    res = CliRunner().invoke(app, ["report", "--config", str(cfg), "--out",
                                   str(tmp_path / "r"), "--json"])
    assert res.exit_code == 0, res.output
    (probe,) = json.loads(res.stdout)["probe"]
    assert probe["n"] == 4 and probe["ci95"][0] <= probe["solved"] / 4 <= probe["ci95"][1]
