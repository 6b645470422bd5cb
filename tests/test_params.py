"""Difficulty knobs (`Environment.params`, DESIGN §3 and §12): the schema and its errors, resolving
a variant's values, the extreme points validation runs at, and the knobs going through the real
sandbox into `reset`, the validator, the gymnasium adapter, the episode runner and the CLI."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from typer.testing import CliRunner

from spade_async.cli import app
from spade_async.core.config import EndpointConfig, PoolConfig, RolloutConfig, SandboxConfig
from spade_async.envs.contract import ContractError, ParamSpec
from spade_async.envs.gym_adapter import register
from spade_async.envs.knobs import check_params_schema, extreme_points, resolve_params
from spade_async.envs.replies import check_meta
from spade_async.envs.validate import validate
from spade_async.envs.validation_report import ALL_CHECKS
from spade_async.inference.pool import EndpointPool
from spade_async.rollout.episode import run_episode
from spade_async.sandbox.errors import SandboxError
from spade_async.sandbox.runtime import Sandbox
from spade_async.testing.fake.server import FakeOpenAIServer

CFG = SandboxConfig(slots=2, warm_workers=2, call_timeout_s=3.0)

SCHEMA = {
    "digits": {"type": "int", "min": 1, "max": 4, "default": 2, "description": "digits a number"},
    "mode": {"type": "choice", "choices": ["sum", "double"], "default": "sum"},
    "ratio": {"type": "float", "min": 0, "max": 1, "default": 0.5},
    "shown": {"type": "bool", "default": True},
}

# Adds two numbers of `digits` digits (doubled in mode "double"). reset echoes the knobs it got
# in its info, so the tests see exactly what the worker passed.
KNOBS = '''
import random

class Environment:
    name = "adder"
    description = "Add the two numbers shown (double the sum when told to); answer with the number."
    max_turns = 2
    params = {
        "digits": {"type": "int", "min": 1, "max": 4, "default": 2, "description": "digits each"},
        "mode": {"type": "choice", "choices": ["sum", "double"], "default": "sum"},
    }

    def reset(self, seed, params):
        rng = random.Random(seed)
        d = params["digits"]
        self.a, self.b = (rng.randint(max(2, 10 ** (d - 1)), 10 ** d - 1) for _ in range(2))
        self.answer = (self.a + self.b) * (2 if params["mode"] == "double" else 1)
        self.target = self.answer
        verb = "Double the sum of" if params["mode"] == "double" else "Add"
        return f"{verb} {self.a} and {self.b}.", {"params": dict(params)}

    def step(self, action):
        ok = action.strip() == str(self.target)
        return ("Correct." if ok else "Wrong."), float(ok), True, False, {}

    def hint(self):
        return f"The first number is {self.a}."

    def solution(self):
        return [str(self.answer)]
'''

PLAIN = '''
class Environment:
    name = "plain"
    description = "Say the word shown backwards."
    max_turns = 2

    def reset(self, seed):
        self.word = "abcdefgh"[seed % 8] + "xyz"
        return f"Say {self.word} backwards.", {"args": 1}

    def step(self, action):
        ok = action.strip() == self.word[::-1]
        return "ok" if ok else "no", float(ok), True, False, {}

    def hint(self):
        return "Read it from the end."

    def solution(self):
        return [self.word[::-1]]
'''


@pytest.fixture
async def sandbox():
    async with Sandbox(CFG) as sb:
        yield sb


# ---- the schema --------------------------------------------------------------------------


def test_schema_parses_every_spec_form_and_round_trips():
    specs = check_params_schema(SCHEMA)
    assert [s.name for s in specs] == ["digits", "mode", "ratio", "shown"]
    assert specs[0] == ParamSpec("digits", "int", 1, 4, None, 2, "digits a number")
    assert specs[1].choices == ("sum", "double") and specs[1].default == "sum"
    assert (specs[2].min, specs[2].max, specs[2].default) == (0.0, 1.0, 0.5)
    assert isinstance(specs[2].min, float)  # an int bound of a float knob is converted
    assert specs[3] == ParamSpec("shown", "bool", default=True)
    assert check_params_schema({s.name: s.as_dict() for s in specs}) == specs
    for empty in (None, {}):
        assert check_params_schema(empty) == ()
    meta = check_meta({"name": "n", "description": "d", "max_turns": 3, "tools": [],
                       "params": SCHEMA})
    assert meta.params == specs
    assert check_meta({"name": "n", "description": "d", "max_turns": 3, "tools": [],
                       "params": {}}).params == ()


def _int(**kw):
    return {"type": "int", "min": 1, "max": 5, "default": 2} | kw


@pytest.mark.parametrize(("raw", "words"), [
    (["digits"], "must be a dict of knob name -> spec"),
    ({f"k{i}": {"type": "bool", "default": True} for i in range(9)}, "9 knobs; at most 8"),
    ({"Digits": _int()}, "knob name 'Digits' must be an identifier"),
    ({"1x": _int()}, "knob name '1x'"),
    ({"x" * 33: _int()}, "at most 32 characters"),
    ({"d": 3}, "knob 'd': the spec must be a dict"),
    ({"d": {"type": "str", "default": "a"}}, "knob 'd': type must be one of int, float"),
    ({"d": _int(step=1)}, "knob 'd': unknown key(s) step for an int knob"),
    ({"d": {"type": "int", "min": 1, "max": 5}}, "knob 'd': a default is required"),
    ({"d": {"type": "int", "max": 5, "default": 2}}, "knob 'd': min is required"),
    ({"d": _int(min=1.5)}, "knob 'd': min must be an int, got 1.5"),
    ({"d": _int(default=True)}, "knob 'd': default must be an int, got True"),
    ({"d": _int(min=6, default=7)}, "knob 'd': min 6 is greater than max 5"),
    ({"d": _int(default=9)}, "knob 'd': needs min <= default <= max"),
    ({"r": {"type": "float", "min": 0, "max": float("inf"), "default": 1}},
     "knob 'r': max must be a finite number"),
    ({"r": {"type": "float", "min": 0, "max": 10**400, "default": 1}},
     "knob 'r': max must be a finite number"),  # float() of it would overflow
    ({"r": {"type": "float", "min": 0, "max": 1, "default": 2.5}},
     "knob 'r': needs min <= default <= max"),
    ({"b": {"type": "bool", "default": 1}}, "knob 'b': default must be true or false"),
    ({"b": {"type": "bool", "default": True, "min": 0}}, "knob 'b': unknown key(s) min"),
    ({"c": {"type": "choice", "choices": [], "default": "a"}}, "knob 'c': choices must be a list"),
    ({"c": {"type": "choice", "choices": list(range(33)), "default": 0}}, "1 to 32 values"),
    ({"c": {"type": "choice", "choices": "ab", "default": "a"}}, "choices must be a list"),
    ({"c": {"type": "choice", "choices": [[1], 2], "default": 2}},
     "knob 'c': choice [1] is not a string, int or finite float"),
    ({"c": {"type": "choice", "choices": [True, 2], "default": 2}}, "choice True is not"),
    ({"c": {"type": "choice", "choices": ["a", "a"], "default": "a"}}, "choice 'a' appears twice"),
    ({"c": {"type": "choice", "choices": ["a", "b"], "default": "z"}},
     "knob 'c': default 'z' is not one of the choices"),
    ({"d": _int(description="two\nlines")}, "knob 'd': description must be one line"),
    ({"d": _int(description="x" * 201)}, "at most 200 characters"),
])
def test_malformed_schema_is_named(raw, words):
    with pytest.raises(ContractError) as err:
        check_params_schema(raw)
    assert words in str(err.value), str(err.value)


# ---- resolving a variant -----------------------------------------------------------------


def test_resolve_fills_defaults_and_converts_ints_for_float_knobs():
    specs = check_params_schema(SCHEMA)
    assert resolve_params(specs, None) == {"digits": 2, "mode": "sum", "ratio": 0.5,
                                           "shown": True}
    got = resolve_params(specs, {"ratio": 1, "digits": 4})
    assert got == {"digits": 4, "mode": "sum", "ratio": 1.0, "shown": True}
    assert isinstance(got["ratio"], float) and list(got) == ["digits", "mode", "ratio", "shown"]
    assert resolve_params((), None) == resolve_params((), {}) == {}


@pytest.mark.parametrize(("given", "words"), [
    ({"digit": 3}, "unknown param 'digit' (this environment's params: digits, mode, ratio, shown)"),
    ({"digits": 5}, "param 'digits' must be an int in [1, 4], got 5"),
    ({"digits": 0}, "must be an int in [1, 4]"),
    ({"digits": True}, "param 'digits' must be an int in [1, 4], got true"),
    ({"digits": 2.0}, "param 'digits' must be an int"),
    ({"digits": "2"}, 'got "2"'),
    ({"ratio": 1.5}, "param 'ratio' must be a float in [0.0, 1.0], got 1.5"),
    ({"ratio": float("nan")}, "param 'ratio' must be a float"),
    ({"ratio": False}, "param 'ratio' must be a float"),
    ({"ratio": 10**400}, "param 'ratio' must be a float"),
    ({"shown": 1}, "param 'shown' must be true or false, got 1"),
    ({"mode": "triple"}, 'param \'mode\' must be one of ["sum", "double"], got "triple"'),
    (["digits"], "params must be a dict"),
])
def test_resolve_rejects_bad_values_naming_the_knob_and_range(given, words):
    with pytest.raises(ContractError) as err:
        resolve_params(check_params_schema(SCHEMA), given)
    assert words in str(err.value), str(err.value)


def test_resolve_on_an_environment_without_knobs():
    with pytest.raises(ContractError, match=r"unknown param 'x' \(this environment's params: none"):
        resolve_params((), {"x": 1})


def test_extreme_points_defaults_first_then_each_knob_at_its_ends():
    points = extreme_points(check_params_schema(SCHEMA))
    base = {"digits": 2, "mode": "sum", "ratio": 0.5, "shown": True}
    assert points == [base, base | {"digits": 1}, base | {"digits": 4},
                      base | {"mode": "double"},  # "sum", the first choice, is the default
                      base | {"ratio": 0.0}, base | {"ratio": 1.0},
                      base | {"shown": False}]
    assert extreme_points(()) == [{}]
    fixed = check_params_schema({"n": {"type": "int", "min": 3, "max": 3, "default": 3}})
    assert extreme_points(fixed) == [{"n": 3}]


# ---- through the sandbox -----------------------------------------------------------------


async def test_worker_passes_the_resolved_params_to_reset(sandbox):
    async with sandbox.open(KNOBS) as env:
        assert [s.name for s in env.meta.params] == ["digits", "mode"]
        first = await env.reset(0)
        assert first.info == {"params": {"digits": 2, "mode": "sum"}}
        first = await env.reset(0, {"mode": "double"})
        assert first.info == {"params": {"digits": 2, "mode": "double"}}
        assert first.observation.startswith("Double the sum of")
        with pytest.raises(ContractError, match=r"param 'digits' must be an int in \[1, 4\]"):
            await env.reset(0, {"digits": 7})
        assert (await env.reset(0, {"digits": 1})).info["params"]["digits"] == 1  # still alive
    async with sandbox.open(PLAIN) as env:  # no knobs: called as reset(seed), as before
        assert env.meta.params == ()
        assert (await env.reset(1, {})).info == {"args": 1}
        with pytest.raises(ContractError, match="unknown param 'digits'"):
            await env.reset(1, {"digits": 2})


async def test_worker_protocol_passes_params_positionally_only_when_sent(sandbox):
    """The raw protocol, without EnvSession's resolving: `params` present means
    env.reset(seed, params), absent means env.reset(seed)."""
    async with sandbox.open(KNOBS) as env:
        out = await env.worker.call("reset", 3.0, seed=0, params={"digits": 3, "mode": "sum"})
        assert out["info"] == {"params": {"digits": 3, "mode": "sum"}}
        with pytest.raises(SandboxError, match="missing 1 required positional argument"):
            await env.worker.call("reset", 3.0, seed=0)
        with pytest.raises(SandboxError, match="reset params must be a dict"):
            await env.worker.call("reset", 3.0, seed=0, params=[1])
    async with sandbox.open(PLAIN) as env:
        with pytest.raises(SandboxError, match="takes 2 positional arguments but 3"):
            await env.worker.call("reset", 3.0, seed=0, params={})


async def test_a_malformed_computed_schema_fails_load_naming_the_knob(sandbox):
    code = KNOBS.replace('    params = {\n', '    params = dict(\n    bad={"type": "int", '
                         '"min": 3, "max": 1, "default": 2}) or {\n')
    with pytest.raises(SandboxError, match="knob 'bad': min 3 is greater than max 1") as err:
        async with sandbox.open(code):
            pass
    assert err.value.kind == "contract"
    report = await validate(code, sandbox)
    assert report.failures[0].name == "load" and "knob 'bad'" in report.reason


@pytest.mark.parametrize(("declared", "words"), [
    ('{"digits": {"type": "choice", "choices": {1, 2}, "default": 1}}',
     "load is not JSON-serializable"),
    ('["digits"]', "Environment.params must be a dict"),
    ("property(lambda self: 1 / 0)", "ZeroDivisionError"),
])
async def test_knobs_the_worker_cannot_send_fail_load(sandbox, declared, words):
    """Computed (`[...][0]`, so static.params cannot read them) and wrong: the worker's own
    serialisation or the daemon's re-check catches them at load, with a reason."""
    code = PLAIN.replace("    max_turns = 2\n", f"    max_turns = 2\n    params = [{declared}][0]\n")
    report = await validate(code, sandbox)
    assert [c.name for c in report.failures] == ["load"], report.as_dict()
    assert words in report.reason, report.reason


