"""The designer's edit move: neighbouring settings, the choice-constrained answer, and the daemon
running edits against the fake endpoint, where the reward points the knob toward what the
targeting signal asks (learnability: an agent that solves about half)."""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest

from spade_async.core.config import (
    DaemonConfig,
    EndpointConfig,
    PathsConfig,
    PoolConfig,
    RegretConfig,
    RolloutConfig,
    SandboxConfig,
    SpadeConfig,
)
from spade_async.core.config.corpus import CorpusConfig, JsonlSourceConfig
from spade_async.design.edit import candidate_params, edit_messages, propose_edit, render_params
from spade_async.envs.knob_steps import edit_steps
from spade_async.envs.knobs import check_params_schema, resolve_params
from spade_async.inference.constrained import TokenBytes
from spade_async.inference.pool import EndpointPool
from spade_async.testing.daemon import run_daemon, run_records
from spade_async.testing.memory import DictMemory

# Solved unhinted exactly when n % 12 >= level (the scripted agent below): p = (12 - level) / 12.
LEVEL_ENV = '''import random


class Environment:
    name = "levels"
    description = "Reply with the number you are shown."
    max_turns = 1
    params = {"level": {"type": "int", "min": 0, "max": 12, "default": 12,
                        "description": "higher is harder"}}

    def reset(self, seed, params=None):
        self.level = (params or {}).get("level", 12)
        self.n = random.Random(seed).randint(100, 999)
        self.done = False
        return f"level {self.level}: say {self.n}", {}

    def step(self, action):
        if self.done:
            return "over", 0.0, True, False, {}
        self.done = True
        return "done", 1.0 if action.strip() == str(self.n) else 0.0, True, False, {}

    def hint(self):
        return "repeat what you see"

    def solution(self):
        return [str(self.n)]
'''

SPECS = check_params_schema({
    "digits": {"type": "int", "min": 1, "max": 20, "default": 10},
    "op": {"type": "choice", "choices": ["+", "-", "*"], "default": "+"},
    "carry": {"type": "bool", "default": False},
    "noise": {"type": "float", "min": 0.0, "max": 1.0, "default": 0.5},
})


def test_candidates_are_one_knob_neighbours_within_range():
    current = resolve_params(SPECS, {})
    cands = candidate_params(SPECS, current, random.Random(0), limit=32)
    assert cands and all(resolve_params(SPECS, c) == c for c in cands)  # every one is valid
    for c in cands:
        assert [k for k in current if c[k] != current[k]] == [
            k for k, n in edit_steps(SPECS, current, c).items() if n == 1]
    # digits 1..20 is wide: its scale doubles (1, 2, 4, 8, 20), 10 lies between 8 and 20
    assert sorted(c["digits"] for c in cands if c["digits"] != 10) == [8, 20]
    assert sorted(c["op"] for c in cands if c["op"] != "+") == ["-"]  # the adjacent choice
    assert [c["carry"] for c in cands if c["carry"]] == [True]
    assert sorted(c["noise"] for c in cands if c["noise"] != 0.5) == [0.4, 0.6]
    # at a range's end only the inward moves remain; the limit is spread over the knobs
    edge = candidate_params(SPECS, {**current, "digits": 1}, random.Random(0), limit=32)
    assert sorted(c["digits"] for c in edge if c["digits"] != 1) == [2]
    few = candidate_params(SPECS, current, random.Random(1), limit=4)
    assert len(few) == 4 and {next(k for k in current if c[k] != current[k])
                              for c in few} == set(current)


def test_prompt_shows_knobs_stats_and_options():
    current = resolve_params(SPECS, {})
    options = [render_params(c) for c in candidate_params(SPECS, current, random.Random(0), 4)]
    msgs = edit_messages("adder", "Add two numbers.", SPECS, current, [], options, "learnability")
    user = msgs[1]["content"]
    assert "half of the time" in msgs[0]["content"]
    assert "- digits (int from 1 to 20, default 10)" in user
    assert 'one of "+", "-", "*"' in user
    assert all(f"- {o}" in user for o in options)


@pytest.fixture
def fake_with_choices(fake):
    server, chat = fake
    server.state.encode = chat.encode
    return server, chat


