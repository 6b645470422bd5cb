"""Data parallelism: the process group, and DDP or FSDP2 applied to a plain `PolicyModel`.

FSDP2 shards each decoder layer and then the root (embeddings, final norm and LM head stay in
the root's group, which keeps tied embeddings tied). Gradient accumulation skips the gradient
all-reduce / reduce-scatter on every micro-batch but the last. What it must never do: read the
spool, build the loss, or know about torchrun (the launcher passes rank and world size in).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_backend(name: str) -> str:
    if name == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if name == "nccl" and not torch.cuda.is_available():
        raise RuntimeError("trainer.backend = 'nccl' needs CUDA; use 'gloo' (or 'auto') on CPU")
    return name


@contextlib.contextmanager
def process_group(backend: str, *, timeout_s: float) -> Iterator[Dist]:
    """Join the group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ...) or, outside
    torchrun, a group of one; always destroyed on the way out."""
    backend = resolve_backend(backend)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    timeout = timedelta(seconds=timeout_s)
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout,
                                device_id=device if backend == "nccl" else None)
    else:
        if world != 1:
            raise RuntimeError(f"WORLD_SIZE={world} without MASTER_ADDR: start under torchrun")
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
    try:
        yield Dist(rank, world, local_rank, device, backend)
    finally:
        dist.destroy_process_group()


def wrap(model: nn.Module, how: str, d: Dist, *, bf16: bool) -> nn.Module:
    """DDP or FSDP2 around a model already on `d.device`; the optimizer is built after this."""
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        # Every trainable parameter is used in every forward; the only buffers (rotary
        # frequencies) are constants, so they are not re-broadcast on each forward.
        return DDP(model, device_ids=[d.local_rank] if d.device.type == "cuda" else None,
                   forward_sync_buffers=False)
    if how == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(d.device.type, (d.world_size,))
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if bf16 else MixedPrecisionPolicy())
        for layer in model.decoder_layers():
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        return model
    raise ValueError(f"unknown parallelism {how!r}")


def inner(model: nn.Module) -> nn.Module:
    """The PolicyModel inside a DDP wrapper (FSDP2 modifies the module in place)."""
    return getattr(model, "module", model)


@contextlib.contextmanager
def grad_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient reduction for a non-final micro-batch."""
    if enabled:
        yield
        return
    if hasattr(model, "no_sync"):  # DDP
        with model.no_sync():
            yield
        return
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    yield


def all_reduce_(t: torch.Tensor, d: Dist, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
                ) -> torch.Tensor:
    """In-place all-reduce of a small CPU tensor (through the device for NCCL)."""
    if d.world_size == 1:
        return t
    if d.backend == "nccl":
        on_dev = t.to(d.device)
        dist.all_reduce(on_dev, op=op)
        t.copy_(on_dev.cpu())
    else:
        dist.all_reduce(t, op=op)
    return t


def broadcast_int(value: int, d: Dist) -> int:
    """Rank 0's value on every rank."""
    if d.world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64,
                     device=d.device if d.backend == "nccl" else "cpu")
    dist.broadcast(t, src=0)
    return int(t.item())


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> float:
    """Global grad norm (clipped when max_norm > 0); DTensor norms are gathered."""
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(grads, max_norm if max_norm > 0 else float("inf"))
    full = getattr(norm, "full_tensor", None)
    return float(full() if callable(full) else norm)