async def test_environment_with_knobs_is_validated_at_every_extreme(sandbox):
    report = await validate(KNOBS, sandbox)
    assert report.accepted, json.dumps(report.as_dict(), indent=1)
    assert report.points == ({"digits": 2, "mode": "sum"}, {"digits": 1, "mode": "sum"},
                             {"digits": 4, "mode": "sum"}, {"digits": 2, "mode": "double"})
    assert report.as_dict()["points"][1] == {"digits": 1, "mode": "sum"}
    params_check = next(c for c in report.checks if c.name == "static.params")
    assert params_check.passed and params_check.reason == "digits, mode"
    plain = await validate(PLAIN, sandbox)
    assert plain.accepted and plain.points == ({},)


@pytest.mark.parametrize(("old", "new", "check", "point"), [
    # the verifier breaks only for the largest numbers
    ("self.target = self.answer\n",
     'self.target = self.answer * (10 if params["digits"] == 4 else 1)\n',
     "solution", {"digits": 4, "mode": "sum"}),
    # doubling pays any constant answer
    ("ok = action.strip() == str(self.target)",
     'ok = self.observation_is_double or action.strip() == str(self.target)',
     "not_exploitable", {"digits": 2, "mode": "double"}),
])
async def test_a_failure_at_one_extreme_names_the_point(sandbox, old, new, check, point):
    assert old in KNOBS
    code = KNOBS.replace(old, new).replace(
        "        verb = ", '        self.observation_is_double = params["mode"] == "double"\n'
        "        verb = ")
    report = await validate(code, sandbox)
    assert not report.accepted
    failed = report.failures
    assert [c.name for c in failed] == [check], report.as_dict()
    assert failed[0].reason.startswith(f"at params {json.dumps(point)}: "), failed[0].reason
    # Every point ran, and passing at the others earns partial credit for that check.
    assert len(report.points) == 4
    assert failed[0].credit == pytest.approx(3 / 4)
    assert (len(ALL_CHECKS) - 1) / len(ALL_CHECKS) < report.progress < 1.0
    # A variant away from the broken point is accepted; one at it is not.
    assert (await validate(code, sandbox, params={"digits": 3})).accepted
    at_bug = await validate(code, sandbox, params=point)
    assert [c.name for c in at_bug.failures] == [check]


