"""Weight-swap backends: put policy version N into one running inference server.

One small class per backend (DESIGN §5), all driven through the pool's pinned-endpoint POSTs so
they share its deadlines, retries and error messages:
- `vllm-lora`: load adapter `<served>-vN` over HTTP; requests then name it as the model; adapters
  beyond `max_loaded_adapters` are unloaded once their in-flight requests have finished;
- `vllm-reload`: pause (keeping in-flight requests), `reload_weights` from a safetensors directory
  through `/collective_rpc`, reset the prefix cache, record the version, resume;
- `none`: an external API that is never trained.
This module never decides *when* to swap; the daemon's weight watcher does.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import anyio

from spade_async.endpoints.pool import EndpointError, EndpointPool, EndpointRequestError
from spade_async.logs import get_logger

log = get_logger("swap")


class SwapError(EndpointError):
    """A weight swap failed; the message names the endpoint, the version and the step."""


@dataclass(frozen=True)
class SwapResult:
    endpoint: str
    version: int
    model: str  # the name requests must use to get this version
    seconds: float


class WeightSwapper(ABC):
    """Lifecycle owned here; a backend implements `_swap` and `model_name`."""

    def __init__(self, pool: EndpointPool, endpoint: str, served_name: str) -> None:
        self.pool, self.endpoint, self.served_name = pool, endpoint, served_name
        self.version: int | None = None

    @abstractmethod
    def model_name(self, version: int) -> str: ...

    @abstractmethod
    async def _swap(self, version: int, path: Path) -> None: ...

    async def swap(self, version: int, path: Path) -> SwapResult:
        path = Path(path).resolve()
        if not path.exists():
            raise SwapError(f"{self.endpoint}: weights for version {version} not found at {path}")
        start = time.perf_counter()
        try:
            await self._swap(version, path)
        except EndpointError as exc:
            raise SwapError(f"{self.endpoint}: swap to version {version} failed: {exc}") from exc
        self.version = version
        result = SwapResult(self.endpoint, version, self.model_name(version),
                            time.perf_counter() - start)
        log.info("weights_swapped", endpoint=self.endpoint, version=version, model=result.model,
                 seconds=round(result.seconds, 4))
        return result

    async def _post(self, path: str, payload: dict) -> dict:
        return (await self.pool.post(path, payload, endpoint=self.endpoint))[1]


class LoraSwapper(WeightSwapper):
    def __init__(self, pool: EndpointPool, endpoint: str, served_name: str,
                 max_loaded_adapters: int = 4, drain_timeout_s: float = 300.0) -> None:
        super().__init__(pool, endpoint, served_name)
        self.max_loaded = max_loaded_adapters
        self.drain_timeout_s = drain_timeout_s
        self.loaded: list[int] = []

    def model_name(self, version: int) -> str:
        return f"{self.served_name}-v{version}"

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


class ReloadSwapper(WeightSwapper):
    def model_name(self, version: int) -> str:
        return self.served_name

    async def _swap(self, version: int, path: Path) -> None:
        if not any(path.glob("*.safetensors")):
            raise SwapError(f"{self.endpoint}: {path} holds no *.safetensors weights")
        # Pause with mode=keep freezes in-flight requests instead of aborting them; each token's
        # log-prob stays the one its sampler used, before or after the swap.
        await self._post("/pause?mode=keep", {})
        try:
            await self._post(
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": str(path)}},
            )
            await self._post("/reset_prefix_cache", {})
            await self._post("/update_weight_version", {"new_version": str(version)})
        finally:
            with anyio.move_on_after(30, shield=True):
                await self._post("/resume", {})


class NoSwapper(WeightSwapper):
    def model_name(self, version: int) -> str:
        return self.served_name

    async def _swap(self, version: int, path: Path) -> None:
        raise SwapError(f"{self.endpoint}: weight_swap type 'none' is an external API; it is never trained")


def make_swapper(pool: EndpointPool, endpoint: str, served_name: str) -> WeightSwapper:
    backend = pool.config(endpoint).weight_swap
    if backend.type == "vllm-lora":
        return LoraSwapper(pool, endpoint, served_name, backend.max_loaded_adapters)
    if backend.type == "vllm-reload":
        return ReloadSwapper(pool, endpoint, served_name)
    if backend.type == "none":
        return NoSwapper(pool, endpoint, served_name)
    raise SwapError(
        f"{endpoint}: weight_swap type '{backend.type}' needs the trainer's NCCL group, "
        "which this build does not have yet; use vllm-lora or vllm-reload"
    )
