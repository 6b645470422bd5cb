"""The validation pipeline on broken environments (each rejected with the right reason) and on
every hand-written seed environment (each accepted), in the real sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spade_async.cli import app
from spade_async.core.config import SandboxConfig
from spade_async.envs.validate import validate
from spade_async.envs.validation_report import ALL_CHECKS
from spade_async.sandbox.runtime import Sandbox

SEEDS_DIR = Path(__file__).resolve().parents[1] / "spade_async" / "envs" / "seeds"
SEED_FILES = sorted(p for p in SEEDS_DIR.glob("*.py") if p.name != "__init__.py")
CFG = SandboxConfig(slots=2, warm_workers=2, call_timeout_s=3.0)

GOOD = '''
import random

class Environment:
    name = "guess"
    description = "Guess the secret number from 1 to 1000; answer with the number alone."
    max_turns = 10

    def reset(self, seed):
        self.secret = random.Random(seed).randint(1, 1000)
        self.turns = 0
        return "Guess a number from 1 to 1000.", {"range": [1, 1000]}

    def step(self, action):
        self.turns += 1
        try:
            guess = int(action.strip())
        except ValueError:
            return "Not a number.", 0.0, False, self.turns >= self.max_turns, {}
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {}
        word = "higher" if guess < self.secret else "lower"
        return word, 0.0, False, self.turns >= self.max_turns, {}

    def hint(self):
        return f"The secret is {'even' if self.secret % 2 == 0 else 'odd'}."

    def solution(self):
        return [str(self.secret)]
'''


def broken(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new)


@pytest.fixture
async def sandbox():
    async with Sandbox(CFG) as sb:
        yield sb


async def _failure(sandbox, code: str) -> tuple[str, str]:
    report = await validate(code, sandbox)
    assert not report.accepted, report.as_dict()
    first = report.failures[0]
    return first.name, first.reason


async def test_good_environment_is_accepted_with_every_check(sandbox):
    report = await validate(GOOD, sandbox)
    assert report.accepted, report.as_dict()
    # every check passed; the model check of the hint had no endpoint to ask, and says so
    assert [(c.name, c.reason.split(";")[0]) for c in report.checks if c.passed is not True] \
        == [("hint_reader", "not run: no endpoint to ask")]
    assert report.meta.name == "guess" and report.meta.has_solution
    assert max(report.probe_scores.values()) < 0.5


@pytest.mark.parametrize(
    ("old", "new", "check", "words"),
    [
        # non-deterministic reset: the global random state, not the seed
        ("random.Random(seed).randint(1, 1000)", "random.randint(1, 1000)", "determinism",
         "reset(0) twice"),
        # reward out of range
        ('return "Correct!", 1.0, True', 'return "Correct!", 2.5, True', "solution",
         "outside [0, 1]"),
        ('return word, 0.0, False', 'return word, -0.1, False', "types", "outside [0, 1]"),
        # exceptions in step
        ("        self.turns += 1\n", "        self.turns += 1\n        raise KeyError('boom')\n",
         "types", "KeyError"),
        # no hint / an empty one
        ("return f\"The secret is {'even' if self.secret % 2 == 0 else 'odd'}.\"",
         'return "   "', "hint", "empty"),
        ("    def hint(self):\n        return f\"The secret is {'even' if self.secret % 2 == 0 "
         "else 'odd'}.\"\n", "", "static.class", "lacks hint()"),
        # the hint gives the answer away
        ("return f\"The secret is {'even' if self.secret % 2 == 0 else 'odd'}.\"",
         'return f"The secret is {self.secret}."', "hint_leak", "the hint gives the answer away"),
        # the solution does not reach full score
        ("return [str(self.secret)]", "return [str(self.secret + 1)]", "solution",
         "scores 0.00"),
        # pays any action
        ('return "Not a number.", 0.0', 'return "Not a number.", 1.0', "not_exploitable",
         "scores 1.00"),
        # wrong return shapes and values
        ('return "Guess a number from 1 to 1000.", {"range": [1, 1000]}',
         'return "Guess a number from 1 to 1000."', "determinism", "reset() must return"),
        ('return "Correct!", 1.0, True, False, {}', 'return "Correct!", 1.0, True, False, {1, 2}',
         "solution", "not JSON-serializable"),
        # static
        ("import random", "import random\nimport subprocess", "static.imports", "subprocess"),
        ("class Environment:", "class Env:", "static.class", "no top-level class"),
        ("        self.turns = 0\n", "        self.turns = 0\n  oops\n", "static.parse",
         "SyntaxError"),
    ],
)
async def test_broken_environment_is_rejected_with_the_right_reason(sandbox, old, new, check,
                                                                     words):
    name, reason = await _failure(sandbox, broken(old, new))
    assert name == check, (name, reason)
    assert words in reason, reason


async def test_a_hanging_step_is_rejected_with_the_deadline(sandbox):
    name, reason = await _failure(sandbox, broken("        self.turns += 1\n",
                                                  "        self.turns += 1\n        while True: pass\n"))
    assert name == "types" and "deadline" in reason


def test_there_are_at_least_twelve_seed_environments():
    assert len(SEED_FILES) >= 12, [p.name for p in SEED_FILES]


@pytest.mark.parametrize("path", SEED_FILES, ids=lambda p: p.stem)
async def test_seed_environment_validates(sandbox, path):
    report = await validate(path.read_text(), sandbox)
    assert report.accepted, json.dumps(report.as_dict(), indent=1)
    assert report.meta.name == path.stem and report.meta.has_solution


def test_cli_validate_verdicts_and_exit_codes(tmp_path):
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(GOOD)
    bad.write_text(broken('return "Not a number.", 0.0', 'return "Not a number.", 1.0'))
    runner = CliRunner()
    res = runner.invoke(app, ["env", "validate", str(good), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["accepted"] and {c["name"] for c in out["checks"]} >= {"determinism", "solution"}
    res = runner.invoke(app, ["env", "validate", str(bad)])
    assert res.exit_code == 1 and "FAIL not_exploitable" in res.stdout, res.output
    res = runner.invoke(app, ["env", "validate", str(tmp_path / "missing.py")])
    assert res.exit_code == 2 and "cannot read environment file" in res.output


async def test_progress_orders_designs_by_how_far_they_got(sandbox):
    lines = GOOD.splitlines()
    n = len(lines)
    early = "\n".join(["def f(:"] + lines[1:])  # a syntax error on line 1
    late = "\n".join(lines[: n - 2] + ["    def g(:"] + lines[n - 1:])  # near the end
    bad_import = "import socket\n" + GOOD
    reports = {name: await validate(code, sandbox) for name, code in (
        ("early", early), ("late", late), ("import", bad_import), ("good", GOOD))}
    p = {k: r.progress for k, r in reports.items()}
    assert reports["early"].failures[0].name == "static.parse"
    assert reports["late"].failures[0].name == "static.parse"
    # Nothing before the first line: only static.size passed (1 of 13 checks: the model check
    # of the hint, never run here, is no verdict).
    n_checks = len(ALL_CHECKS) - 1
    assert n_checks == 13
    assert p["early"] == pytest.approx(1 / n_checks)
    assert p["early"] < p["late"] < 2 / n_checks < p["import"] < p["good"] == 1.0


NEVER_ENDS = GOOD.replace("self.turns >= self.max_turns", "False")


async def test_an_environment_that_never_ends_is_accepted_and_truncated(sandbox, checkpoint):
    """Turn limits belong to the runner (DESIGN §3): an environment that never ends an episode by
    itself is valid, and it is truncated at max_turns in validation, in play and in the gym
    adapter alike."""
    import anyio

    from spade_async.core.config import EndpointConfig, PoolConfig, RolloutConfig
    from spade_async.envs.gym_adapter import SpadeGymEnv
    from spade_async.inference.chat_tokens import ChatTokens
    from spade_async.inference.pool import EndpointPool
    from spade_async.rollout.episode import run_episode
    from spade_async.testing.fake.server import FakeOpenAIServer

    assert "self.max_turns" not in NEVER_ENDS.split("def step")[1]
    report = await validate(NEVER_ENDS, sandbox)
    assert report.accepted, report.as_dict()

    def gym_play() -> list[tuple[bool, bool]]:
        env = SpadeGymEnv(NEVER_ENDS, CFG)
        try:
            env.reset(seed=0)
            return [env.step("not a number")[2:4] for _ in range(10)]
        finally:
            env.close()

    ends = await anyio.to_thread.run_sync(gym_play)
    assert ends == [(False, False)] * 9 + [(False, True)]

    chat = ChatTokens.from_pretrained(checkpoint)
    server = FakeOpenAIServer()
    server.state.script = lambda ids: chat.encode("7") + [chat.tok.eos_token_id]
    server.state.decode = chat.decode
    server.state.eos_token_id = chat.tok.eos_token_id
    server.start()
    try:
        async with EndpointPool([EndpointConfig(name="fake", base_url=server.base_url)],
                                PoolConfig()) as pool, sandbox.open(NEVER_ENDS) as env:
            ep = await run_episode(env, pool, chat, env_id="never", seed=5, hint=None,
                                   model="policy", policy_version=0, cfg=RolloutConfig())
    finally:
        server.stop()
    assert (len(ep.turns), ep.truncated, ep.terminated, ep.error) == (10, True, False, None)