async def test_a_sandbox_failure_at_an_extreme_stops_the_remaining_points(sandbox):
    code = KNOBS.replace("    def step(self, action):\n", "    def step(self, action):\n"
                         "        if self.a < 10:\n            raise KeyError('one digit')\n")
    report = await validate(code, sandbox)
    by_name = {c.name: c for c in report.checks}
    assert [c.name for c in report.failures] == ["types"]
    assert by_name["types"].reason.startswith('at params {"digits": 1, "mode": "sum"}: raised: ')
    assert "KeyError" in by_name["types"].reason
    assert report.points == ({"digits": 2, "mode": "sum"}, {"digits": 1, "mode": "sum"})
    # determinism and hint passed where they ran, but not everywhere: no verdict
    assert by_name["hint"].passed is None
    assert by_name["hint"].reason == ('not run at params {"digits": 4, "mode": "sum"}: an '
                                      "earlier check failed")
    assert by_name["solution"].passed is None


async def test_validating_a_variant_checks_only_that_point(sandbox):
    report = await validate(KNOBS, sandbox, params={"mode": "double"})
    assert report.accepted, report.as_dict()
    assert report.points == ({"digits": 2, "mode": "double"},)


@pytest.mark.parametrize(("params", "words"), [
    ({"digits": 9}, "param 'digits' must be an int in [1, 4], got 9"),
    ({"level": 1}, "unknown param 'level' (this environment's params: digits, mode)"),
    ({"mode": 2}, "param 'mode' must be one of"),
])
async def test_a_variant_that_does_not_fit_fails_static_params(sandbox, params, words):
    report = await validate(KNOBS, sandbox, params=params)
    assert not report.accepted and report.failures[0].name == "static.params"
    assert "the proposed params" in report.reason and words in report.reason, report.reason
    assert report.points == ()
    assert all(c.passed is None for c in report.checks if c.name in ("load", "solution"))


