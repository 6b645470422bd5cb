"""An in-process fake of vLLM's OpenAI-compatible server, for deterministic tests and benchmarks.

It speaks the subset SPADE-async uses (chat completions with `logprobs` + `return_token_ids`,
`/v1/models`, runtime LoRA load/unload, `/update_weight_version`, `/weight_info`,
`/collective_rpc`, `/reset_prefix_cache`, `/health`) and lets a test inject failures, latency and
outages. It stands beside the real vLLM tests, never instead of them.

Replies are a pure function of (model, last user message, max_tokens, weight version), so a test
can tell which adapter or which weights answered.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


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
    completions: list[dict] = field(default_factory=list)  # every completions request body


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
        state.requests += 1
        state.models_seen.append(model)
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
            prompt_ids = _token_ids("prompt|" + last, 8 + len(last) // 4)
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": " ".join(words)},
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
        state.requests += 1
        state.models_seen.append(model)
        state.completions.append(body)
        if state.fail_next > 0:
            state.fail_next -= 1
            return JSONResponse({"error": {"message": "injected failure"}}, state.fail_status)
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            n = int(body.get("max_tokens") or 16)
            if state.script is not None:
                ids = list(state.script(prompt))
            else:
                ids = _token_ids(f"{model}|{state.weight_version}|{prompt[-16:]}", n)
            finish = "length"
            if state.eos_token_id in ids:
                ids, finish = ids[: ids.index(state.eos_token_id) + 1], "stop"
            if len(ids) > n:
                ids, finish = ids[:n], "length"
            delay = state.request_latency_s + state.token_latency_s * len(ids)
            if delay:
                await anyio.sleep(delay)
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

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/load_lora_adapter", load_lora, methods=["POST"]),
            Route("/v1/unload_lora_adapter", unload_lora, methods=["POST"]),
            Route("/update_weight_version", update_version, methods=["POST"]),
            Route("/weight_info", get_version, methods=["GET"]),
            Route("/collective_rpc", collective_rpc, methods=["POST"]),
            Route("/reset_prefix_cache", ok, methods=["POST"]),
            Route("/pause", pause, methods=["POST"]),
            Route("/resume", resume, methods=["POST"]),
            Route("/health", ok, methods=["GET"]),
        ]
    )


class FakeOpenAIServer:
    """A fake server on 127.0.0.1 in a background thread; `stop()`/`start()` emulate a crash and
    a restart on the same port. The state survives a restart unless `fresh=True`."""

    def __init__(self, state: FakeState | None = None, port: int = 0) -> None:
        self.state = state or FakeState()
        self.port = port or _free_port()
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    state.completions = _Discard()  # a long benchmark must not keep every request body
    uvicorn.run(build_app(state), host="127.0.0.1", port=args.port, log_level="error",
                lifespan="off", access_log=False)


class _Discard(list):
    def append(self, item: object) -> None:
        pass


if __name__ == "__main__":
    main()
