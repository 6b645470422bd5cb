"""Hint leaks at play time (issue 18): a hinted episode that wins by copying the hint is
measured (the real sandbox and a scripted endpoint), discounts the designer's reward and flags
the environment, and the memory keeps the leak per variant (real LanceDB), also in a database
written before it existed."""

from __future__ import annotations

import re

import lancedb
import pytest
from typer.testing import CliRunner

from memory_db import SCHEMA_VERSION, MemoryConfig, NewEnv, open_memory
from memory_db.schema import meta_rows
from spade_async.core.config import (
    EndpointConfig,
    PoolConfig,
    RegretConfig,
    RolloutConfig,
    SandboxConfig,
)
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.pool import EndpointPool
from spade_async.reward.regret import env_regret
from spade_async.rollout.episode import play_in_sandbox
from spade_async.sandbox.runtime import Sandbox
from spade_async.testing.fake.server import FakeOpenAIServer

# A leaking hint, played here without validation (which would reject it as hint_leak): the
# play-time measure is what catches leaks validation could not see.
MAGIC = '''
import random

WORDS = ["apple", "brick", "cloud", "ember", "frost", "grove", "ivory", "lemon", "orbit"]

class Environment:
    name = "magic_word"
    description = "Say the magic word."
    max_turns = 1

    def reset(self, seed):
        self.word = random.Random(seed).choice(WORDS)
        return "What is the magic word?", {}

    def step(self, action):
        ok = action.strip().lower() == self.word
        return ("Yes" if ok else "No"), float(ok), True, False, {}

    def hint(self):
        return "The word is " + self.word + "."
'''


async def test_a_hinted_win_copied_from_the_hint_is_measured(checkpoint):
    chat = ChatTokens.from_pretrained(checkpoint)

    def script(ids: list[int]) -> list[int]:
        m = re.search(r"The word is (\w+)\.", chat.decode(ids))
        return chat.encode(m.group(1) if m else "pass") + [chat.tok.eos_token_id]

    server = FakeOpenAIServer()
    server.state.script = script
    server.state.decode = chat.decode
    server.state.eos_token_id = chat.tok.eos_token_id
    server.start()
    try:
        async with EndpointPool([EndpointConfig(name="fake", base_url=server.base_url)],
                                PoolConfig()) as pool, \
                Sandbox(SandboxConfig(slots=2, warm_workers=0)) as sb:
            kw = dict(env_id="magic", model="policy", policy_version=0, cfg=RolloutConfig())
            hinted = [await play_in_sandbox(sb, MAGIC, pool, chat, seed=s, hinted=True, **kw)
                      for s in range(3)]
            unhinted = [await play_in_sandbox(sb, MAGIC, pool, chat, seed=s, hinted=False, **kw)
                        for s in range(3)]
    finally:
        server.stop()
    assert [e.score for e in hinted] == [1.0] * 3 and [e.hint_copy for e in hinted] == [1.0] * 3
    assert all(e.hint.startswith("The word is ") for e in hinted)
    assert [e.score for e in unhinted] == [0.0] * 3
    assert all(e.hint is None and e.hint_copy is None for e in unhinted)
    assert "hint_copy" not in unhinted[0].as_record() and hinted[0].as_record()["hint_copy"] == 1
    r = env_regret([e.score for e in unhinted], [e.score for e in hinted],
                   RegretConfig(signal="hint_gap"), [e.hint_copy for e in hinted])
    assert (r.regret, r.hint_leak, r.leak_flagged, r.designer_reward) == (1.0, 1.0, True, 0.0)


def test_the_leak_discounts_the_reward_whatever_the_signal():
    for signal in ("hint_gap", "learnability", "both"):
        cfg = RegretConfig(signal=signal)
        clean = env_regret([0.0, 1.0], [1.0, 1.0], cfg)
        half = env_regret([0.0, 1.0], [1.0, 1.0], cfg, [0.5, 0.5])
        assert clean.hint_leak == 0.0 and not clean.leak_flagged
        assert half.designer_reward == pytest.approx(0.5 * clean.designer_reward)
        assert half.leak_flagged  # 0.5 >= the default threshold
    low = env_regret([0.0], [1.0], RegretConfig(leak_threshold=0.9), [0.5])
    assert not low.leak_flagged and low.designer_reward == pytest.approx(0.5)


def _cfg() -> MemoryConfig:
    return MemoryConfig(embedding_model="hash-128", writer={"flush_interval_s": 0.005})


def _env(i: int) -> NewEnv:
    return NewEnv(code=f"class Environment:\n    ident = {i}\n", name=f"env-{i}",
                  description=f"task {i}", check_novelty=False)