async def test_a_variant_of_a_computed_schema_is_checked_after_load(sandbox):
    code = KNOBS.replace("    params = {\n", "    params = dict(**{\n").replace(
        '"default": "sum"},\n    }', '"default": "sum"},\n    })')
    report = await validate(code, sandbox, params={"digits": 9})
    assert [c.name for c in report.failures] == ["static.params"], report.as_dict()
    assert "must be an int in [1, 4]" in report.reason
    assert next(c for c in report.checks if c.name == "load").passed is True
    assert next(c for c in report.checks if c.name == "solution").reason == (
        "not run: the params do not fit the environment")
    # a variant for an environment without knobs
    report = await validate(PLAIN, sandbox, params={"digits": 1})
    assert report.failures[0].name == "static.params" and "params: none" in report.reason


async def test_a_malformed_literal_schema_fails_static_params(sandbox):
    code = KNOBS.replace('"max": 4, "default": 2', '"max": 4, "default": 5')
    report = await validate(code, sandbox)
    assert report.failures[0].name == "static.params"
    assert "knob 'digits': needs min <= default <= max" in report.reason
    assert all(c.passed is None for c in report.checks if c.name == "load")


# ---- gymnasium, the episode runner, the CLI --------------------------------------------------


def test_gym_options_are_the_knobs():
    env = gym.make(register(), code=KNOBS)
    try:
        check_env(env.unwrapped)
        _, info = env.reset(seed=3, options={"digits": 1})
        assert info["params"] == {"digits": 1, "mode": "sum"}
        _, info = env.reset(seed=3)
        assert info["params"] == {"digits": 2, "mode": "sum"}
        with pytest.raises(ValueError, match="param 'digits' must be an int"):
            env.reset(seed=3, options={"digits": 0})
    finally:
        env.close()


