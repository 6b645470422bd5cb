"""The fake's model list and vLLM's admin routes: runtime LoRA load/unload,
`/update_weight_version`, `/weight_info`, `/version`, `/collective_rpc` (reload_weights),
`/pause`, `/resume`, `/reset_prefix_cache`, `/health`. Each admin call is appended to
`state.calls`."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from spade_async.testing.fake.state import FakeState


def models_route(state: FakeState) -> Route:
    async def list_models(request: Request) -> Response:
        data = [{"id": state.base_model, "object": "model", "parent": None, "root": "/fake"}]
        data += [
            {"id": name, "object": "model", "parent": state.base_model, "root": path}
            for name, path in state.adapters.items()
        ]
        return JSONResponse({"object": "list", "data": data})

    return Route("/v1/models", list_models, methods=["GET"])


def admin_routes(state: FakeState) -> list[Route]:
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

    return [
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
    ]
