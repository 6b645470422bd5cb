"""One swapper per endpoint, chosen by its `weight_swap.type`."""

from __future__ import annotations

from spade_async.inference.pool import EndpointPool
from trainer.swap.base import SwapError, WeightSwapper
from trainer.swap.lora import LoraSwapper
from trainer.swap.nccl import NcclSwapper
from trainer.swap.none import NoSwapper
from trainer.swap.reload import ReloadSwapper


def make_swapper(pool: EndpointPool, endpoint: str, served_name: str,
                 adapter_prefix: str | None = None) -> WeightSwapper:
    backend = pool.config(endpoint).weight_swap
    if backend.type == "vllm-lora":
        return LoraSwapper(pool, endpoint, served_name, backend.max_loaded_adapters,
                           adapter_prefix=adapter_prefix)
    if backend.type == "vllm-reload":
        return ReloadSwapper(pool, endpoint, served_name)
    if backend.type == "none":
        return NoSwapper(pool, endpoint, served_name)
    if backend.type == "vllm-nccl":
        # The data plane (the NCCL group holding the trainer's GPU weights) is attached by the
        # trainer with `attach`; any other process gets a clear SwapError from `swap`.
        return NcclSwapper(pool, endpoint, served_name, timeout_s=backend.timeout_s)
    raise SwapError(f"{endpoint}: unknown weight_swap type '{backend.type}'")
