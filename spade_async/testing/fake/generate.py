"""The fake's generation routes, `/v1/chat/completions` and `/v1/completions`: replies are a pure
function of the request (a test's `script` of the prompt ids, else the model, the prompt's end,
max_tokens and the weight version), so a test can tell which adapter or which weights answered.
Capability probes are answered and never counted."""

from __future__ import annotations

import hashlib
import time

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from spade_async.testing.fake.state import FakeState


def chat_route(state: FakeState) -> Route:
    async def chat(request: Request) -> Response:
        body = await request.json()
        model = body.get("model")
        if model not in _served_models(state):
            return JSONResponse(
                {"error": {"message": f"The model `{model}` does not exist.", "code": 404}},
                status_code=404,
            )
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return JSONResponse({"error": {"message": "messages must be a non-empty list"}}, 400)
        if _is_probe(request):
            return _probe_chat(body)
        state.requests += 1
        state.models_seen.append(model)
        state.chats.append(body)
        if state.fail_next > 0:
            state.fail_next -= 1
            return JSONResponse({"error": {"message": "injected failure"}}, state.fail_status)
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            n = int(body.get("max_tokens") or 16)
            last = str(body["messages"][-1].get("content", ""))
            seed = f"{model}|{state.weight_version}|{last}"
            ids = _token_ids(seed, n)
            delay = state.request_latency_s + state.token_latency_s * n
            if delay:
                await anyio.sleep(delay)
            words = [f"w{t % 1000}" for t in ids]
            message: dict = {"role": "assistant", "content": " ".join(words)}
            if state.chat_script is not None:
                scripted = state.chat_script(list(body["messages"]))
                message = ({"role": "assistant", **scripted} if isinstance(scripted, dict)
                           else {"role": "assistant", "content": scripted})
            prompt_ids = _token_ids("prompt|" + last, 8 + len(last) // 4)
            state.served_at.append(time.monotonic())
            choice = {
                "index": 0,
                "message": message,
                "finish_reason": "length",
                "token_ids": ids if body.get("return_token_ids") else None,
                "logprobs": {
                    "content": [
                        {"token": w, "logprob": -((t % 97) / 97.0), "bytes": None, "top_logprobs": []}
                        for w, t in zip(words, ids, strict=True)
                    ]
                }
                if body.get("logprobs")
                else None,
            }
            return JSONResponse(
                {
                    "id": f"chatcmpl-{state.requests}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [choice],
                    "prompt_token_ids": prompt_ids if body.get("return_token_ids") else None,
                    "usage": {
                        "prompt_tokens": len(prompt_ids),
                        "completion_tokens": n,
                        "total_tokens": len(prompt_ids) + n,
                    },
                }
            )
        finally:
            state.in_flight -= 1

    return Route("/v1/chat/completions", chat, methods=["POST"])


def completions_route(state: FakeState) -> Route:
    async def completions(request: Request) -> Response:
        arrived = time.monotonic()
        body = await request.json()
        model = body.get("model")
        if model not in _served_models(state):
            return JSONResponse(
                {"error": {"message": f"The model `{model}` does not exist.", "code": 404}},
                status_code=404,
            )
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
            return JSONResponse({"error": {"message": "this fake takes token-id prompts"}}, 400)
        if _is_probe(request):
            n = int(body.get("max_tokens") or 1)
            return JSONResponse({"object": "text_completion", "model": model, "choices": [{
                "index": 0, "text": "ok", "finish_reason": "length",
                "token_ids": [7] * n if body.get("return_token_ids") else None,
                "prompt_token_ids": prompt if body.get("return_token_ids") else None,
                "logprobs": {"token_logprobs": [-0.1] * n, "tokens": ["7"] * n}
                if body.get("logprobs") is not None else None}]})
        state.requests += 1
        state.models_seen.append(model)
        state.completions.append(body)
        if state.fail_next > 0:
            state.fail_next -= 1
            return JSONResponse({"error": {"message": "injected failure"}}, state.fail_status)
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        state.served_at.append(time.monotonic())
        try:
            n = int(body.get("max_tokens") or 16)
            choices = (body.get("structured_outputs") or {}).get("choice")
            if choices:
                if state.encode is None:
                    return JSONResponse({"error": {"message": "this fake needs `encode` to "
                                                   "answer structured-output choices"}}, 400)
                if state.choose is not None:
                    pick = state.choose(list(choices), prompt)
                else:
                    digest = hashlib.sha256(repr(prompt[-16:]).encode()).digest()
                    pick = choices[digest[0] % len(choices)]
                ids = [*state.encode(pick), state.eos_token_id]
            elif state.script is not None:
                ids = list(state.script(prompt))
            else:
                ids = _token_ids(f"{model}|{state.weight_version}|{prompt[-16:]}", n)
            finish = "length"
            if state.eos_token_id in ids:
                ids, finish = ids[: ids.index(state.eos_token_id) + 1], "stop"
            if len(ids) > n:
                ids, finish = ids[:n], "length"
            # the latency counts from arrival: the fake's own work (a script) is inside it
            delay = state.request_latency_s + state.token_latency_s * len(ids)
            if delay:
                await anyio.sleep(max(0.0, delay - (time.monotonic() - arrived)))
            text = state.decode(ids) if state.decode else " ".join(f"w{t % 1000}" for t in ids)
            logprobs = [-((t % 97) / 97.0) for t in ids]
            choice = {
                "index": 0,
                "text": text,
                "finish_reason": finish,
                "token_ids": ids if body.get("return_token_ids") else None,
                "prompt_token_ids": prompt if body.get("return_token_ids") else None,
                "logprobs": {"token_logprobs": logprobs, "tokens": [str(t) for t in ids]}
                if body.get("logprobs") is not None else None,
            }
            return JSONResponse({
                "id": f"cmpl-{state.requests}", "object": "text_completion",
                "created": int(time.time()), "model": model, "choices": [choice],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                          "total_tokens": len(prompt) + len(ids)},
            })
        finally:
            state.in_flight -= 1

    return Route("/v1/completions", completions, methods=["POST"])


def _served_models(state: FakeState) -> list[str]:
    return [state.base_model, *state.adapters]


def _token_ids(seed: str, n: int) -> list[int]:
    out: list[int] = []
    counter = 0
    while len(out) < n:
        digest = hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        out.extend(int.from_bytes(digest[i : i + 2], "little") % 49152 for i in range(0, 32, 2))
        counter += 1
    return out[:n]


def _is_probe(request: Request) -> bool:
    """A capability probe (spade_async/inference/capabilities.py): answered, never counted."""
    return request.headers.get("x-spade-probe") == "capabilities"


def _probe_chat(body: dict) -> Response:
    fmt = body.get("response_format") or {}
    schema = (fmt.get("json_schema") or {}).get("schema") or {}
    content = f'"{schema["enum"][0]}"' if schema.get("enum") else "ok"
    return JSONResponse({"object": "chat.completion", "model": body.get("model"), "choices": [{
        "index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": content}}]})

