"""vLLM's NCCL weight-transfer routes on the fake server, with the worker side's rules, and an
in-process stand-in for the NCCL group itself.

The "wire" is `FakeNcclGroup`, one per rendezvous address (master_address, master_port), shared
by every fake server in this process and by the trainer side under test, which joins it as rank
0 through `fake_join` (a drop-in for vLLM's `trainer_init`: it returns a communicator with
`broadcast(tensor, src=0, stream=None)` and `destroy()`). The group enforces what a real one
would make fail or hang: ranks never overlap across servers and stay below the world size, every
member agrees on the world size and on the packed geometry, the group forms only when every rank
has joined, a broadcast needs every server inside `/update_weights` still expecting data, and
each server takes exactly the broadcasts vLLM's consumer expects from `update_info` (one per
bucket, each of the bucket's size; see vllm/distributed/weight_transfer/packed_tensor.py).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from spade_async.testing.fake.state import FakeState

# vLLM's defaults (packed_tensor.py) for a worker whose init info does not set them.
DEFAULT_BUCKET_BYTES = 1024 * 1024 * 1024
DEFAULT_BUCKET_BUFFERS = 2
# NCCLWeightTransferInitInfo's fields: anything else is vLLM's "Invalid init_info" (TypeError).
INIT_KEYS = {"master_address", "master_port", "rank_offset", "world_size", "nccl_unique_id_b64",
             "packed", "packed_buffer_size_bytes", "packed_num_buffers"}
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1,
               "float8_e5m2": 1, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1,
               "bool": 1}


def consumer_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """vLLM's consumer (`packed_nccl_broadcast_consumer`), written out again on purpose (the
    fake must not share the code under test): add tensors until the bucket's bytes exceed
    `bucket_bytes`, then receive it; the last bucket holds the rest."""
    out: list[list[int]] = []
    cur: list[int] = []
    total = 0
    for i, n in enumerate(sizes):
        cur.append(i)
        total += n
        if total > bucket_bytes:
            out.append(cur)
            cur, total = [], 0
    if cur:
        out.append(cur)
    return out


@dataclass
class _Member:
    ranks: range
    geometry: tuple[bool, int, int]  # packed, bucket bytes, buffers
    inbox: deque = field(default_factory=deque)
    expecting: int = 0  # broadcasts it still waits for inside /update_weights


class FakeNcclGroup:
    """One rendezvous: who holds which ranks, and the broadcasts on their way. Thread-safe
    (every fake server runs its own event loop; the trainer side blocks in its own thread)."""

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.world_size: int | None = None
        self.trainer_joined = False
        self.members: dict[int, _Member] = {}  # id(FakeState) -> member
        self.broadcasts = 0
        self.lock = threading.Lock()

    def _taken(self) -> set[int]:
        ranks = {0} if self.trainer_joined else set()
        for m in self.members.values():
            ranks.update(m.ranks)
        return ranks

    def complete(self) -> bool:
        with self.lock:
            return self.world_size is not None and self._taken() == set(range(self.world_size))

    def _agree_world(self, world_size: int) -> str | None:
        if self.world_size is None:
            self.world_size = world_size
        elif self.world_size != world_size:
            return (f"world_size {world_size} disagrees with the group's {self.world_size} "
                    f"(rendezvous {self.key[0]}:{self.key[1]})")
        return None

    def join_worker(self, who: int, ranks: range, world_size: int,
                    geometry: tuple[bool, int, int]) -> str | None:
        """None, or why the join is refused."""
        with self.lock:
            self.members.pop(who, None)  # a server joining again drops its old ranks
            if (why := self._agree_world(world_size)) is not None:
                return why
            if ranks.start < 1 or ranks.stop > world_size:
                return (f"ranks {ranks.start}..{ranks.stop - 1} fall outside 1..{world_size - 1} "
                        f"(rank 0 is the trainer, world_size {world_size})")
            overlap = self._taken() & set(ranks)
            if overlap:
                return (f"ranks {ranks.start}..{ranks.stop - 1} overlap ranks "
                        f"{sorted(overlap)} already held in the group (another server's "
                        "workers): each server needs its own rank_offset")
            for other in self.members.values():
                if other.geometry != geometry:
                    return (f"packed geometry (packed, packed_buffer_size_bytes, "
                            f"packed_num_buffers) {geometry} disagrees with another server's "
                            f"{other.geometry}")
            self.members[who] = _Member(ranks, geometry)
            return None

    def leave(self, who: int) -> None:
        with self.lock:
            self.members.pop(who, None)

    def expect(self, who: int, count: int) -> None:
        with self.lock:
            member = self.members[who]
            member.inbox.clear()
            member.expecting = count

    def stop_expecting(self, who: int) -> None:
        with self.lock:
            if who in self.members:
                self.members[who].expecting = 0

    def take(self, who: int) -> bytes | None:
        with self.lock:
            member = self.members.get(who)
            return member.inbox.popleft() if member and member.inbox else None

    def deliver(self, data: bytes) -> bool:
        """One broadcast, to every server at once, or False while one is not receiving."""
        with self.lock:
            if not self.members or any(m.expecting < 1 for m in self.members.values()):
                return False
            for m in self.members.values():
                m.inbox.append(data)
                m.expecting -= 1
            self.broadcasts += 1
            return True

    def waiting_for(self) -> list[str]:
        with self.lock:
            return [f"ranks {m.ranks.start}..{m.ranks.stop - 1}"
                    for m in self.members.values() if m.expecting < 1]


_GROUPS: dict[tuple[str, int], FakeNcclGroup] = {}
_GROUPS_LOCK = threading.Lock()


def fake_group(master_address: str, master_port: int) -> FakeNcclGroup:
    with _GROUPS_LOCK:
        key = (str(master_address), int(master_port))
        return _GROUPS.setdefault(key, FakeNcclGroup(key))


class FakeCommunicator:
    """The trainer's rank 0 in a FakeNcclGroup (vLLM's PyNcclCommunicator surface)."""

    def __init__(self, group: FakeNcclGroup, wait_s: float) -> None:
        self.group, self.wait_s = group, wait_s
        self.sent: list[int] = []  # bytes of each broadcast

    def broadcast(self, tensor: Any, src: int = 0, stream: Any = None) -> None:
        if src != 0:
            raise ValueError("only the trainer (rank 0) broadcasts")
        data = tensor.detach().cpu().contiguous().numpy().tobytes()
        deadline = time.monotonic() + self.wait_s
        while not self.group.deliver(data):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"broadcast {len(self.sent) + 1} found no receiver in "
                    f"{', '.join(self.group.waiting_for()) or 'the group'} (every server must be "
                    "inside /update_weights, expecting it, at once)")
            time.sleep(0.001)
        self.sent.append(len(data))

    def destroy(self) -> None:
        # rank 0 gone: the group is dead (as an NCCL communicator missing a rank is)
        with _GROUPS_LOCK:
            if _GROUPS.get(self.group.key) is self.group:
                del _GROUPS[self.group.key]


def fake_join(wait_s: float = 10.0) -> Callable[[dict[str, Any]], FakeCommunicator]:
    """A `join` for trainer.nccl_transfer.NcclWeightTransfer: joins as rank 0 and returns when
    every rank has joined (as NCCL's communicator init does), else raises."""

    def join(info: dict[str, Any]) -> FakeCommunicator:
        group = fake_group(info["master_address"], info["master_port"])
        with group.lock:
            why = group._agree_world(int(info["world_size"]))
            if why is None and group.trainer_joined:
                why = "rank 0 is taken"
            if why is None:
                group.trainer_joined = True
        if why is not None:
            raise RuntimeError(f"trainer cannot join the NCCL group: {why}")
        deadline = time.monotonic() + wait_s
        while not group.complete():
            if time.monotonic() > deadline:
                with group.lock:
                    have = sorted(group._taken())
                raise RuntimeError(f"the NCCL group never formed: ranks {have} of "
                                   f"world_size {group.world_size} joined")
            time.sleep(0.002)
        return FakeCommunicator(group, wait_s)

    return join


def nccl_routes(state: FakeState) -> list[Route]:
    """vLLM's weight-transfer routes (vllm/entrypoints/rl/online/api_router.py) with the
    worker side's rules (vllm 0.32 gpu_worker.py, nccl_engine.py): init and update block
    until the rest of the group meets them (as NCCL collectives do), an update needs init and
    start, what arrives must be what `update_info` announced cut as the init's geometry says,
    one update session at a time (a second start is refused until finish), a failed update
    ends its session, finish needs a session, and the engine cannot shut down during one.
    `nccl_stuck` makes a worker wait for ever inside the update (a trainer that died
    mid-broadcast); `nccl_fail_finish` fails finishes."""
    me = id(state)

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message}}, status)

    async def wait_for(predicate: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + state.nccl_wait_s
        while not predicate():
            if time.monotonic() > deadline:
                return False
            await anyio.sleep(0.002)
        return True

    async def receive(group: FakeNcclGroup) -> bytes | None:
        deadline = time.monotonic() + state.nccl_wait_s
        while (data := group.take(me)) is None:
            if time.monotonic() > deadline:
                return None
            await anyio.sleep(0.001)
        return data

    async def world_size(request: Request) -> Response:
        return JSONResponse({"world_size": state.nccl_world_size})

    async def init(request: Request) -> Response:
        info = (await request.json()).get("init_info")
        if not state.nccl_configured:
            return error(500, "Weight transfer not configured: start the server with "
                         "--weight-transfer-config")
        if not isinstance(info, dict):
            return error(422, "init_info must be an object")
        if set(info) - INIT_KEYS:
            return error(500, "Invalid init_info for NCCLWeightTransferEngine: unexpected "
                         f"keyword argument(s) {sorted(set(info) - INIT_KEYS)}")
        missing = {"master_address", "master_port", "rank_offset", "world_size"} - set(info)
        if missing:
            return error(400, f"init_info lacks {sorted(missing)}")
        offset, world = int(info["rank_offset"]), int(info["world_size"])
        geometry = (bool(info.get("packed", False)),
                    int(info.get("packed_buffer_size_bytes", DEFAULT_BUCKET_BYTES)),
                    int(info.get("packed_num_buffers", DEFAULT_BUCKET_BUFFERS)))
        group = fake_group(info["master_address"], info["master_port"])
        why = group.join_worker(me, range(offset, offset + state.nccl_world_size), world,
                                geometry)
        if why is not None:
            return error(400, f"this server's {state.nccl_world_size} worker(s): {why}")
        state.nccl_group = group
        if not await wait_for(group.complete):
            group.leave(me)
            return error(500, "the NCCL group never formed (not every rank joined)")
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

    def fail_update(message: str) -> JSONResponse:
        state.nccl_updating = False  # vLLM's worker ends the session on a failed update
        if state.nccl_group is not None:
            state.nccl_group.stop_expecting(me)
        return error(500, message)

    async def update(request: Request) -> Response:
        info = (await request.json()).get("update_info") or {}
        group = state.nccl_group
        if state.nccl_init is None or group is None or not state.nccl_updating:
            return error(500, "update_weights before init_weight_transfer_engine and "
                         "start_weight_update")
        names, dtypes, shapes = (info.get(k) for k in ("names", "dtype_names", "shapes"))
        if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)
                and len(names) == len(dtypes) == len(shapes)):
            return error(500, "names, dtype_names and shapes must be lists of one length")
        if any(d not in DTYPE_BYTES for d in dtypes):
            return error(500, f"unknown dtype in {sorted(set(dtypes) - set(DTYPE_BYTES))}")
        sizes = [DTYPE_BYTES[d] * _numel(s) for d, s in zip(dtypes, shapes, strict=True)]
        if me not in group.members:
            return error(500, "this server left the NCCL group")
        packed, bucket_bytes, _buffers = group.members[me].geometry
        plan = (consumer_buckets(sizes, bucket_bytes) if packed
                else [[i] for i in range(len(sizes))])
        began = time.monotonic()
        if state.nccl_stuck:  # a real worker without its trainer waits in NCCL for ever
            await anyio.sleep_forever()
        group.expect(me, len(plan))
        tensors: dict[str, bytes] = {}
        for k, bucket in enumerate(plan):
            want = sum(sizes[i] for i in bucket)
            data = await receive(group)
            if data is None:
                return fail_update(f"received {k} of {len(plan)} broadcasts")
            if len(data) != want:
                return fail_update(
                    f"broadcast {k + 1} of {len(plan)} carries {len(data)} bytes where "
                    f"update_info and packed_buffer_size_bytes={bucket_bytes} make {want}: "
                    "the trainer cut the buckets otherwise (bucket geometry disagrees)")
            offset = 0
            for i in bucket:
                tensors[names[i]] = data[offset:offset + sizes[i]]
                offset += sizes[i]
        state.update_spans.append((began, time.monotonic()))
        state.nccl_broadcasts.append(len(plan))
        state.nccl_received = [(n, d, tuple(s)) for n, d, s in zip(names, dtypes, shapes,
                                                                    strict=True)]
        state.nccl_tensors = tensors
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
        if state.nccl_group is not None:
            state.nccl_group.leave(me)
        state.nccl_init, state.nccl_group = None, None
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


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
