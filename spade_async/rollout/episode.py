"""One episode: model turns against the endpoint pool, environment steps in the sandbox.

Token-exact (see chat_tokens): the episode's training sequence is the opening prompt, then for
each turn the ids the server sampled (loss mask 1, with their behaviour log-probs) and the ids of
the observation between turns (mask 0). Every request sends the sequence so far as a token-id
prompt, and the server's echo of it is checked against ours. Never re-tokenizes sampled text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio

from spade_async.core.config import RolloutConfig
from spade_async.core.logs import get_logger
from spade_async.envs.contract import (
    EnvMeta,
    StepResult,
    episode_score,
    parse_tool_call,
    tool_call_action,
)
from spade_async.envs.hint_leak import play_leak
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.errors import EndpointError
from spade_async.inference.pool import EndpointPool
from spade_async.sandbox.errors import SandboxError
from spade_async.sandbox.runtime import Sandbox
from spade_async.sandbox.session import EnvSession

log = get_logger("episode")


class TokenMismatch(EndpointError):
    """The server did not continue the exact id sequence it was sent."""

    kind = "token_mismatch"


@dataclass
class Turn:
    action: str
    observation: str
    reward: float
    completion_tokens: int
    finish_reason: str | None


@dataclass
class Episode:
    episode_id: str
    env_id: str
    seed: int
    hinted: bool
    policy_version: int
    model: str
    prompt_len: int = 0
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    first_observation: str = ""
    turns: list[Turn] = field(default_factory=list)
    score: float = 0.0
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    error_kind: str | None = None  # the failures ledger's label: timeout, sandbox_crashed, ...
    params: dict[str, Any] | None = None  # the knobs it was played at (None: the environment's
    # own defaults, or it has none)
    hint: str | None = None  # the privileged hint it was played with (hinted episodes)
    # a hinted episode won by copying the hint: the share of its actions found in the hint
    # when it scored full marks, else 0 (hint_leak.play_leak); None when unhinted
    hint_copy: float | None = None
    path: str = "tokens"  # tokens (ids, trainable) or chat (text: evaluation only)
    chat_completion_tokens: int = 0  # what the server reported sampling, on the chat path
    seconds: float = 0.0  # wall time of the try, requests and sandbox steps (the cost ledger)
    # the server of its last turn, and how often a turn went to another server than the one
    # before (requests prefer the episode's server: its prefix cache holds the turns so far)
    endpoint: str | None = None
    endpoint_switches: int = 0
    # the sandbox node that ran its environment (sandbox.placement = "ray"); None: this host
    sandbox_node: str | None = None

    def served_by(self, endpoint: str) -> None:
        if self.endpoint is not None and endpoint != self.endpoint:
            self.endpoint_switches += 1
        self.endpoint = endpoint

    @property
    def sampled_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def generated_tokens(self) -> int:
        return self.sampled_tokens or self.chat_completion_tokens

    def as_record(self, chat: ChatTokens | None = None) -> dict[str, Any]:
        """What gets saved for inspection (the transcript, not the ids)."""
        rec = asdict(self)
        for k in ("token_ids", "loss_mask", "logprobs"):
            rec.pop(k)
        if rec["params"] is None:
            rec.pop("params")  # records of environments played without knobs stay as they were
        for k in ("hint", "hint_copy", "sandbox_node"):
            if rec[k] is None:
                rec.pop(k)
        if rec["path"] == "tokens":  # records of the tokens path stay as they were
            rec.pop("path")
            rec.pop("chat_completion_tokens")
        rec["sampled_tokens"] = self.sampled_tokens
        rec["sequence_tokens"] = len(self.token_ids)
        return rec


def agent_system_prompt(meta: EnvMeta, hint: str | None, *, native_tools: bool = False) -> str:
    """With `native_tools` the server presents the tools (the chat path's `tools`), so the
    prompt does not describe them."""
    parts = [
        "You are the agent in an interactive text environment. Each reply you write is one "
        f"action, sent to the environment as is. You have at most {meta.max_turns} actions.",
        f"Task: {meta.description}",
    ]
    if meta.tools and not native_tools:
        tools = [{"name": t["function"]["name"],
                  "description": t["function"].get("description", ""),
                  "parameters": t["function"].get("parameters", {})} for t in meta.tools]
        parts.append('To call a tool, reply with exactly one JSON object: {"tool": "<name>", '
                     '"arguments": {...}}. Tools: ' + json.dumps(tools, ensure_ascii=False))
    if hint:
        parts.append(f"Privileged hint (given to you only for this episode): {hint}")
    return "\n\n".join(parts)


_JSON_OBJECT = re.compile(r"\{.*\}", re.S)


def to_action(text: str) -> str:
    """The agent's reply as the environment's action: a tool call in its canonical JSON form
    when the reply holds one, else the stripped text."""
    text = text.strip()
    m = _JSON_OBJECT.search(text)
    if m:
        call = parse_tool_call(m.group(0))
        if call is not None:
            return tool_call_action(*call)
    return text


async def run_episode(
    env: EnvSession,
    pool: EndpointPool,
    chat: ChatTokens,
    *,
    env_id: str,
    seed: int,
    hint: str | None,
    model: str,
    policy_version: int,
    cfg: RolloutConfig,
    params: dict[str, Any] | None = None,
    request_seed: int | None = None,
    group: str | None = None,
) -> Episode:
    """Play one episode. `params` (a variant's knobs) go to `env.reset`, which fills in the
    defaults; with None, reset is called as `reset(seed)`, so sessions without knobs (BFCL's)
    need not accept them. A hinted episode's hint must come from the same params.
    `request_seed` fixes the server's sampling (turn t sends request_seed + t - 1, so turns do
    not share one random stream): the probe evaluation replays the same episodes on every
    version. None, as in training: the server draws."""
    meta = env.meta
    ep = Episode(f"ep-{uuid.uuid4().hex[:12]}", env_id, seed, hint is not None, policy_version,
                 model, params=None if params is None else dict(params))
    rewards: list[float] = []
    with anyio.move_on_after(cfg.episode_deadline_s) as scope:
        try:
            first = await (env.reset(seed) if params is None else env.reset(seed, params))
        except SandboxError as exc:
            ep.error, ep.error_kind = f"reset: {exc}", f"sandbox_{exc.kind}"
            return ep
        ep.first_observation = first.observation
        messages = [{"role": "system", "content": agent_system_prompt(meta, hint)},
                    {"role": "user", "content": first.observation}]
        seq = chat.prompt_ids(messages)
        ep.prompt_len = len(seq)
        ep.token_ids, ep.loss_mask, ep.logprobs = list(seq), [0] * len(seq), [0.0] * len(seq)
        for turn in range(1, meta.max_turns + 1):
            budget = min(cfg.max_tokens_per_turn, cfg.max_seq_len - len(ep.token_ids))
            if budget < 1:
                ep.truncated = True
                break
            out = await pool.complete(ep.token_ids, model=model, max_tokens=budget,
                                      temperature=cfg.temperature, top_p=cfg.top_p,
                                      seed=None if request_seed is None
                                      else request_seed + turn - 1,
                                      deadline_s=cfg.request_deadline_s, group=group,
                                      prefer=ep.endpoint)
            ep.served_by(out.endpoint)
            if list(out.prompt_token_ids) != ep.token_ids:
                raise TokenMismatch(f"{out.endpoint} echoed a different prompt than it was sent "
                                    f"({len(out.prompt_token_ids)} vs {len(ep.token_ids)} ids)",
                                    endpoint=out.endpoint, attempts=1)
            ep.token_ids += out.token_ids
            ep.loss_mask += [1] * len(out.token_ids)
            ep.logprobs += out.logprobs
            action = to_action(chat.decode(out.token_ids))
            res = await _step(env, ep, rewards, action, turn, len(out.token_ids),
                              out.finish_reason)
            if res is None:
                break
            between = chat.next_turn_ids(out.token_ids, res.observation)
            ep.token_ids += between
            ep.loss_mask += [0] * len(between)
            ep.logprobs += [0.0] * len(between)
    _finish(ep, rewards, hint, scope.cancelled_caught, cfg)
    log.debug("episode_done", env_id=env_id, episode_id=ep.episode_id, hinted=ep.hinted,
              score=ep.score, turns=len(ep.turns), error=ep.error)
    return ep


async def run_episode_chat(
    env: EnvSession,
    pool: EndpointPool,
    *,
    env_id: str,
    seed: int,
    hint: str | None,
    model: str,
    policy_version: int,
    cfg: RolloutConfig,
    params: dict[str, Any] | None = None,
    group: str | None = None,
    native_tools: bool = False,
) -> Episode:
    """Play one episode on the chat path (any OpenAI-compatible server): messages as text, the
    server's own chat template, no token ids, so nothing here can be trained on (evaluation,
    or a frozen model). With `native_tools` the environment's tools go as the request's
    `tools` and a returned tool call is the action (its result comes back as a `tool`
    message); otherwise a tool call is the JSON text the prompt describes, as on the tokens
    path. Errors and deadlines are handled as in `run_episode`."""
    meta = env.meta
    ep = Episode(f"ep-{uuid.uuid4().hex[:12]}", env_id, seed, hint is not None, policy_version,
                 model, params=None if params is None else dict(params), path="chat")
    rewards: list[float] = []
    tools = list(meta.tools) if native_tools and meta.tools else None
    with anyio.move_on_after(cfg.episode_deadline_s) as scope:
        try:
            first = await (env.reset(seed) if params is None else env.reset(seed, params))
        except SandboxError as exc:
            ep.error, ep.error_kind = f"reset: {exc}", f"sandbox_{exc.kind}"
            return ep
        ep.first_observation = first.observation
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": agent_system_prompt(meta, hint,
                                                              native_tools=tools is not None)},
            {"role": "user", "content": first.observation}]
        for turn in range(1, meta.max_turns + 1):
            out = await pool.chat(messages, model=model, max_tokens=cfg.max_tokens_per_turn,
                                  temperature=cfg.temperature, token_level=False, tools=tools,
                                  group=group, deadline_s=cfg.request_deadline_s,
                                  prefer=ep.endpoint)
            ep.served_by(out.endpoint)
            ep.chat_completion_tokens += out.completion_tokens
            call = out.tool_calls[0] if out.tool_calls else None
            if call is not None:
                action = tool_call_action(call["name"] or "", call["arguments"])
                messages.append({"role": "assistant", "content": out.text or None,
                                 "tool_calls": [{"id": call["id"], "type": "function",
                                                 "function": {"name": call["name"],
                                                              "arguments": json.dumps(
                                                                  call["arguments"])}}]})
            else:
                action = to_action(out.text)
                messages.append({"role": "assistant", "content": out.text})
            res = await _step(env, ep, rewards, action, turn, out.completion_tokens,
                              out.finish_reason)
            if res is None:
                break
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": res.observation} if call is not None
                            else {"role": "user", "content": res.observation})
    _finish(ep, rewards, hint, scope.cancelled_caught, cfg)
    return ep


async def _step(env: EnvSession, ep: Episode, rewards: list[float], action: str, turn: int,
                tokens: int, finish_reason: str | None) -> StepResult | None:
    """One environment step of either path, recorded in `ep`; None when the episode is over
    (it ended, hit max_turns, or the sandbox failed it)."""
    try:
        res = await env.step(action)
    except SandboxError as exc:
        ep.error, ep.error_kind = f"step {turn}: {exc}", f"sandbox_{exc.kind}"
        ep.turns.append(Turn(action, "", 0.0, tokens, finish_reason))
        return None
    rewards.append(res.reward)
    ep.turns.append(Turn(action, res.observation, res.reward, tokens, finish_reason))
    if res.done:
        ep.terminated, ep.truncated = res.terminated, res.truncated
        return None
    if turn == env.meta.max_turns:
        ep.truncated = True
        return None
    return res


def _finish(ep: Episode, rewards: list[float], hint: str | None, timed_out: bool,
            cfg: RolloutConfig) -> None:
    """Score, hint copy and deadline of an episode, whichever path played it."""
    ep.score = episode_score(rewards)
    if hint is not None:
        ep.hint = hint
        ep.hint_copy = (play_leak(hint, [t.action for t in ep.turns], ep.first_observation)
                        if ep.score >= 1.0 - 1e-9 else 0.0)
    if timed_out:
        ep.error = f"the episode exceeded its {cfg.episode_deadline_s:g}s deadline"
        ep.error_kind = "deadline"
        ep.truncated = True


async def play_in_sandbox(
    sandbox: Sandbox,
    code: str,
    pool: EndpointPool,
    chat: ChatTokens,
    *,
    env_id: str,
    seed: int,
    hinted: bool,
    model: str,
    policy_version: int,
    cfg: RolloutConfig,
    params: dict[str, Any] | None = None,
    group: str | None = None,
) -> Episode:
    """One episode of `code` (at `params`, a variant's knobs) in a fresh sandbox worker. A
    hinted episode reads this seed's hint first and plays with it in the system prompt
    (DESIGN §6). Sandbox and endpoint errors propagate: the caller decides whether they are
    retried or counted."""
    async with sandbox.open(code) as env:
        hint = None
        if hinted:
            await env.reset(seed, params)
            hint = await env.hint()
        ep = await run_episode(env, pool, chat, env_id=env_id, seed=seed, hint=hint,
                               model=model, policy_version=policy_version, cfg=cfg,
                               params=params, group=group)
        ep.sandbox_node = env.node
        return ep