async def test_propose_edit_reads_the_constrained_answer(fake_with_choices, tmp_path):
    server, chat = fake_with_choices
    vocab = TokenBytes(chat.tok, chat.eos_ids)
    current = resolve_params(SPECS, {})
    cands = candidate_params(SPECS, current, random.Random(0), 4)
    server.state.choose = lambda choices, prompt: choices[2]
    cfg = PoolConfig(wait_for_endpoint_s=5)
    async with EndpointPool([EndpointConfig(name="fake", base_url=server.base_url)], cfg) as pool:
        kw = dict(env_id="e1", name="adder", description="Add.", specs=SPECS, current=current,
                  played=[], candidates=cands, signal="hint_gap", model="policy",
                  policy_version=3, temperature=1.0, deadline_s=None)
        d = await propose_edit(pool, chat, vocab, **kw)
        body = server.state.completions[-1]
        assert body["structured_outputs"]["choice"] == [render_params(c) for c in cands]
        assert d.move == "edit" and d.params == cands[2] and d.parent == "e1"
        sampled = [t for t, m in zip(d.token_ids, d.loss_mask, strict=True) if m]
        assert len(d.allowed) == len(sampled) and all(
            t in a for t, a in zip(sampled, d.allowed, strict=True))
        # a server whose answer breaks the constraint: no params, and no trusted sample
        server.state.choose = lambda choices, prompt: '{"digits": 99}'
        bad = await propose_edit(pool, chat, vocab, **kw)
        assert bad.params is None and bad.allowed is None and "constraint" in bad.error


def _daemon_config(tmp_path, server, signal: str) -> SpadeConfig:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"id": "doc1", "text": "Numbers. " * 20}) + "\n")
    return SpadeConfig(
        paths=PathsConfig(data_dir=tmp_path / "data"),
        endpoints=[EndpointConfig(name="fake", base_url=server.base_url)],
        pool=PoolConfig(wait_for_endpoint_s=5),
        sandbox=SandboxConfig(slots=8, warm_workers=2),
        rollout=RolloutConfig(k_unhinted=12, k_hinted=2, max_tokens_per_turn=8),
        daemon=DaemonConfig(moves={"write": 0.0, "edit": 1.0}, edits_per_variant=4,
                            edit_options=4, examples_k=0, replay_probability=0.0,
                            documents_in_flight=1),
        regret=RegretConfig(signal=signal),
        corpus=CorpusConfig(source=JsonlSourceConfig(path=corpus, id_field="id"), min_chars=10),
    )


def _levels_memory() -> DictMemory:
    """A memory holding LEVEL_ENV, accepted, never played."""
    memory = DictMemory()
    memory.envs["lv"] = {"code": LEVEL_ENV, "status": "accepted", "doc_id": "seed:levels",
                         "chunk_id": "seed", "reason": "", "policy_version": 0}
    return memory


def _agent(chat):
    def script(prompt_ids: list[int]) -> list[int]:
        text = chat.tok.decode(prompt_ids)
        level, n = (int(x) for x in re.findall(r"level (\d+): say (\d+)", text)[-1])
        reply = str(n) if n % 12 >= level else "no idea"
        return chat.encode(reply) + [chat.tok.eos_token_id]
    return script


