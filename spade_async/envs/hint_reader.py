"""The model check of a hint (DESIGN §3b): a model that understands the hint reads it.

The rule-based leak policies (`hint_leak.py`, `hint_decode.py`) catch a hint that states the
answer, or gives it spelled out, reversed, in pieces or as arithmetic still to do; a hint can
give it away in endless other forms. So a model is asked for the answer directly, with the
observation and the hint, with a few tokens and no room to reason, and plays the episode that
way; the same model at the same budget without the hint is the control. A hint it reads the
answer off (own solve rate minus control at or above the threshold) gives the answer away.

It runs only where an endpoint answers, and only once the cheap checks pass; where none is up
(`spade env validate` offline) the check is reported as not run, never as passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio

from spade_async.envs.contract import EnvMeta, episode_score
from spade_async.envs.validation_report import Check
from spade_async.inference.errors import EndpointError
from spade_async.sandbox.errors import SandboxError
from spade_async.sandbox.runtime import Sandbox

NAME = "hint_reader"
ASK = ("Reply with the answer only, in the format the task asks for: no reasoning, no "
       "explanation.")


@dataclass(frozen=True)
class HintReader:
    """Who reads the hint: a model on an endpoint pool (any OpenAI-compatible chat server)."""

    pool: Any  # EndpointPool, or anything with its `chat`
    model: str
    group: str | None = None
    max_tokens: int = 24
    max_turns: int = 3
    deadline_s: float = 60.0

    @property
    def label(self) -> str:
        return f"the hint reader (model {self.model}, {self.max_tokens} tokens a reply)"


def not_run(why: str) -> Check:
    return Check(NAME, None, f"not run: {why}; the hint was checked by rule only, not by a "
                 "model (no verdict on leaks in other forms)")


async def _episode(sandbox: Sandbox, code: str, meta: EnvMeta, reader: HintReader, seed: int,
                   params: dict[str, Any] | None, with_hint: bool) -> tuple[bool, str]:
    """(solved, the reader's first reply) of one episode played by the reader."""
    from spade_async.rollout.episode import agent_system_prompt, to_action

    async with sandbox.open(code) as env:
        first = await (env.reset(seed) if params is None else env.reset(seed, params))
        hint = await env.hint() if with_hint else None
        messages = [{"role": "system", "content": agent_system_prompt(meta, hint) + "\n\n" + ASK},
                    {"role": "user", "content": first.observation}]
        rewards: list[float] = []
        replies: list[str] = []
        for _ in range(min(meta.max_turns, reader.max_turns)):
            out = await reader.pool.chat(messages, model=reader.model,
                                         max_tokens=reader.max_tokens, temperature=0.0,
                                         token_level=False, group=reader.group,
                                         deadline_s=reader.deadline_s)
            text = out.text or ""  # a reply with no content (a refusal, a tool call) is ""
            replies.append(text)
            res = await env.step(to_action(text))
            rewards.append(res.reward)
            if res.done:
                break
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": res.observation}]
        return episode_score(rewards) >= 1.0 - 1e-9, replies[0] if replies else ""


async def reader_check(sandbox: Sandbox, code: str, meta: EnvMeta, reader: HintReader,
                       seeds: list[int], threshold: float,
                       params: dict[str, Any] | None = None) -> Check:
    """Every seed played by the reader with its hint and without, side by side; failed when
    the hint lifts the solve rate by `threshold` or more. An endpoint that fails, or a
    sandbox failure (the cheap checks passed, so the host's), leaves it not run."""
    own: dict[int, tuple[bool, str]] = {}
    control: dict[int, tuple[bool, str]] = {}

    async def one(seed: int, with_hint: bool) -> None:
        (own if with_hint else control)[seed] = await _episode(
            sandbox, code, meta, reader, seed, params, with_hint)

    failed: list[str] = []
    try:
        async with anyio.create_task_group() as tg:
            for seed in seeds:
                tg.start_soon(one, seed, True)
                tg.start_soon(one, seed, False)
    except* EndpointError as group:
        failed.append(f"the endpoint failed ({group.exceptions[0]})")
    except* SandboxError as group:
        failed.append(f"the sandbox failed ({group.exceptions[0]})")
    if failed:
        return not_run(failed[0])
    n = len(seeds)
    won = sum(s for s, _ in own.values())
    base = sum(s for s, _ in control.values())
    lift = (won - base) / n
    if lift < threshold:
        return Check(NAME, True, f"{reader.label} solves {won} of {n} with the hint, {base} "
                     "without")
    example = next(reply for s, reply in own.values() if s)
    return Check(NAME, False, f"the hint gives the answer away to {reader.label}: asked for the "
                 f"answer with no room to reason, it solves {won} of {n} episodes with the hint "
                 f"against {base} of {n} without (first winning reply {example[:60]!r}), "
                 f"{lift:.2f} >= {threshold}")