async def test_episode_runner_plays_at_the_given_params(checkpoint):
    from spade_async.inference.chat_tokens import ChatTokens

    chat = ChatTokens.from_pretrained(checkpoint)
    server = FakeOpenAIServer()
    server.state.script = lambda ids: chat.encode("7") + [chat.tok.eos_token_id]
    server.state.decode = chat.decode
    server.state.eos_token_id = chat.tok.eos_token_id
    server.start()
    try:
        ep_cfg = EndpointConfig(name="fake", base_url=server.base_url)
        async with EndpointPool([ep_cfg], PoolConfig()) as pool, Sandbox(
            SandboxConfig(slots=1, warm_workers=0)
        ) as sb, sb.open(KNOBS) as env:
            kw = dict(env_id="e1", seed=0, hint=None, model="policy", policy_version=0,
                      cfg=RolloutConfig())
            varied = await run_episode(env, pool, chat, params={"mode": "double"}, **kw)
            plain = await run_episode(env, pool, chat, **kw)
    finally:
        server.stop()
    assert varied.error is None and varied.first_observation.startswith("Double the sum of")
    assert varied.as_record()["params"] == {"mode": "double"}
    assert plain.error is None and plain.first_observation.startswith("Add ")
    assert "params" not in plain.as_record()  # records without knobs stay as they were


