"""`none`: an external API that is never trained; a swap into it is refused."""

from __future__ import annotations

from pathlib import Path

from trainer.swap.base import SwapError, WeightSwapper


class NoSwapper(WeightSwapper):
    def model_name(self, version: int) -> str:
        return self.served_name

    async def _swap(self, version: int, path: Path) -> None:
        raise SwapError(f"{self.endpoint}: weight_swap type 'none' is an external API; it is never trained")
