"""Sandbox runtime behaviour that is not about hostile code: isolation choice, the warm pool,
slot limits, the canonical tool-call form, and `spade env play`."""

from __future__ import annotations

import json

import anyio
import pytest
from structlog.testing import capture_logs
from typer.testing import CliRunner

from spade_async.cli import app
from spade_async.core.config import SandboxConfig
from spade_async.envs.contract import parse_tool_call, tool_call_action
from spade_async.sandbox import isolation
from spade_async.sandbox.runtime import Sandbox

TOOL_ENV = '''
import json

class Environment:
    name = "counter"
    description = "Call add until the counter is 3, then submit."
    max_turns = 6
    tools = [{"type": "function", "function": {"name": "add", "description": "add n",
              "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}}]

    def reset(self, seed):
        self.total = 0
        return "counter at 0", {}

    def step(self, action):
        try:
            call = json.loads(action)
        except ValueError:
            return "submitted", float(self.total == 3 and action.strip() == "submit"), True, False, {}
        self.total += int(call["arguments"].get("n", 0))
        return f"counter at {self.total}", 0.0, False, False, {"total": self.total}

    def hint(self):
        return "add 1 three times"

    def solution(self):
        return [json.dumps({"tool": "add", "arguments": {"n": 1}})] * 3 + ["submit"]
'''


def test_no_isolation_available_is_refused_with_the_way_out(monkeypatch):
    monkeypatch.setattr(isolation.shutil, "which", lambda *a, **k: None)
    with pytest.raises(isolation.SandboxUnavailable, match='isolation = "none"') as err:
        isolation.choose_isolation(SandboxConfig())
    assert "'bwrap' not found" in str(err.value)


def test_isolation_none_runs_only_when_asked_and_warns():
    with capture_logs() as logs:
        iso = isolation.choose_isolation(SandboxConfig(isolation="none"))
    assert iso.name == "none" and not iso.layers().namespaces
    assert any(e["event"] == "sandbox_unisolated" and e["log_level"] == "warning" for e in logs)


async def test_warm_pool_serves_episodes_and_slots_bound_concurrency():
    cfg = SandboxConfig(slots=2, warm_workers=2)
    async with Sandbox(cfg) as sb:
        for _ in range(3):
            async with sb.open(TOOL_ENV) as env:
                await env.reset(0)
        assert sb.stats.started_warm == 3 and sb.stats.started_cold == 0
        # Two slots: a third concurrent environment waits until one closes.
        order: list[str] = []

        async def hold(name: str, seconds: float) -> None:
            async with sb.open(TOOL_ENV) as env:
                order.append(f"open {name}")
                await env.reset(0)
                await anyio.sleep(seconds)
            order.append(f"close {name}")

        async with anyio.create_task_group() as tg:
            tg.start_soon(hold, "a", 0.5)
            tg.start_soon(hold, "b", 0.5)
            await anyio.sleep(0.2)
            tg.start_soon(hold, "c", 0.0)
        assert order.index("open c") > min(order.index("close a"), order.index("close b"))
        # Each slot runs under its own uid.
        async with sb.open(TOOL_ENV) as e1, sb.open(TOOL_ENV) as e2:
            assert {e1.worker.info["uid"], e2.worker.info["uid"]} == set(sb.uids)


async def test_tool_calls_arrive_in_canonical_form():
    action = tool_call_action("add", '{"n": 2}')
    assert json.loads(action) == {"tool": "add", "arguments": {"n": 2}}
    assert parse_tool_call(action) == ("add", {"n": 2}) and parse_tool_call("hello") is None
    async with Sandbox(SandboxConfig(slots=1, warm_workers=0)) as sb, sb.open(TOOL_ENV) as env:
        assert env.meta.tools[0]["function"]["name"] == "add"
        await env.reset(0)
        res = await env.step(action)
        assert res.observation == "counter at 2" and res.info == {"total": 2}


def test_env_play_reads_actions_and_shows_rewards(tmp_path):
    path = tmp_path / "counter.py"
    path.write_text(TOOL_ENV)
    typed = 'add {"n": 1}\nadd {"n": 2}\nsubmit\n'
    res = CliRunner().invoke(app, ["env", "play", str(path), "--seed", "3", "--hint"], input=typed)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "[hint] add 1 three times" in out and "counter at 1" in out and "counter at 3" in out
    assert "reward 1" in out and out.rstrip().endswith("score 1")


def test_env_play_a_stored_environment_by_id(tmp_path):
    import anyio as _anyio

    from memory_db.config import MemoryConfig
    from memory_db.records import NewEnv
    from memory_db.store import open_memory

    uri = tmp_path / "data" / "memory"

    async def add() -> str:
        async with open_memory(MemoryConfig(embedding_model="hash-384"), str(uri)) as mem:
            return (await mem.insert(NewEnv(TOOL_ENV, "counter", "count"))).id

    env_id = _anyio.run(add)
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(f'[paths]\ndata_dir = "{tmp_path / "data"}"\n[memory]\nembedding_model = "hash-384"\n')
    typed = 'add {"n": 3}\nsubmit\n'
    res = CliRunner().invoke(app, ["env", "play", env_id[:8], "-c", str(cfg)], input=typed)
    assert res.exit_code == 0, res.output
    assert "== counter" in res.stdout and res.stdout.rstrip().endswith("score 1")
    res = CliRunner().invoke(app, ["env", "play", "ffffffff", "-c", str(cfg)])
    assert res.exit_code == 2 and "no environment 'ffffffff'" in res.output


async def test_two_sandboxes_on_one_host_never_share_a_slot_uid():
    """Slot uids are host-wide (two daemons, an experiment's arms, an eval beside the daemon):
    each sandbox claims its own block (a released block is free again: the next test, on a
    lock directory of its own, since other test processes claim blocks here too)."""
    cfg = SandboxConfig(slots=2, warm_workers=0)
    async with Sandbox(cfg) as a, Sandbox(cfg) as b:
        assert not set(a.uids) & set(b.uids)
        async with a.open(TOOL_ENV) as ea, b.open(TOOL_ENV) as eb:
            assert ea.worker.info["uid"] in a.uids and eb.worker.info["uid"] in b.uids


def test_a_host_whose_slot_uids_are_all_held_is_refused_by_name(tmp_path):
    from spade_async.sandbox.uids import NOBODY, UID_LIMIT, claim_uids

    held = [claim_uids(NOBODY - 4, 2, tmp_path), claim_uids(NOBODY - 4, 2, tmp_path)]
    assert [b.uids for b in held] == [range(NOBODY - 4, NOBODY - 2), range(NOBODY - 2, NOBODY)]
    nxt = claim_uids(NOBODY - 4, 2, tmp_path)  # the block holding `nobody` is skipped
    assert nxt.uids == range(NOBODY + 2, NOBODY + 4)
    top = [claim_uids(UID_LIMIT - 4, 2, tmp_path) for _ in range(2)]  # the last two blocks
    with pytest.raises(isolation.SandboxUnavailable, match="held by another sandbox"):
        claim_uids(UID_LIMIT - 4, 2, tmp_path)
    for b in [*held, nxt, *top]:
        b.release()
    assert claim_uids(NOBODY - 4, 2, tmp_path).uids.start == NOBODY - 4
