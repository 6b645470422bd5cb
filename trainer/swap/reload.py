"""`vllm-reload`: pause (keeping in-flight requests), `reload_weights` from a safetensors
directory through `/collective_rpc`, reset the prefix cache, record the version, resume.
"""

from __future__ import annotations

from pathlib import Path

import anyio

from trainer.swap.base import SwapError, WeightSwapper


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
