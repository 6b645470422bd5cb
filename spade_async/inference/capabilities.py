"""What one OpenAI-compatible server can do, probed with a handful of tiny requests.

Training needs the tokens path: `/v1/completions` that takes a token-id prompt and returns the
sampled ids and one log-prob per id (vLLM's `return_token_ids`, `logprobs`). Designing and
evaluation can also take the chat path (`/v1/chat/completions`, text), which every
OpenAI-compatible server speaks (llama.cpp, SGLang, TGI, Ollama, hosted APIs); native tool
calls and structured outputs are used there when the server has them. A weight-swap backend
needs its admin routes, read from the server's OpenAPI listing where it publishes one (vLLM
does; a server without a listing has no swap API we could use).

Each probe asks for at most a few tokens at temperature 0. A capability is False only when the
server said so (a 404 for the route, a 4xx for the parameter, an answer without the field); a
probe that timed out or met a 429/5xx leaves the whole result unknown (None in the pool) and is
tried again at the next health check.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio
import httpx

# The admin route that shows each weight-swap backend's API is served.
SWAP_ROUTES = {
    "vllm-lora": "/v1/load_lora_adapter",
    "vllm-reload": "/collective_rpc",
    "vllm-nccl": "/init_weight_transfer_engine",
}
# What each role path needs, in the words a start-up error uses.
TOKENS_NEEDS = {
    "completions": "POST /v1/completions",
    "token_prompts": "token-id prompts",
    "token_ids": "returned token ids (return_token_ids)",
    "logprobs": "per-token log-probs",
}
CHAT_NEEDS = {"chat": "POST /v1/chat/completions"}
PROBE_IDS = [1, 2, 3]  # valid in any vocabulary the probe could meet
# Marks probe traffic, so a server's logs (and the test fake's counters) can tell it apart.
PROBE_HEADER = {"X-Spade-Probe": "capabilities"}


@dataclass(frozen=True)
class Capabilities:
    server: str                 # what the server says it is (vLLM 0.32.0, llama.cpp b11434, ...)
    model: str                  # the model the probe asked for
    completions: bool           # POST /v1/completions answers
    token_prompts: bool         # ... a prompt given as token ids
    token_ids: bool             # ... and returns the sampled token ids
    logprobs: bool              # ... with one log-prob per sampled token
    chat: bool                  # POST /v1/chat/completions answers
    tools: bool                 # chat takes OpenAI function `tools` (native tool calls)
    structured: bool            # chat honours response_format json_schema
    swap: tuple[str, ...] | None  # weight-swap backends whose admin routes the server lists
    # (None: it publishes no route listing, so nothing is known)
    notes: dict[str, str] = field(default_factory=dict)  # why a capability is missing
    probed_at: float = 0.0

    @property
    def tokens_path(self) -> bool:
        return self.completions and self.token_prompts and self.token_ids and self.logprobs

    def supports(self, path: str) -> bool:
        return self.tokens_path if path == "tokens" else self.chat

    def missing(self, path: str) -> list[str]:
        """What `path` needs that this server lacks, each with the reason the probe saw."""
        needs = TOKENS_NEEDS if path == "tokens" else CHAT_NEEDS
        out = []
        for key, words in needs.items():
            if not getattr(self, key):
                why = self.notes.get(key)
                out.append(f"{words}" + (f" ({why})" if why else ""))
        return out

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["swap"] = None if self.swap is None else list(self.swap)
        d["paths"] = [p for p in ("tokens", "chat") if self.supports(p)]
        return d


class ProbeUnanswered(Exception):
    """The server did not answer a probe in time: nothing is known yet."""


async def _post(client: httpx.AsyncClient, path: str, body: dict[str, Any],
                timeout_s: float) -> tuple[int, Any, str]:
    """(status, JSON body or None, short text of the body)."""
    try:
        with anyio.fail_after(timeout_s):
            resp = await client.post(path, json=body, headers=PROBE_HEADER)
    except (TimeoutError, httpx.TransportError) as exc:
        raise ProbeUnanswered(f"POST {path}: {type(exc).__name__}") from None
    if resp.status_code == 429 or resp.status_code >= 500:  # busy, not unable: ask again later
        raise ProbeUnanswered(f"POST {path}: HTTP {resp.status_code}")
    try:
        data = resp.json()
    except ValueError:
        data = None
    if resp.status_code == 200 and not (isinstance(data, dict) and _choice(data) is not None):
        # A 2xx that is not an answer (cut short, garbled by a proxy) says nothing of what the
        # server can do: known next time.
        raise ProbeUnanswered(f"POST {path}: HTTP 200 with a malformed body")
    return resp.status_code, data, _short(resp)


def _short(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:160] or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message", body)))
        if isinstance(err, dict):
            err = err.get("message", err)
        return str(err)[:160]
    return str(body)[:160]


def _choice(data: Any) -> dict[str, Any] | None:
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError):
        return None
    return choice if isinstance(choice, dict) else None


async def _server(client: httpx.AsyncClient, timeout_s: float) -> str:
    """vLLM answers /version; llama.cpp /props (build_info); else the Server header."""
    header = ""
    for path, key in (("/version", "version"), ("/props", "build_info")):
        try:
            with anyio.fail_after(timeout_s):
                resp = await client.get(path)
        except (TimeoutError, httpx.TransportError):
            continue
        header = header or resp.headers.get("server", "")
        if resp.status_code != 200:
            continue
        try:
            body = resp.json()
        except ValueError:
            continue
        if isinstance(body, dict) and body.get(key):
            return f"vLLM {body[key]}" if key == "version" else f"llama.cpp {body[key]}"
    return header or "unknown"


async def _swap_routes(client: httpx.AsyncClient,
                       timeout_s: float) -> tuple[tuple[str, ...] | None, str]:
    try:
        with anyio.fail_after(timeout_s):
            resp = await client.get("/openapi.json")
    except (TimeoutError, httpx.TransportError):
        return None, "GET /openapi.json did not answer"
    try:
        paths = resp.json().get("paths", {}) if resp.status_code == 200 else None
    except (ValueError, AttributeError):
        paths = None
    if not isinstance(paths, dict):
        return None, f"no OpenAPI route listing (GET /openapi.json: HTTP {resp.status_code})"
    found = tuple(b for b, route in SWAP_ROUTES.items() if route in paths)
    return found, "" if found else "the server lists none of the weight-swap routes"


async def probe_capabilities(client: httpx.AsyncClient, model: str, *,
                             timeout_s: float = 60.0) -> Capabilities:
    """Probe a server that lists `model`. Raises ProbeUnanswered when it does not answer."""
    notes: dict[str, str] = {}
    # -- the tokens path ------------------------------------------------------------------
    full = {"model": model, "prompt": PROBE_IDS, "max_tokens": 2, "temperature": 0.0,
            "logprobs": 0, "return_token_ids": True}
    status, data, text = await _post(client, "/v1/completions", full, timeout_s)
    completions = token_prompts = token_ids = logprobs = False
    if status == 200 and _choice(data) is not None:
        completions = token_prompts = True
        choice = _choice(data) or {}
        ids = choice.get("token_ids")
        token_ids = isinstance(ids, list) and all(isinstance(t, int) for t in ids)
        if not token_ids:
            notes["token_ids"] = "the answer has no choices[0].token_ids"
        lp = (choice.get("logprobs") or {}).get("token_logprobs") if isinstance(
            choice.get("logprobs"), dict) else None
        logprobs = isinstance(lp, list) and (not token_ids or len(lp) == len(ids or []))
        if not logprobs:
            notes["logprobs"] = "the answer has no choices[0].logprobs.token_logprobs"
    elif status == 404 and model not in text:
        notes["completions"] = f"HTTP 404: {text}"
    else:  # the route is there; which part of the request did it refuse?
        bare = {"model": model, "prompt": PROBE_IDS, "max_tokens": 1, "temperature": 0.0}
        status2, data2, text2 = await _post(client, "/v1/completions", bare, timeout_s)
        if status2 == 200 and _choice(data2) is not None:
            completions = token_prompts = True
            notes["token_ids"] = notes["logprobs"] = f"refused with them: HTTP {status}: {text}"
        else:
            words = {"model": model, "prompt": "Hi", "max_tokens": 1, "temperature": 0.0}
            status3, data3, _ = await _post(client, "/v1/completions", words, timeout_s)
            completions = status3 == 200 and _choice(data3) is not None
            notes["token_prompts"] = f"HTTP {status2}: {text2}"
            if not completions:
                notes["completions"] = f"HTTP {status}: {text}"
        if not token_prompts:
            notes.setdefault("token_ids", "no token-id prompts")
            notes.setdefault("logprobs", "no token-id prompts")
    # -- the chat path --------------------------------------------------------------------
    msgs = [{"role": "user", "content": "Reply with: ok"}]
    status, data, text = await _post(client, "/v1/chat/completions",
                                     {"model": model, "messages": msgs, "max_tokens": 2,
                                      "temperature": 0.0}, timeout_s)
    chat = status == 200 and isinstance((_choice(data) or {}).get("message"), dict)
    tools = structured = False
    if not chat:
        notes["chat"] = f"HTTP {status}: {text}"
    else:
        tool = {"type": "function", "function": {
            "name": "ping", "description": "Answer a ping.",
            "parameters": {"type": "object", "properties": {}, "required": []}}}
        status, data, text = await _post(client, "/v1/chat/completions",
                                         {"model": model, "messages": msgs, "max_tokens": 8,
                                          "temperature": 0.0, "tools": [tool]}, timeout_s)
        tools = status == 200 and _choice(data) is not None
        if not tools:
            notes["tools"] = f"HTTP {status}: {text}"
        schema = {"type": "string", "enum": ["yes", "no"]}
        fmt = {"type": "json_schema", "json_schema": {"name": "probe", "schema": schema}}
        status, data, text = await _post(client, "/v1/chat/completions",
                                         {"model": model, "messages": msgs, "max_tokens": 8,
                                          "temperature": 0.0, "response_format": fmt},
                                         timeout_s)
        content = ((_choice(data) or {}).get("message") or {}).get("content") if status == 200 else None
        try:
            structured = json.loads(content or "") in ("yes", "no")
        except ValueError:
            structured = False
        if not structured:
            notes["structured"] = (f"HTTP {status}: {text}" if status != 200 else
                                   f"the answer {str(content)[:40]!r} is not the schema's")
    swap, why = await _swap_routes(client, timeout_s)
    if why:
        notes["swap"] = why
    return Capabilities(
        server=await _server(client, timeout_s), model=model, completions=completions,
        token_prompts=token_prompts, token_ids=token_ids, logprobs=logprobs, chat=chat,
        tools=tools, structured=structured, swap=swap, notes=notes, probed_at=time.time())
