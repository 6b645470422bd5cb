"""The trainer's data plane for `vllm-nccl`: rank 0 of a private NCCL group with the inference
workers, broadcasting full checkpoint-format tensors one by one (vLLM's unpacked mode).

It uses vLLM's own rendezvous helper (`StatelessProcessGroup` + `PyNcclCommunicator`, through
`vllm.distributed.weight_transfer.nccl_common.trainer_init`), so both sides agree on the wire
by construction; the trainer's environment therefore needs vllm importable (GPU clusters
usually have it). The HTTP control plane is `spade_async.endpoints.swap.NcclSwapper`.
Only the trainer's rank 0 builds one; it never touches the training process group.
"""

from __future__ import annotations

import socket
from typing import Any

import torch


class NcclTransferError(RuntimeError):
    """The NCCL data plane cannot run here; the message says what is missing."""


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class NcclWeightTransfer:
    """Implements `spade_async.endpoints.swap.WeightTransfer` on one CUDA device."""

    def __init__(self, device: torch.device, *, master_address: str | None = None) -> None:
        if device.type != "cuda":
            raise NcclTransferError("vllm-nccl publishing needs the trainer on CUDA "
                                    "(trainer.backend = 'nccl' or 'auto' with a GPU)")
        try:
            from vllm.distributed.weight_transfer import nccl_common  # noqa: F401
        except ImportError as exc:
            raise NcclTransferError(
                "vllm-nccl publishing needs vllm importable in the trainer's environment "
                f"(its NCCL rendezvous helpers): {exc}") from None
        self.device = device
        self.master_address = master_address or socket.gethostbyname(socket.gethostname())
        self.master_port = 0
        self.world_size = 0
        self.comm: Any = None
        self.weights: list[tuple[str, torch.Tensor]] = []

    def set_weights(self, state: dict[str, torch.Tensor]) -> None:
        """The version to send next: HF checkpoint names, the serving dtype, any device."""
        self.weights = list(state.items())

    def rendezvous(self, inference_world_size: int) -> dict[str, Any]:
        self.world_size = 1 + inference_world_size
        self.master_port = _free_port(self.master_address)
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
