"""vLLM's NCCL weight-transfer routes on the fake server, with the worker side's rules. The
"wire" is shared memory: the trainer side under test appends (name, dtype, shape) tuples to
`state.nccl_wire` as it broadcasts, and sets `state.nccl_joined` when it has joined the group."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from spade_async.testing.fake.state import FakeState


def nccl_routes(state: FakeState) -> list[Route]:
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