async def test_daemon_edits_move_the_knob_where_learnability_pays(fake_with_choices, tmp_path):
    server, chat = fake_with_choices
    server.state.script = _agent(chat)
    pick = random.Random(0)
    server.state.choose = lambda choices, prompt: pick.choice(choices)
    cfg = _daemon_config(tmp_path, server, "learnability")
    memory = _levels_memory()
    _, spool = await run_daemon(cfg, chat, memory, tmp_path, iterations=4)

    designs = run_records(tmp_path, "designs")
    assert designs and {d["move"] for d in designs} == {"edit"}
    assert all(d["status"] == "accepted" and d["family"] == "levels" for d in designs)
    # the first edits start from the easiest point (level 0, never played): one step up is
    # the only move, so the parent's own setting is offered beside it; later ones from the
    # most learnable variant played
    assert designs[0]["parent"].startswith("lv.")
    assert {d["params"]["level"] for d in designs[:4]} <= {0, 1}
    assert designs[0]["direction"] == "either" and designs[0]["parent_solve"] is None
    for d in designs:  # one knob, moved at most one neighbour step (level 0..12: steps of 1)
        assert d["knob_steps"] == {"level": abs(d["params"]["level"]
                                                - d["parent_params"]["level"])}
        assert d["knob_steps"]["level"] <= 1
        if d["parent_solve"] == 1.0:  # always solved: only harder (or the parent again)
            assert d["direction"] == "harder"
            assert d["params"]["level"] >= d["parent_params"]["level"]
    plays = run_records(tmp_path, "plays")
    assert all(p["move"] == "edit" and p["name"] == "levels" for p in plays)
    levels = [p["params"]["level"] for p in plays]
    assert max(levels) >= 2  # the knob moved up, toward where the agent solves about half
    for p in plays:  # the reward is learnability: 4 p (1 - p) of the unhinted solve rate
        solved = sum(s >= 1 for s in p["unhinted"]) / len(p["unhinted"])
        assert p["designer_reward"] == pytest.approx(4 * solved * (1 - solved))
        assert p["signal"] == "learnability"
    # memory stats per variant: each level its own entry
    assert {d.get("level") for d in memory.params_played} == set(levels)
    # designer samples: the edit's tokens with their allowed sets; within a group the edit
    # that landed nearer p = 1/2 got the larger advantage
    seen_group = False
    seq = 0
    while (batch := spool.claim_next(seq)) is not None:
        seq = batch.seq
        edits = [s for s in batch.samples() if s.role == "designer"]
        for s in edits:
            assert s.move == "edit" and s.allowed_tokens is not None
            assert len(s.allowed_tokens) == sum(s.loss_mask)
        if len({s.reward for s in edits}) > 1:
            seen_group = True
            by_reward = sorted(edits, key=lambda s: s.reward)
            assert by_reward[0].advantage < 0 < by_reward[-1].advantage
    assert seen_group
    counters = json.loads((tmp_path / "run" / "status.json").read_text())["counters"]
    assert counters["moves_edit_proposed"] == len(designs) == counters["moves_edit_accepted"]
    assert counters["moves_edit_played"] == len(plays) and "moves_write_proposed" not in counters


@pytest.mark.parametrize(("unhinted", "direction", "levels"), [
    ([0.0] * 12, "easier", {5, 6}),  # never solved: one step toward easy, or play it again
    ([1.0] * 12, "harder", {6, 7}),  # always solved: one step away from easy, or again
    ([1.0] * 6 + [0.0] * 6, "either", {5, 6, 7}),  # in the band: both neighbours, or again
    ([1.0] + [0.0] * 11, "easier", {5, 6}),  # below daemon.edit_band (0.2, 0.8): easier
    ([1.0] * 11 + [0.0], "harder", {6, 7}),  # above it: harder
])
async def test_daemon_edit_options_follow_the_parents_solve_rate(fake_with_choices, tmp_path,
                                                                 unhinted, direction, levels):
    server, chat = fake_with_choices
    server.state.script = _agent(chat)
    offered: list[list[str]] = []

    def choose(choices, prompt):
        offered.append(list(choices))
        return choices[len(offered) % len(choices)]

    server.state.choose = choose
    cfg = _daemon_config(tmp_path, server, "learnability")
    memory = _levels_memory()
    await memory.record_play("lv", unhinted, [1.0, 1.0], params={"level": 6})
    await run_daemon(cfg, chat, memory, tmp_path, iterations=1)

    assert offered and all({json.loads(o)["level"] for o in opts} == levels for opts in offered)
    designs = run_records(tmp_path, "designs")
    assert designs and all(d["direction"] == direction and d["parent_params"] == {"level": 6}
                           for d in designs)
    assert {d["parent_solve"] for d in designs} == {sum(unhinted) / len(unhinted)}
    assert all(d["knob_steps"]["level"] <= 1 for d in designs)