def test_cli_validate_and_play_take_params(tmp_path):
    path = tmp_path / "adder.py"
    path.write_text(KNOBS)
    runner = CliRunner()
    res = runner.invoke(app, ["env", "validate", str(path), "--params", '{"digits": 3}',
                              "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["points"] == [{"digits": 3, "mode": "sum"}]
    res = runner.invoke(app, ["env", "validate", str(path), "--params", '{"digits": 30}'])
    assert res.exit_code == 1
    assert "FAIL static.params: the proposed params" in res.stdout, res.output
    assert "must be an int in [1, 4], got 30" in res.stdout
    for bad, words in (("{digits: 3}", "--params is not valid JSON"),
                       ("[3]", "--params must be a JSON object")):
        res = runner.invoke(app, ["env", "validate", str(path), "--params", bad])
        assert res.exit_code == 2 and words in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1
    res = runner.invoke(app, ["env", "play", str(path), "--params", '{"mode": "double"}'],
                        input="")
    assert res.exit_code == 0, res.output
    assert 'params {"digits": 2, "mode": "double"}' in res.output
    assert "Double the sum of" in res.output
    res = runner.invoke(app, ["env", "play", str(path), "--params", '{"mode": "x"}'], input="")
    assert res.exit_code == 2
    # one line (the log line before it is the sandbox starting, on stderr)
    assert res.output.strip().splitlines()[-1] == (
        'error: --params: param \'mode\' must be one of ["sum", "double"], got "x"'), res.output


async def test_daemon_plays_a_job_at_its_params_hinted_too(fake, tmp_path):
    """`PlayJob.params` reaches both resets of a hinted episode (the hint's and the played
    one), so the hint belongs to the episode that is played."""
    from test_daemon import _config

    from spade_async.core.spool.files import FileSpool
    from spade_async.corpus.sampler import CorpusSampler
    from spade_async.loop.daemon import Daemon
    from spade_async.loop.jobs import PlayJob
    from spade_async.testing.memory import DictMemory

    server, chat = fake
    cfg = _config(tmp_path, server)
    sampler = CorpusSampler.from_config(cfg.corpus, tmp_path / "corpus.json", autocommit=False)
    async with EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb:
        daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=DictMemory(),
                        spool=FileSpool(tmp_path / "spool", writer=True), corpus=sampler,
                        chat=chat, run_dir=tmp_path / "run")
        job = PlayJob("e1", KNOBS, "adder", None, params={"digits": 4})
        varied = await daemon.player.episode_once(job, True, 0, "policy", 0)
        plain = await daemon.player.episode_once(PlayJob("e1", KNOBS, "adder", None), True, 0,
                                           "policy", 0)
    assert varied.error is None and plain.error is None, (varied.error, plain.error)
    a, b = (int(w) for w in varied.first_observation.rstrip(".").split()[1::2])
    assert a >= 1000 and b >= 1000 and varied.params == {"digits": 4}
    assert plain.params is None and int(plain.first_observation.split()[1]) < 100
    prompts = [chat.decode(c["prompt"]) for c in server.state.completions]
    assert any(f"The first number is {a}." in p for p in prompts)


def test_a_knob_may_name_its_easy_end():
    from spade_async.envs.knobs import easiest_point

    specs = check_params_schema({
        "guesses": {"type": "int", "min": 1, "max": 10, "default": 6, "easy": 10},
        "digits": {"type": "int", "min": 1, "max": 4, "default": 2},
        "show": {"type": "bool", "default": False, "easy": True},
        "mode": {"type": "choice", "choices": ["a", "b"], "default": "b"},
    })
    assert easiest_point(specs) == {"guesses": 10, "digits": 1, "show": True, "mode": "a"}
    assert check_params_schema({s.name: s.as_dict() for s in specs}) == specs
    with pytest.raises(ContractError, match="knob 'g': easy: .*in \\[1, 10\\], got 11"):
        check_params_schema({"g": {"type": "int", "min": 1, "max": 10, "default": 6,
                                   "easy": 11}})