def test_the_memory_keeps_the_leak_per_variant_and_flags_it(tmp_path):
    import anyio

    from spade_async.cli import app

    data = tmp_path / "data"
    uri = str(data / "memory")

    async def build() -> tuple[str, object]:
        async with open_memory(_cfg(), uri) as mem:
            a = (await mem.insert(_env(1))).id
            b = (await mem.insert(_env(2))).id
            s = await mem.record_episodes(a, hinted=[1.0, 1.0], unhinted=[0.0],
                                          hint_copies=[1.0, 0.5])
            assert s.hint_leak == pytest.approx(0.75)
            s = await mem.record_episodes(a, hinted=[0.0, 1.0], unhinted=[0.0],
                                          hint_copies=[0.0, 0.0])
            assert s.hint_leak == pytest.approx(0.375)
            s = await mem.record_episodes(a, hinted=[1.0], unhinted=[0.0], params={"n": 2},
                                          hint_copies=[1.0])
            assert s.hint_leak == 1.0
            assert (await mem.get(a)).stats.hint_leak == pytest.approx((0.375 * 4 + 1.0) / 5)
            s = await mem.record_episodes(b, hinted=[1.0], unhinted=[1.0])  # not measured
            assert s.hint_leak is None
            with pytest.raises(ValueError, match="2 hint copy scores for 1 hinted"):
                await mem.record_episodes(b, hinted=[1.0], unhinted=[1.0],
                                          hint_copies=[1.0, 1.0])
            return a, await mem.summary()

    a, summary = anyio.run(build)
    assert summary.hint_leak["n"] == 1 and summary.hint_leak["flagged"] == 1
    conf = tmp_path / "spade.toml"
    conf.write_text(f'[paths]\ndata_dir = "{data}"\n\n[memory]\nembedding_model = "hash-128"\n')
    out = CliRunner().invoke(app, ["memory", "show", a, "--config", str(conf)])
    assert out.exit_code == 0, out.output
    assert "hint leak:      0.500  FLAGGED" in out.output
    out = CliRunner().invoke(app, ["memory", "stats", "--config", str(conf)])
    assert out.exit_code == 0, out.output
    assert "hint leak:" in out.output and "(1 flagged >= 0.5)" in out.output


async def test_a_v2_database_gains_hint_leak_on_open(tmp_path):
    uri = str(tmp_path / "m")
    async with open_memory(_cfg(), uri) as mem:
        a = (await mem.insert(_env(1))).id
        await mem.record_episodes(a, hinted=[1.0], unhinted=[0.0])
    db = await lancedb.connect_async(uri)  # back to v2: no hint_leak column, version 2
    await (await db.open_table("env_stats")).drop_columns(["hint_leak", "sandbox_failures"])
    meta = await db.open_table("meta")
    await (meta.merge_insert("key").when_matched_update_all().when_not_matched_insert_all()
           .execute(meta_rows({"schema_version": 2})))
    async with open_memory(_cfg(), uri) as mem:
        st = (await mem.get(a)).stats
        assert st.hint_leak is None and st.episodes_hinted == 1 and st.sandbox_failures == 0
        s = await mem.record_episodes(a, hinted=[1.0], unhinted=[0.0], hint_copies=[1.0])
        assert s.hint_leak == 1.0  # the hinted episode before the upgrade was never measured
        assert SCHEMA_VERSION == 3


async def test_sandbox_failures_are_counted_not_scored(tmp_path):
    """An environment whose code fails in the sandbox is marked as such, not as hard: failed
    episodes never enter the means, the regret or the replay clock."""
    async with open_memory(_cfg(), str(tmp_path / "m")) as mem:
        a = (await mem.insert(_env(1))).id
        s = await mem.record_episodes(a, sandbox_failures=3)
        assert (s.sandbox_failures, s.episodes_unhinted, s.mean_unhinted, s.last_played,
                s.last_tick, s.learnability) == (3, 0, None, None, None, None)
        s = await mem.record_episodes(a, hinted=[1.0], unhinted=[0.0, 1.0], sandbox_failures=1)
        assert (s.sandbox_failures, s.episodes_unhinted, s.mean_unhinted) == (4, 2, 0.5)
        assert s.last_tick is not None
        with pytest.raises(ValueError, match="no episodes to record"):
            await mem.record_episodes(a)
        b = (await mem.insert(_env(2))).id
        await mem.record_episodes(b, sandbox_failures=2, params={"n": 1})
        assert (await mem.get(b)).stats.sandbox_failures == 2
        summary = await mem.summary()
    assert summary.sandbox_failing == {"envs": 2, "never_scored": 1}
    assert summary.played == 1  # b failed every episode: it was never played
