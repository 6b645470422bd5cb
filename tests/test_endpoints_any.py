"""Any OpenAI-compatible endpoint, against the fake in its vLLM-like and its chat-only (hosted
API) modes: capabilities probed and shown, roles on their own endpoints (a frozen designer on a
chat-only server while the agent plays on the tokens path), a start-up error that names the
endpoint when training is asked of a chat-only server, 429 + Retry-After, the API key kept out
of every file a run writes. The same against llama.cpp's real server: test_llama_server.py."""

from __future__ import annotations

import email.utils
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spade_async.core.config import ConfigError, load_config
from spade_async.evals.base import EvalFailed
from spade_async.evals.run import evaluate_version
from spade_async.inference.errors import EndpointCapabilityError, EndpointServerError, retry_after_s
from spade_async.inference.pool import EndpointPool
from spade_async.inference.roles import RoleCapabilityError, check_roles
from spade_async.testing.fake.server import FakeOpenAIServer
from spade_async.testing.fake.state import FakeState
from spade_async.testing.scripted import ENV_CODE

REPO = Path(__file__).resolve().parents[1]
SPADE = [sys.executable, "-m", "spade_async.cli"]
SECRET = "sk-test-9f3c1e77b2d04a55"  # what the hosted fake demands; must never be written


@pytest.fixture
def hosted():
    """A hosted-API stand-in: chat completions only, an API key, a designer that writes the
    known environment."""
    state = FakeState(base_model="frozen-designer", chat_only=True, api_key=SECRET,
                      chat_script=lambda msgs: f"Here it is.\n```python\n{ENV_CODE}```")
    server = FakeOpenAIServer(state).start()
    yield server
    server.stop()


def _toml(tmp_path: Path, agent_url: str, hosted_url: str | None, *, roles: str = "",
          checkpoint: Path) -> Path:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"id": "doc1", "text": "Countdown games train attention. " * 20})
                      + "\n")
    hosted_block = "" if hosted_url is None else f'''
[[endpoints]]
name = "hosted"
group = "hosted"
base_url = "{hosted_url}"
api_key_env = "SPADE_TEST_HOSTED_KEY"
weight_swap = {{ type = "none" }}
headers = {{ "X-Team" = "spade-tests" }}
'''
    agent_block = "" if agent_url is None else f'''
[[endpoints]]
name = "local"
base_url = "{agent_url}"
'''
    path = tmp_path / "cfg.toml"
    path.write_text(f'''
[paths]
data_dir = "{tmp_path / 'data'}"
[model]
tokenizer = "{checkpoint}"
{agent_block}
{hosted_block}
{roles}
[pool]
wait_for_endpoint_s = 5
[sandbox]
slots = 4
warm_workers = 1
[rollout]
k_unhinted = 2
k_hinted = 2
max_tokens_per_turn = 16
[daemon]
designs_per_document = 2
examples_k = 0
replay_probability = 0.0
documents_in_flight = 1
[eval]
every_versions = 0
[corpus]
min_chars = 10
[corpus.source]
type = "jsonl"
path = "{corpus}"
id_field = "id"
''')
    return path


