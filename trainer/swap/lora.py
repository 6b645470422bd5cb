"""`vllm-lora`: load adapter `<prefix>-vN` over HTTP (the prefix is `model.adapter_prefix`,
by default the served name); requests then name it as the model;
adapters beyond `max_loaded_adapters` are unloaded once their in-flight requests have finished.
"""

from __future__ import annotations

from pathlib import Path

import anyio

from spade_async.core.logs import get_logger
from spade_async.inference.errors import EndpointRequestError
from spade_async.inference.pool import EndpointPool
from trainer.swap.base import SwapError, WeightSwapper

log = get_logger("swap")


class LoraSwapper(WeightSwapper):
    def __init__(self, pool: EndpointPool, endpoint: str, served_name: str,
                 max_loaded_adapters: int = 4, drain_timeout_s: float = 300.0,
                 adapter_prefix: str | None = None) -> None:
        super().__init__(pool, endpoint, served_name)
        self.adapter_prefix = adapter_prefix or served_name
        self.max_loaded = max_loaded_adapters
        self.drain_timeout_s = drain_timeout_s
        self.loaded: list[int] = []

    def model_name(self, version: int) -> str:
        return f"{self.adapter_prefix}-v{version}"

    def version_of(self, adapter: str) -> int | None:
        """The version an adapter name of this lineage serves; None for anyone else's."""
        head, sep, tail = adapter.rpartition("-v")
        return int(tail) if sep and head == self.adapter_prefix and tail.isdigit() else None

    async def _swap(self, version: int, path: Path) -> None:
        if not (path / "adapter_config.json").is_file():
            raise SwapError(f"{self.endpoint}: {path} is not a peft adapter (no adapter_config.json)")
        name = self.model_name(version)
        try:
            await self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        except EndpointRequestError as exc:
            # After a daemon restart the server may still hold it: that is the state we want.
            if "already been loaded" not in exc.detail:
                raise
        self.pool.note_model(self.endpoint, name, served=True)
        try:
            await self._post("/update_weight_version", {"new_version": str(version)})
        except EndpointRequestError as exc:
            if exc.status != 404:  # servers outside dev mode have no such route
                raise
        if version not in self.loaded:
            self.loaded.append(version)
        while len(self.loaded) > self.max_loaded:
            await self.retire(self.loaded[0])

    async def retire(self, version: int) -> None:
        """Unload an old adapter after the requests that use it have finished."""
        name = self.model_name(version)
        with anyio.move_on_after(self.drain_timeout_s) as scope:
            while self.pool.in_flight_for(self.endpoint, name):
                await anyio.sleep(0.05)
        if scope.cancelled_caught:
            log.warning("adapter_drain_timeout", endpoint=self.endpoint, model=name)
        try:
            await self._post("/v1/unload_lora_adapter", {"lora_name": name})
        except EndpointRequestError as exc:
            if exc.status != 404:
                raise
        self.pool.note_model(self.endpoint, name, served=False)
        self.loaded.remove(version)
