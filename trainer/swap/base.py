"""The lifecycle every weight-swap backend shares: check the weights exist, time the swap, turn
endpoint errors into a SwapError that names the endpoint and the version, log it. A backend
implements `_swap` and `model_name` (the name requests must use to get a version).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from spade_async.core.logs import get_logger
from spade_async.inference.errors import EndpointError
from spade_async.inference.pool import EndpointPool

log = get_logger("swap")


class SwapError(EndpointError):
    """A weight swap failed; the message names the endpoint, the version and the step."""


class WedgedServer(SwapError):
    """The server's workers wait in an NCCL collective the trainer will never finish: only a
    restart of that inference server frees them."""

    kind = "wedged"


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
        except WedgedServer:
            raise  # says what to do already
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
