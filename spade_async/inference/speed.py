"""How long one attempt may take: the work a request asks for and each endpoint's measured speed.

Each attempt's timeout fits the request and the machine: the larger of the endpoint's
`request_timeout_s` and `timeout_margin` times the time the endpoint's measured speed predicts
for the tokens asked (prompt and completion) at its current load; before there is a measurement,
`min_tokens_per_s` stands in for it. A slow CPU server gets the time it needs; a stalled one is
still given up on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from spade_async.core.config import EndpointConfig

# A prompt token costs this fraction of a sampled token (prefill is batched, decode is not).
PREFILL_WEIGHT = 0.05


@dataclass(frozen=True)
class Work:
    """What one generation request asks of a server: the attempt timeout scales with it."""

    prompt_tokens: int
    max_tokens: int

    def units(self, completion_tokens: int | None = None) -> float:
        done = self.max_tokens if completion_tokens is None else completion_tokens
        return max(1.0, done + PREFILL_WEIGHT * self.prompt_tokens)


class SpeedMeter:
    """Seconds per unit of work per concurrent request, over the last `window` successful
    generations of one endpoint. The per-request load normalises for batching: a request that
    shared the server with 15 others took ~16x the time of one alone on a compute-bound CPU (a
    GPU does better, which only makes the estimate cautious)."""

    def __init__(self, window: int) -> None:
        self.samples: deque[float] = deque(maxlen=window)

    def observe(self, seconds: float, units: float, load: float) -> None:
        self.samples.append(seconds / (units * max(1.0, load)))

    def quantile(self, q: float = 0.9, min_samples: int = 4) -> float | None:
        if len(self.samples) < min_samples:
            return None
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def attempt_timeout(cfg: EndpointConfig, speed: SpeedMeter, in_flight: int, work: Work | None,
                    margin: float) -> float:
    """Seconds one attempt of `work` may take on the endpoint of `cfg` that has measured
    `speed` and has `in_flight` requests (see the module docstring)."""
    floor = cfg.request_timeout_s
    if work is None:
        return floor
    per_unit = speed.quantile()
    if per_unit is None:  # not measured yet: the slowest speed we are told to wait for
        return max(floor, work.max_tokens / cfg.min_tokens_per_s)
    return max(floor, margin * per_unit * work.units() * max(1, in_flight))