@pytest.mark.parametrize(("rung", "level"), [("easiest", 0), ("default", 12)])
async def test_an_environment_never_played_is_first_played_at_its_easiest_point(
        fake_with_choices, tmp_path, rung, level):
    """ACCEL starts from simple levels: a stored environment never played (a bootstrap seed)
    is replayed at its easiest point (`daemon.unseen_rung`), not at defaults a small model
    cannot solve; "default" keeps the old behaviour."""
    server, chat = fake_with_choices
    server.state.script = _agent(chat)
    server.state.choose = lambda choices, prompt: choices[0]
    cfg = _daemon_config(tmp_path, server, "learnability")
    cfg = cfg.model_copy(update={"daemon": cfg.daemon.model_copy(
        update={"replay_probability": 1.0, "unseen_rung": rung})})
    memory = _levels_memory()
    memory.replay_ids = ["lv"]
    await run_daemon(cfg, chat, memory, tmp_path, iterations=1)

    plays = run_records(tmp_path, "plays")
    replays = [p for p in plays if p["move"] == "replay"]
    assert replays and all(p["params"] == {"level": level} for p in replays), replays
    solved = [sum(s >= 1 for s in p["unhinted"]) for p in replays]
    assert all(n == (12 if level == 0 else 0) for n in solved)  # level 0: always solved


def test_a_family_whose_easiest_point_is_never_solved_is_out_of_reach():
    """The edit parent skips (mostly) a family whose easiest point was played twice over and
    never solved: every edit from there is a play at 0."""
    from types import SimpleNamespace

    from memory_db.records import EnvStats
    from spade_async.loop.edit import Edits
    from spade_async.loop.ports import StoredEnv

    specs = check_params_schema({"digits": {"type": "int", "min": 1, "max": 4, "default": 2}})
    edits = Edits.__new__(Edits)
    edits.ctx = SimpleNamespace(known_meta=lambda env_id: SimpleNamespace(params=specs))
    env = StoredEnv("e1", "code", "fam")

    def variant(digits: int, episodes: int, mean: float):
        return SimpleNamespace(params={"digits": digits},
                               stats=EnvStats("v", episodes_unhinted=episodes, mean_unhinted=mean))

    assert edits._out_of_reach(env, [variant(1, 16, 0.0), variant(2, 8, 0.0)])
    assert not edits._out_of_reach(env, [variant(1, 8, 0.0)])      # not played enough yet
    assert not edits._out_of_reach(env, [variant(1, 24, 0.25)])    # solved sometimes
    assert not edits._out_of_reach(env, [variant(2, 40, 0.0)])     # only harder points at 0
    edits.ctx = SimpleNamespace(known_meta=lambda env_id: SimpleNamespace(params=()))
    assert not edits._out_of_reach(env, [variant(1, 16, 0.0)])     # no knobs: never


def test_edit_parents_are_drawn_by_their_family_promise():
    """The family to edit is drawn by the highest learnability p(1-p) among its played
    variants (the frontier), an unplayed family as the most promising, none ever at 0."""
    import random
    from types import SimpleNamespace

    from memory_db.records import EnvStats
    from spade_async.loop.edit import PROMISE_FLOOR, family_promise, frontier_order
    from spade_async.loop.ports import StoredEnv

    def played(*rates):
        return [SimpleNamespace(stats=EnvStats("v", learnability=r * (1 - r))) for r in rates]

    assert family_promise(played(0.875, 0.5)) == 0.25
    assert family_promise(played()) == 0.25                       # unplayed: explore
    assert family_promise(played(0.0, 1.0)) == PROMISE_FLOOR      # never dropped for good
    families = [StoredEnv(n, "code", n) for n in ("hopeless", "hard", "frontier")]
    played_of = {"hopeless": played(0.0), "hard": played(0.15), "frontier": played(0.6, 0.9)}
    rng = random.Random(0)
    first = Counter(frontier_order(families, played_of, rng)[0].env_id for _ in range(4000))
    weights = {k: family_promise(v) for k, v in played_of.items()}
    for name, w in weights.items():   # the first place goes by weight (the shuffle's law)
        assert abs(first[name] / 4000 - w / sum(weights.values())) < 0.03, (first, weights)
    orders = [frontier_order(families, played_of, rng) for _ in range(50)]
    assert all(sorted(e.env_id for e in o) == sorted(played_of) for o in orders)