def _spade(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPADE_TEST_HOSTED_KEY": SECRET, "HF_HUB_OFFLINE": "1"}
    env.pop("SPADE_CONFIG", None)
    return subprocess.run([*SPADE, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)


async def test_capabilities_of_a_vllm_like_and_a_chat_only_server(fake, hosted):
    from spade_async.core.config import EndpointConfig

    server, _ = fake
    eps = [EndpointConfig(name="local", base_url=server.base_url),
           EndpointConfig(name="hosted", base_url=hosted.base_url, group="hosted",
                          api_key_env="SPADE_TEST_HOSTED_KEY", weight_swap={"type": "none"})]
    os.environ["SPADE_TEST_HOSTED_KEY"] = SECRET
    try:
        async with EndpointPool(eps) as pool:
            health = {h.name: h for h in await pool.check()}
    finally:
        os.environ.pop("SPADE_TEST_HOSTED_KEY")
    local, remote = health["local"].capabilities, health["hosted"].capabilities
    assert local is not None and remote is not None
    assert local.tokens_path and local.chat and local.structured
    assert set(local.swap or ()) == {"vllm-lora", "vllm-reload", "vllm-nccl"}
    assert not remote.tokens_path and remote.chat and remote.swap is None
    assert not remote.completions and "HTTP 404" in remote.notes["completions"]
    assert remote.missing("tokens")[0].startswith("POST /v1/completions (HTTP 404")
    assert health["hosted"].as_dict()["capabilities"]["paths"] == ["chat"]
    # The probe never counted as traffic (and carried the key: the fake answers 401 without).
    assert hosted.state.requests == 0 and server.state.requests == 0


async def test_a_chat_only_route_missing_is_a_capability_error_not_a_retry_loop(hosted):
    from spade_async.core.config import EndpointConfig, PoolConfig

    os.environ["SPADE_TEST_HOSTED_KEY"] = SECRET
    try:
        ep = EndpointConfig(name="hosted", base_url=hosted.base_url,
                            api_key_env="SPADE_TEST_HOSTED_KEY")
        async with EndpointPool([ep], PoolConfig(wait_for_endpoint_s=2)) as pool:
            t0 = time.monotonic()
            # Before any probe: the 404 for the route is not "model not served" (an outage
            # the daemon would wait out for ever) but a capability error, at once.
            with pytest.raises(EndpointCapabilityError, match="no POST /v1/completions"):
                await pool.complete([1, 2, 3], model="frozen-designer", max_tokens=4)
            assert time.monotonic() - t0 < 2
            await pool.check()
            # Once probed, the pool refuses before sending anything.
            with pytest.raises(EndpointCapabilityError, match="lacks POST /v1/completions"):
                await pool.complete([1, 2, 3], model="frozen-designer", max_tokens=4)
            out = await pool.chat([{"role": "user", "content": "hi"}], model="frozen-designer",
                                  token_level=False, max_tokens=8)
            assert out.path == "chat" and "```python" in out.text
    finally:
        os.environ.pop("SPADE_TEST_HOSTED_KEY")


async def test_429_retry_after_is_honoured_seconds_and_http_date():
    from spade_async.core.config import EndpointConfig, PoolConfig

    state = FakeState(rate_limit_next=1, retry_after="1")
    with FakeOpenAIServer(state) as server:
        cfg = PoolConfig(backoff_initial_s=0.01, backoff_max_s=0.02)
        async with EndpointPool([EndpointConfig(name="a", base_url=server.base_url)],
                                cfg) as pool:
            await pool.chat([{"role": "user", "content": "x"}], model="policy", max_tokens=2)
            # The retry waited for Retry-After (1 s), not the 10-20 ms back-off.
            assert state.served_at[-1] - state.rate_limited[0] >= 0.95
            # An HTTP date two seconds ahead.
            state.rate_limit_next = 1
            state.retry_after = email.utils.formatdate(time.time() + 2, usegmt=True)
            await pool.chat([{"role": "user", "content": "y"}], model="policy", max_tokens=2)
            assert state.served_at[-1] - state.rate_limited[1] >= 0.9
            # Rate-limited on every attempt: the pool gives up, saying so.
            state.rate_limit_next, state.retry_after = 10, "0"
            with pytest.raises(EndpointServerError, match="HTTP 429") as info:
                await pool.chat([{"role": "user", "content": "z"}], model="policy", max_tokens=2)
            assert info.value.kind == "http_429" and info.value.attempts == cfg.max_attempts


def test_retry_after_parsing():
    now = 1_800_000_000.0
    assert retry_after_s("7", now) == 7.0
    assert retry_after_s(email.utils.formatdate(now + 30, usegmt=True), now) == pytest.approx(30)
    assert retry_after_s(email.utils.formatdate(now - 30, usegmt=True), now) == 0.0
    assert retry_after_s("soon", now) is None and retry_after_s(None, now) is None


def test_config_keys_come_from_env_vars_only(tmp_path, checkpoint):
    path = _toml(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:10", checkpoint=checkpoint)
    text = path.read_text()
    inline = tmp_path / "inline.toml"
    inline.write_text(text.replace('api_key_env = "SPADE_TEST_HOSTED_KEY"',
                                   f'api_key = "{SECRET}"'))
    with pytest.raises(ConfigError, match="api_key is not read from a config.*api_key_env"):
        load_config(inline, environ={})
    cfg = load_config(path, environ={})
    with pytest.raises(ConfigError, match="SPADE_TEST_HOSTED_KEY \\(api_key_env\\) is not set"):
        cfg.endpoints[1].request_headers()
    # Roles: a designer on another group must be a named (frozen) model; groups must exist.
    bad = tmp_path / "bad.toml"
    bad.write_text(text + '\n[roles.designer]\ngroup = "hosted"\n')
    with pytest.raises(ConfigError, match="roles.designer.model is unset"):
        load_config(bad, environ={})
    bad.write_text(text + '\n[roles.eval]\ngroup = "nowhere"\nmodel = "m"\n')
    with pytest.raises(ConfigError, match="roles.eval.group 'nowhere' names no endpoint"):
        load_config(bad, environ={})
    bad.write_text(text + '\n[roles.agent]\npath = "chat"\n')
    with pytest.raises(ConfigError, match="roles.agent.path cannot be chat"):
        load_config(bad, environ={})


def test_training_through_a_chat_only_server_fails_at_start_naming_it(tmp_path, hosted,
                                                                       checkpoint):
    # The only endpoint is chat-only: the agent (trained) cannot run there.
    cfg = _toml(tmp_path, None, hosted.base_url, checkpoint=checkpoint,
                roles='[roles.agent]\ngroup = "hosted"\n[roles.designer]\ngroup = "hosted"\n'
                      '[roles.eval]\ngroup = "hosted"\n')
    t0 = time.monotonic()
    proc = _spade("run", "-c", str(cfg), "--max-iterations", "1")
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert any("endpoint 'hosted'" in ln and "cannot serve roles.agent on the tokens path"
               in ln and "POST /v1/completions" in ln for ln in errors), errors
    assert time.monotonic() - t0 < 120  # no retry loop
    assert hosted.state.requests == 0
    # `spade endpoints check` shows why, and the same problems.
    proc = _spade("endpoints", "check", "-c", str(cfg), "--json")
    assert proc.returncode == 3  # up, but a role cannot run there
    out = json.loads(proc.stdout)
    (ep,) = out["endpoints"]
    assert ep["capabilities"]["paths"] == ["chat"] and ep["capabilities"]["swap"] is None
    assert out["roles"]["agent"]["path"] == "tokens"
    assert any("roles.agent" in p for p in out["problems"])
    assert SECRET not in proc.stdout + proc.stderr


def test_frozen_designer_on_a_chat_only_server_while_the_agent_plays_on_tokens(
        tmp_path, fake, hosted, checkpoint):
    server, _ = fake
    roles = '[roles.designer]\ngroup = "hosted"\nmodel = "frozen-designer"\n'
    cfg = _toml(tmp_path, server.base_url, hosted.base_url, roles=roles, checkpoint=checkpoint)
    proc = _spade("run", "-c", str(cfg), "--max-iterations", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "data" / "run"
    designs = [json.loads(x) for x in (run / "designs.jsonl").read_text().splitlines()]
    assert len(designs) == 2
    assert {(d["path"], d["model"]) for d in designs} == {("chat", "frozen-designer")}
    assert "accepted" in {d["status"] for d in designs}
    # Designs came from the hosted server only; the agent played on the local one.
    assert hosted.state.requests == 2
    assert server.state.script.designs == 0 and server.state.completions
    plays = [json.loads(x) for x in (run / "plays.jsonl").read_text().splitlines()]
    assert len(plays) == 1 and plays[0]["hinted"] == [1.0, 1.0]
    status = json.loads((run / "status.json").read_text())
    assert status["roles"]["designer"] == {"role": "designer", "group": "hosted",
                                           "model": "frozen-designer", "path": "chat",
                                           "trained": False}
    # Not trained on: no designer sample reached the spool.
    assert status["counters"]["designer_samples_frozen"] == 2
    assert status["ledger"]["designer"] == {"played": 2, "written": 0,
                                            "dropped": {"frozen": 2}, "in_flight": 0}
    assert status["tokens"]["roles"]["designer"]["requests"] == 2  # counted on the chat path
    from spade_async.core.spool.files import FileSpool

    with FileSpool(tmp_path / "data" / "spool", writer=False) as spool:
        seq = 0
        while (batch := spool.claim_next(seq)) is not None:
            assert all(s.role == "agent" for s in batch.samples())
            seq = batch.seq
    # The key was sent (the fake refuses requests without it) but is in no file of the run,
    # nor in its logs.
    written = [p for p in (tmp_path / "data").rglob("*") if p.is_file()]
    assert (run / "config.resolved.json") in written
    for p in written:
        assert SECRET.encode() not in p.read_bytes(), p
    assert SECRET not in proc.stdout + proc.stderr
    resolved = json.loads((run / "config.resolved.json").read_text())
    assert resolved["endpoints"][1]["api_key_env"] == "SPADE_TEST_HOSTED_KEY"


async def test_eval_through_a_chat_only_server_and_no_score_from_a_dead_one(tmp_path, hosted,
                                                                             checkpoint):
    from spade_async.inference.chat_tokens import ChatTokens

    cfg_path = _toml(tmp_path, None, hosted.base_url, checkpoint=checkpoint,
                     roles='[roles.agent]\ngroup = "hosted"\n[roles.designer]\ngroup = "hosted"\n'
                           '[roles.eval]\ngroup = "hosted"\nmodel = "frozen-designer"\n')
    os.environ["SPADE_TEST_HOSTED_KEY"] = SECRET
    try:
        cfg = load_config(cfg_path, environ={})
        hosted.state.chat_script = lambda msgs: "<answer>7</answer>"
        chat = ChatTokens.from_pretrained(checkpoint)
        async with EndpointPool(cfg.endpoints, cfg.pool) as pool:
            await pool.check()
            check_roles(cfg, pool, ("eval",))
            with pytest.raises(RoleCapabilityError, match="roles.agent on the tokens path"):
                check_roles(cfg, pool, ("agent",))
            (res,) = await evaluate_version(cfg, pool, chat, version=0, model="frozen-designer",
                                            suites=["reasoning-gym"], limit=4)
        assert (res.n, res.scored, res.path, res.external) == (4, 4, "chat", True)
        assert hosted.state.requests == 4
        stored = json.loads((tmp_path / "data" / "eval" / "results.jsonl").read_text())
        assert stored["path"] == "chat" and stored["external"]
        # A server that refuses every task: nothing is stored as a score of 0.
        hosted.state.fail_next, hosted.state.fail_status = 100, 400
        async with EndpointPool(cfg.endpoints, cfg.pool) as pool:
            await pool.check()
            with pytest.raises(EvalFailed, match="no task got a score"):
                await evaluate_version(cfg, pool, chat, version=1, model="frozen-designer",
                                       suites=["reasoning-gym"], limit=2)
        lines = (tmp_path / "data" / "eval" / "results.jsonl").read_text().splitlines()
        assert len(lines) == 1
    finally:
        os.environ.pop("SPADE_TEST_HOSTED_KEY")


TOOL_ENV = '''
import json


class Environment:
    name = "adder"
    description = "Add the two numbers with the add tool, then reply with the sum alone."
    max_turns = 3
    tools = [{"type": "function", "function": {
        "name": "add", "description": "a + b",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                        "b": {"type": "integer"}},
                       "required": ["a", "b"]}}}]

    def reset(self, seed):
        self.a, self.b = 2, seed % 7
        return f"Add {self.a} and {self.b}.", {}

    def step(self, action):
        try:
            call = json.loads(action)
        except ValueError:
            call = None
        if isinstance(call, dict) and call.get("tool") == "add":
            args = call.get("arguments", {})
            return str(args.get("a", 0) + args.get("b", 0)), 0.0, False, False, {}
        right = action.strip() == str(self.a + self.b)
        return "done", 1.0 if right else 0.0, True, False, {}

    def hint(self):
        return "call add"

    def solution(self):
        return [json.dumps({"tool": "add", "arguments": {"a": self.a, "b": self.b}}),
                str(self.a + self.b)]
'''


async def test_chat_path_episode_with_native_tool_calls(hosted):
    """A multi-turn episode on the chat path: the environment's tools go as the request's
    `tools`, the server's tool call is the action, its result comes back as a `tool`
    message, and the final text answer scores (what BFCL multi-turn does on such servers)."""
    from spade_async.core.config import EndpointConfig, RolloutConfig, SandboxConfig
    from spade_async.rollout.episode import run_episode_chat
    from spade_async.sandbox.runtime import Sandbox

    def script(messages: list[dict]) -> str | dict:
        if messages[-1]["role"] == "tool":
            return messages[-1]["content"]  # the tool's result is the sum
        return {"content": None, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "add", "arguments": '{"a": 2, "b": 5}'}}]}

    hosted.state.chat_script = script
    os.environ["SPADE_TEST_HOSTED_KEY"] = SECRET
    try:
        ep_cfg = EndpointConfig(name="hosted", base_url=hosted.base_url,
                                api_key_env="SPADE_TEST_HOSTED_KEY")
        async with EndpointPool([ep_cfg]) as pool, Sandbox(SandboxConfig(slots=2)) as sb:
            await pool.check()
            async with sb.open(TOOL_ENV) as env:
                ep = await run_episode_chat(env, pool, env_id="adder", seed=5, hint=None,
                                            model="frozen-designer", policy_version=0,
                                            cfg=RolloutConfig(max_tokens_per_turn=32),
                                            native_tools=True)
    finally:
        os.environ.pop("SPADE_TEST_HOSTED_KEY")
    assert ep.error is None and ep.score == 1.0 and ep.path == "chat"
    assert [t.action for t in ep.turns] == ['{"arguments": {"a": 2, "b": 5}, "tool": "add"}',
                                            "7"]
    first, second = hosted.state.chats
    assert first["tools"][0]["function"]["name"] == "add"
    assert "return_token_ids" not in first and "logprobs" not in first
    assert "To call a tool" not in first["messages"][0]["content"]  # the server shows the tools
    assistant, tool = second["messages"][-2:]
    assert assistant["tool_calls"][0]["id"] == "call_1"
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": "7"}
    assert ep.as_record()["path"] == "chat"


async def test_capabilities_are_probed_again_when_an_endpoint_comes_back():
    """A server restarted behind the same URL may be another one: after an outage the pool
    probes again, and routing follows what it can do now."""
    from spade_async.core.config import EndpointConfig, PoolConfig

    server = FakeOpenAIServer().start()
    try:
        cfg = PoolConfig(wait_for_endpoint_s=1, health_interval_s=0.2)
        async with EndpointPool([EndpointConfig(name="a", base_url=server.base_url)],
                                cfg) as pool:
            await pool.check()
            assert pool.capabilities("a").tokens_path
            server.stop()
            (h,) = await pool.check()
            assert not h.up
            server.state.chat_only = True  # back as a chat-only server
            server.start()
            (h,) = await pool.check()
            assert h.up and h.capabilities.as_dict()["paths"] == ["chat"]
            with pytest.raises(EndpointCapabilityError, match="lacks POST /v1/completions"):
                await pool.complete([1, 2], model="policy", max_tokens=2)
    finally:
        server.stop()
