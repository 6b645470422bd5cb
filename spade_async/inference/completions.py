"""The two request formats: the tokens path (`/v1/completions` with a token-id prompt) and the
chat path (`/v1/chat/completions`): the body each sends and the `Completion` its answer becomes.

Responses keep the server's exact token ids and behaviour log-probs (vLLM's `logprobs` +
`return_token_ids`): training never re-tokenizes text. A body that is not what the route returns
is a retryable failure (`EndpointMalformedResponse` once attempts run out); a body without the
ids or log-probs training needs is an `EndpointCapabilityError`, raised at once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spade_async.inference.errors import (
    EndpointCapabilityError,
    EndpointMalformedResponse,
    Retryable,
)


@dataclass(frozen=True)
class Completion:
    """One sampled completion, as the server produced it (token ids, not text, are the truth)."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_token_ids: tuple[int, ...]
    finish_reason: str | None
    model: str
    endpoint: str
    latency_s: float
    usage: dict[str, int] = field(default_factory=dict)
    # native tool calls of a chat reply: ({"id", "name", "arguments": dict}, ...)
    tool_calls: tuple[dict[str, Any], ...] = ()
    path: str = "tokens"  # "tokens" (/v1/completions, ids) or "chat" (text)

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids) or self.usage.get("completion_tokens", 0)


def chat_payload(messages: Sequence[dict[str, Any]], *, model: str, max_tokens: int,
                 temperature: float, top_p: float, seed: int | None,
                 stop: Sequence[str] | None, extra: dict[str, Any] | None, token_level: bool,
                 tools: Sequence[dict[str, Any]] | None) -> dict[str, Any]:
    """The body of a chat request (see `EndpointPool.chat`): `token_level` asks for vLLM's
    ids and log-probs too, which a hosted API may refuse."""
    payload: dict[str, Any] = {
        "model": model,
        "messages": list(messages),
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
    if top_p != 1.0 or token_level:
        payload["top_p"] = top_p
    if token_level:
        payload.update(logprobs=True, return_token_ids=True)
    if seed is not None:
        payload["seed"] = seed
    if stop:
        payload["stop"] = list(stop)
    if tools:
        payload["tools"] = list(tools)
    if extra:
        payload.update(extra)
    return payload


def completion_payload(prompt_ids: Sequence[int], *, model: str, max_tokens: int,
                       temperature: float, top_p: float, seed: int | None,
                       extra: dict[str, Any] | None) -> dict[str, Any]:
    """The body of a tokens-path request: the prompt as token ids, the sampled ids and their
    log-probs asked back."""
    payload: dict[str, Any] = {
        "model": model,
        "prompt": [int(t) for t in prompt_ids],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "logprobs": 0,
        "return_token_ids": True,
    }
    if seed is not None:
        payload["seed"] = seed
    if extra:
        payload.update(extra)
    return payload


def parse_completion(body: dict[str, Any], endpoint: str, model: str, latency: float,
                     prompt_ids: Sequence[int]) -> Completion:
    """The body of `/v1/completions` (the tokens path): sampled ids with their log-probs."""
    try:
        choice = body["choices"][0]
        token_ids = tuple(int(t) for t in choice.get("token_ids") or ())
        logprobs = tuple(float(x) for x in ((choice.get("logprobs") or {}).get("token_logprobs")
                                            or ()))
        served_prompt = tuple(int(t) for t in choice.get("prompt_token_ids") or prompt_ids)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise Retryable(EndpointMalformedResponse,
                        f"a malformed completion ({exc!r}): {str(body)[:200]}") from None
    if not token_ids and choice.get("text"):
        raise EndpointCapabilityError(
            f"endpoint '{endpoint}' returned no token ids: it must support vLLM's "
            "`return_token_ids` for token-exact training", endpoint=endpoint)
    if len(token_ids) != len(logprobs):
        raise EndpointCapabilityError(
            f"endpoint '{endpoint}' returned {len(token_ids)} token ids but {len(logprobs)} "
            "log-probs", endpoint=endpoint)
    return Completion(
        text=choice.get("text") or "",
        token_ids=token_ids,
        logprobs=logprobs,
        prompt_token_ids=served_prompt,
        finish_reason=choice.get("finish_reason"),
        model=body.get("model", model),
        endpoint=endpoint,
        latency_s=latency,
        usage={k: int(v) for k, v in (body.get("usage") or {}).items() if isinstance(v, int)},
    )


def parse_chat(body: dict[str, Any], endpoint: str, model: str, latency: float) -> Completion:
    """The body of `/v1/chat/completions`: text and tool calls, with ids and log-probs when
    the server returned them."""
    try:
        choice = body["choices"][0]
        text = choice["message"].get("content") or ""
        content = (choice.get("logprobs") or {}).get("content") or []
        logprobs = tuple(float(t["logprob"]) for t in content)
        token_ids = tuple(int(t) for t in choice.get("token_ids") or ())
        prompt_ids = tuple(int(t) for t in body.get("prompt_token_ids") or ())
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise Retryable(EndpointMalformedResponse,
                        f"a malformed chat completion ({exc!r}): {str(body)[:200]}") from None
    if token_ids and logprobs and len(token_ids) != len(logprobs):
        raise EndpointCapabilityError(
            f"endpoint '{endpoint}' returned {len(token_ids)} token ids but {len(logprobs)} "
            "log-probs", endpoint=endpoint)
    calls = []
    for call in choice["message"].get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        fn = call.get("function") or {}
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except ValueError:
                args = {"_unparsed": args}
        calls.append({"id": call.get("id") or f"call_{len(calls)}", "name": fn.get("name"),
                      "arguments": args if isinstance(args, dict) else {}})
    return Completion(
        tool_calls=tuple(calls), path="chat",
        text=text,
        token_ids=token_ids,
        logprobs=logprobs,
        prompt_token_ids=prompt_ids,
        finish_reason=choice.get("finish_reason"),
        model=body.get("model", model),
        endpoint=endpoint,
        latency_s=latency,
        usage={k: int(v) for k, v in (body.get("usage") or {}).items() if isinstance(v, int)},
    )
