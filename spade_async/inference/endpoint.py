"""One endpoint of the pool: its HTTP client, its live state, and one attempt of a request.

The state is what routing and health read and write: requests in flight (overall and per
model), up or down, the models it lists, its capabilities, its measured speed, a 429's
back-off, and its saturation over time. One attempt either returns the JSON body or raises:
`Retryable` for what another attempt may fix, `EndpointRequestError` for a 4xx.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any

import anyio
import httpx

from spade_async.core.config import EndpointConfig
from spade_async.inference.capabilities import Capabilities
from spade_async.inference.errors import (
    EndpointConnectionError,
    EndpointMalformedResponse,
    EndpointRequestError,
    EndpointServerError,
    EndpointTimeout,
    Retryable,
    describe,
    detail,
    retry_after_s,
)
from spade_async.inference.speed import SpeedMeter, Work, attempt_timeout


def open_client(cfg: EndpointConfig,
                transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """The HTTP client of one endpoint: its base URL, headers and connection limit."""
    return httpx.AsyncClient(
        base_url=cfg.base_url.rstrip("/"),
        # Each attempt's deadline is ours (anyio, sized per request); httpx only
        # bounds the connect.
        timeout=httpx.Timeout(None, connect=min(5.0, cfg.request_timeout_s)),
        limits=httpx.Limits(max_connections=cfg.max_concurrency + 4),
        headers=cfg.request_headers() or None,
        transport=transport,
    )


class Endpoint:
    """One server of the pool: its client and live state (see the module docstring)."""

    def __init__(self, cfg: EndpointConfig, client: httpx.AsyncClient, window: int) -> None:
        self.cfg = cfg
        self.client = client
        self.in_flight = 0
        self.failures = 0
        self.up = True
        self.last_failure = -math.inf
        self.model_in_flight: Counter[str] = Counter()
        # Model ids the server lists (base + adapters); None until a probe has run: serve anything.
        self.models: frozenset[str] | None = None
        self.speed = SpeedMeter(window)
        # What the server can do (probed once up, again after each outage); None: not yet.
        self.caps: Capabilities | None = None
        self.reprobe = False  # set by an outage: probe again when it is back
        self.probing = False
        self.not_before = -math.inf  # a 429's Retry-After: no requests here until then
        # Saturation: the integral over time of min(in_flight, max_concurrency) / max, so any
        # window's mean is (area difference) / (seconds); see `EndpointPool.saturation_area`.
        self._area = 0.0
        self._area_at = time.monotonic()

    def add_in_flight(self, delta: int) -> None:
        """Change the in-flight count, accounting the time at the old count first."""
        now = time.monotonic()
        self._area += (now - self._area_at) * min(self.in_flight, self.cfg.max_concurrency) \
            / self.cfg.max_concurrency
        self._area_at = now
        self.in_flight += delta

    def area(self) -> float:
        now = time.monotonic()
        return self._area + (now - self._area_at) * min(
            self.in_flight, self.cfg.max_concurrency) / self.cfg.max_concurrency

    @property
    def name(self) -> str:
        return self.cfg.name

    def load(self) -> float:
        return self.in_flight / self.cfg.max_concurrency

    def attempt_timeout(self, work: Work | None, margin: float) -> float:
        """Seconds one attempt of `work` may take here (see `speed`)."""
        return attempt_timeout(self.cfg, self.speed, self.in_flight, work, margin)

    def snapshot(self) -> dict[str, Any]:
        """For status: up or down, requests in flight against its limit."""
        per_unit = self.speed.quantile()
        return {"name": self.name, "group": self.cfg.group, "base_url": self.cfg.base_url,
                "up": self.up, "server": None if self.caps is None else self.caps.server,
                "paths": None if self.caps is None else self.caps.as_dict()["paths"],
                "rate_limited_s": round(max(0.0, self.not_before - time.monotonic()), 1),
                "in_flight": self.in_flight, "max_concurrency": self.cfg.max_concurrency,
                "weight_swap": self.cfg.weight_swap.type,
                # p90 seconds per sampled token of one request alone: what the
                # attempt timeouts scale with
                "s_per_token_p90": None if per_unit is None else round(per_unit, 5)}

    async def post_once(self, path: str, payload: dict[str, Any],
                        timeout_s: float) -> dict[str, Any]:
        """One attempt: the JSON body of a 2xx answer (`{}` for an empty one)."""
        try:
            with anyio.fail_after(timeout_s):
                resp = await self.client.post(path, json=payload)
        except TimeoutError:
            raise Retryable(EndpointTimeout, f"no answer within {timeout_s:.0f}s") from None
        except httpx.TransportError as exc:  # refused, reset, closed mid-body
            raise Retryable(EndpointConnectionError, describe(exc)) from None
        if resp.status_code == 429 or resp.status_code >= 500:
            raise Retryable(EndpointServerError, f"HTTP {resp.status_code}: {detail(resp)}",
                            resp.status_code, retry_after_s(resp.headers.get("retry-after")))
        if resp.status_code >= 400:
            raise EndpointRequestError(self.name, resp.status_code, detail(resp))
        if not resp.content:
            return {}
        try:
            body = resp.json()
        except ValueError:
            if "json" in resp.headers.get("content-type", ""):
                raise Retryable(EndpointMalformedResponse,
                                f"HTTP {resp.status_code} with a body that is not JSON: "
                                f"{resp.text[:120]!r}") from None
            # vLLM's admin routes (load/unload_lora_adapter) answer 200 with plain text.
            return {"text": resp.text}
        return body if isinstance(body, dict) else {"data": body}
