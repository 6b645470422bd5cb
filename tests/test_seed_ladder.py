"""The seed environments' difficulty knobs (DESIGN §3 `params`), checked in the real sandbox at the
defaults, at every knob's extremes and at the bench's rungs: the validator accepts every point
(deterministic reset, a non-empty hint, probes below the exploit threshold, the solution scoring
1), and actions read off the hint do not win. The seeds are standalone modules: they run only in
the sandbox, never in this process; their knob specs are read from source as literals.

Until the sandbox passes `params` to `reset`, a point's values reach the environment as its
defaults (`ladder.with_knobs`); once it does, the same points are also played through it."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from spade_async.bench.ladder import (
    RUNGS,
    Rung,
    default_rungs,
    extremes,
    knob_specs,
    measure_rungs,
    wilson,
    with_knobs,
)
from spade_async.core.config import (
    EndpointConfig,
    PoolConfig,
    RolloutConfig,
    SandboxConfig,
    ValidationConfig,
)
from spade_async.envs.contract import episode_score
from spade_async.envs.validate import validate
from spade_async.inference.pool import EndpointPool
from spade_async.sandbox.runtime import Sandbox
from spade_async.sandbox.session import EnvSession
from spade_async.testing.scripted import ENV_CODE

SEEDS_DIR = Path(__file__).resolve().parents[1] / "spade_async" / "envs" / "seeds"
SEED_FILES = sorted(p for p in SEEDS_DIR.glob("*.py") if p.name != "__init__.py")
# Generous deadlines: a loaded host starts workers slowly, and no check here is about speed.
CFG = SandboxConfig(slots=2, warm_workers=2, call_timeout_s=10.0, start_timeout_s=30.0)
VCFG = ValidationConfig()
KNOB_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def _points(path: Path) -> list[tuple[str, dict]]:
    specs = knob_specs(path.read_text())
    points = [("default", {})]
    points += [(",".join(f"{k}={v}" for k, v in p.items()), p) for p in extremes(specs)]
    points += [(label, values) for label, values in RUNGS.get(path.stem, {}).items()]
    return points


# Once the params branch is merged the validator takes a variant's values itself.
VALIDATE_AT_PARAMS = "params" in inspect.signature(validate).parameters

CASES = [pytest.param(path, values, id=f"{path.stem}[{label}]")
         for path in SEED_FILES for label, values in _points(path)]


@pytest.fixture
async def sandbox():
    async with Sandbox(CFG) as sb:
        yield sb


def test_every_seed_declares_knobs_within_the_contract():
    assert len(SEED_FILES) >= 18, [p.stem for p in SEED_FILES]
    for path in SEED_FILES:
        specs = knob_specs(path.read_text())
        assert 1 <= len(specs) <= 8, (path.stem, list(specs))
        for name, spec in specs.items():
            assert KNOB_NAME.fullmatch(name), (path.stem, name)
            assert isinstance(spec.get("description", ""), str)
            kind, default = spec["type"], spec["default"]
            if kind in ("int", "float"):
                assert spec["min"] < spec["max"] and spec["min"] <= default <= spec["max"], (
                    path.stem, name)
                if kind == "int":
                    assert all(type(spec[k]) is int for k in ("min", "max", "default"))
            elif kind == "bool":
                assert isinstance(default, bool)
            else:
                assert kind == "choice" and default in spec["choices"], (path.stem, name)
        # every family has an easiest rung the bench measures, within its knobs
        assert path.stem in RUNGS, path.stem
        for values in RUNGS[path.stem].values():
            assert set(values) <= set(specs), (path.stem, sorted(set(values) - set(specs)))


def _hint_actions(hint: str) -> list[str | list[str]]:
    """Actions read off a hint (DESIGN §3, check 3b): its text, every number, every quoted
    string, and the numbers as one move sequence in their order."""
    numbers = re.findall(r"-?\d+", hint)
    quoted = re.findall(r"'([^']+)'|\"([^\"]+)\"", hint)
    actions: list[str | list[str]] = [hint, *numbers, *(a or b for a, b in quoted)]
    if len(numbers) > 1:
        actions.append(numbers)
    return list(dict.fromkeys(a if isinstance(a, str) else tuple(a) for a in actions))


async def _play(env: EnvSession, seed: int, actions: str | tuple[str, ...], turns: int) -> float:
    await env.reset(seed)
    seq = [actions] * turns if isinstance(actions, str) else list(actions)
    rewards = []
    for action in seq:
        res = await env.step(action)
        rewards.append(res.reward)
        if res.done:
            break
    return episode_score(rewards)


@pytest.mark.parametrize(("path", "values"), CASES)
async def test_seed_point_validates_and_its_hint_does_not_answer(sandbox, path, values):
    code = with_knobs(path.read_text(), values)
    if VALIDATE_AT_PARAMS:  # the validator checks this one point, the values sent to reset
        report = await validate(path.read_text(), sandbox, VCFG, params=values)
    else:
        report = await validate(code, sandbox, VCFG)
    assert report.accepted, json.dumps(report.as_dict(), indent=1)
    async with sandbox.open(code) as env:
        for seed in VCFG.seeds:
            await env.reset(seed)
            hint = await env.hint()
            # the final action, or its answer part, never stands in the hint as a whole token
            final = (await env.solution())[-1]
            for text in {final, final.split(": ")[-1]}:
                told = re.search(r"(?<![\w-])" + re.escape(text) + r"(?!\w)", hint)
                assert told is None or len(text) < 2, (seed, hint, final)
            for action in _hint_actions(hint):
                score = await _play(env, seed, action, env.meta.max_turns)
                assert score < VCFG.exploit_threshold, (seed, hint, action, score)


async def test_knob_values_reach_reset_and_change_the_task(sandbox):
    """A rung is a different task, not the default one renamed: the observation changes."""
    for path in SEED_FILES:
        easiest = RUNGS[path.stem]["easiest"]
        seen = {}
        for label, values in (("default", {}), ("easiest", easiest)):
            async with sandbox.open(with_knobs(path.read_text(), values)) as env:
                first = await env.reset(5)
                seen[label] = first.observation
                assert first.info.get("knobs", {}) == {
                    **{k: s["default"] for k, s in knob_specs(path.read_text()).items()},
                    **values}, (path.stem, first.info)
        assert seen["default"] != seen["easiest"], path.stem


def test_with_knobs_refuses_unknown_knobs_and_leaves_code_alone_without_values():
    code = (SEEDS_DIR / "arithmetic.py").read_text()
    assert with_knobs(code, {}) == code
    with pytest.raises(ValueError, match="unknown knobs nope"):
        with_knobs(code, {"nope": 1})


async def test_measure_rungs_plays_the_daemons_episodes_unhinted_and_hinted(fake):
    """Against the scripted fake endpoint (it solves only with the hint in its prompt), in the
    real sandbox: rates, n and intervals per rung; a knobbed seed rung plays too."""
    server, chat = fake
    cfg = SimpleNamespace(rollout=RolloutConfig(max_tokens_per_turn=16),
                          model=SimpleNamespace(served_name="policy"))
    rungs = [Rung("countdown", {}, "only", code=ENV_CODE),
             *[r for r in default_rungs(["arithmetic"]) if r.label == "easiest"]]
    async with EndpointPool([EndpointConfig(name="fake", base_url=server.base_url)],
                            PoolConfig()) as pool, Sandbox(CFG) as sb:
        rows = await measure_rungs(cfg, pool, chat, sb, rungs, episodes=4)
    count, arith = rows
    assert count["family"] == "countdown" and count["label"] == "only"
    assert count["unhinted"]["n"] == 4 and count["unhinted"]["solved"] == 0
    assert count["hinted"]["n"] == 2 and count["hinted"]["rate"] == 1.0
    assert count["unhinted"]["ci95"] == [0.0, round(wilson(0, 4)[1], 3)]
    assert arith["params"] == RUNGS["arithmetic"]["easiest"]
    assert arith["unhinted"]["n"] == 4 and arith["unhinted"]["errors"] == 0
    assert arith["examples"][0]["observation"].startswith("What is ")
    with pytest.raises(ValueError, match="no seed family nope"):
        default_rungs(["nope"])
    with pytest.raises(ValueError, match="unknown rung label hardest"):
        default_rungs(["arithmetic"], labels=["hardest"])
    (default,) = default_rungs(["arithmetic"], labels=["default"])
    assert default.params == {"digits": 2, "operations": "+-", "terms": 3}


def test_wilson_interval():
    assert wilson(0, 0) == (0.0, 1.0)
    low, high = wilson(12, 24)
    assert low == pytest.approx(0.314, abs=1e-3) and high == pytest.approx(0.686, abs=1e-3)
    assert wilson(24, 24)[1] == 1.0 and wilson(0, 24)[0] == 0.0


# ---- once the sandbox passes params to reset (the params branch) --------------------------

PARAMS_IN_SANDBOX = "params" in inspect.signature(EnvSession.reset).parameters


@pytest.mark.skipif(not PARAMS_IN_SANDBOX, reason="the sandbox does not pass params to reset yet")
@pytest.mark.parametrize(("path", "values"), CASES)
async def test_seed_point_through_reset_params(sandbox, path, values):
    """The same points, the values passed to reset(seed, params) by the sandbox: the same task
    as with rewritten defaults."""
    specs = knob_specs(path.read_text())
    resolved = {**{k: s["default"] for k, s in specs.items()}, **values}
    async with sandbox.open(path.read_text()) as env, \
            sandbox.open(with_knobs(path.read_text(), values)) as ref:
        for seed in VCFG.seeds:
            got = await env.reset(seed, resolved)
            want = await ref.reset(seed)
            assert (got.observation, got.info) == (want.observation, want.info)
            rewards = []
            for action in await env.solution():
                res = await env.step(action)
                rewards.append(res.reward)
                if res.done:
                    break
            assert episode_score(rewards) >= VCFG.solution_score - 1e-9, (seed, rewards)
