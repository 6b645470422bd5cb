"""Endpoint health: the probes of `/v1/models` (and `/weight_info`), the health loop, and
capability probes once an endpoint is up.

A probe lists the models an endpoint serves and marks it up; a refused connection marks it down
at once, a slow or failed answer counts like a failed request (`down_after_failures` in a row).
The health loop (`EndpointPool.run`) probes every `health_interval_s`, so a down endpoint comes
back into rotation, and probes its capabilities again after each outage.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from anyio.abc import TaskStatus

from spade_async.core.config import PoolConfig
from spade_async.core.logs import get_logger
from spade_async.inference.capabilities import Capabilities, ProbeUnanswered, probe_capabilities
from spade_async.inference.endpoint import Endpoint
from spade_async.inference.errors import describe
from spade_async.inference.routing import Router

log = get_logger("pool")


@dataclass(frozen=True)
class EndpointHealth:
    """What `spade endpoints check` prints for one endpoint."""

    name: str
    base_url: str
    up: bool
    latency_ms: float | None
    models: tuple[str, ...]
    adapters: tuple[str, ...]
    weight_version: str | None
    in_flight: int
    error: str | None = None
    group: str = "default"
    capabilities: Capabilities | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "group": self.group,
            "base_url": self.base_url,
            "up": self.up,
            "latency_ms": self.latency_ms,
            "models": list(self.models),
            "adapters": list(self.adapters),
            "weight_version": self.weight_version,
            "in_flight": self.in_flight,
            "error": self.error,
            "capabilities": None if self.capabilities is None else self.capabilities.as_dict(),
        }


class HealthMonitor:
    """Probes the router's endpoints and marks them up or down there."""

    def __init__(self, router: Router, cfg: PoolConfig) -> None:
        self.router = router
        self.cfg = cfg
        self._models_lock = anyio.Lock()
        self._models_probed_at = -1.0  # monotonic time of the last on-demand model refresh

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Health loop: probes every endpoint each `health_interval_s`; ready after the first
        pass (which probes capabilities too, so start-up checks can read them). Later
        capability probes (an endpoint back from an outage) run beside the loop: a server that
        answers slowly never holds up its own return to rotation."""
        await self.check()
        task_status.started()
        async with anyio.create_task_group() as tg:
            while True:
                await anyio.sleep(self.cfg.health_interval_s)
                for h in await self.check(capabilities=False):
                    ep = self.router.get(h.name)
                    if h.up and h.models and (ep.caps is None or ep.reprobe) and not ep.probing:
                        ep.probing = True
                        tg.start_soon(self._probe_capabilities, ep, h.models[0])

    async def check(self, *, capabilities: bool = True) -> list[EndpointHealth]:
        """Probe all endpoints concurrently; updates their up/down state and served models,
        and (with `capabilities`) probes the capabilities of those not probed since they
        came up."""
        results: dict[str, EndpointHealth] = {}

        async def probe(ep: Endpoint) -> None:
            results[ep.name] = await self._probe(ep, capabilities)

        async with anyio.create_task_group() as tg:
            for ep in self.router.endpoints:
                tg.start_soon(probe, ep)
        return [results[ep.name] for ep in self.router.endpoints]

    async def refresh_models(self, asked_at: float) -> None:
        """Re-list every endpoint's models now, once for all the requests waiting since
        `asked_at`: another process (the trainer) may have loaded an adapter since the last
        health probe."""
        async with self._models_lock:
            if self._models_probed_at >= asked_at:
                return  # a refresh started after this request asked: its answer stands
            started = time.monotonic()
            await self.check()
            self._models_probed_at = started

    async def _probe(self, ep: Endpoint, capabilities: bool = True) -> EndpointHealth:
        start = time.perf_counter()
        models: list[str] = []
        adapters: list[str] = []
        version: str | None = None
        error: str | None = None
        refused = False
        try:
            with anyio.fail_after(self.cfg.health_timeout_s):
                resp = await ep.client.get("/v1/models")
                resp.raise_for_status()
                latency = (time.perf_counter() - start) * 1000
                for m in resp.json().get("data", []):
                    # vLLM lists LoRA adapters beside the base model, with `parent` set.
                    (adapters if m.get("parent") else models).append(m["id"])
                if ep.cfg.weight_swap.type != "none":
                    version = await weight_version(ep)
        except (httpx.HTTPError, TimeoutError, ValueError, KeyError) as exc:
            error = describe(exc)
            # Refused or reset: nobody is there. A slow answer is different: a CPU server
            # busy with a full batch may miss the probe's deadline while it serves well, so
            # that takes `down_after_failures` misses in a row, like a failed request.
            refused = isinstance(exc, httpx.TransportError) and not isinstance(
                exc, httpx.TimeoutException)
        if error is None:
            self.router.mark_up(ep, frozenset(models + adapters))
            if capabilities and (ep.caps is None or ep.reprobe) and models and not ep.probing:
                ep.probing = True
                await self._probe_capabilities(ep, models[0])
            return EndpointHealth(
                ep.name, ep.cfg.base_url, True, round(latency, 2), tuple(models), tuple(adapters),
                version, ep.in_flight, group=ep.cfg.group, capabilities=ep.caps,
            )
        self.router.mark_failed(ep, error, force_down=refused)
        return EndpointHealth(ep.name, ep.cfg.base_url, False, None, (), (), None, ep.in_flight,
                              error, group=ep.cfg.group, capabilities=ep.caps)

    async def _probe_capabilities(self, ep: Endpoint, model: str) -> None:
        """Once up, and again after each outage (a restarted server may be another one)."""
        try:
            caps = await probe_capabilities(ep.client, model,
                                            timeout_s=self.cfg.probe_timeout_s)
        except ProbeUnanswered as exc:  # busy or gone: known next time
            log.info("capability_probe_unanswered", endpoint=ep.name, reason=str(exc))
            return
        finally:
            ep.probing = False
        if ep.caps is None or ep.caps.as_dict() | {"probed_at": 0} != caps.as_dict() | {
                "probed_at": 0}:
            log.info("endpoint_capabilities", endpoint=ep.name, server=caps.server,
                     paths=caps.as_dict()["paths"], tools=caps.tools,
                     structured=caps.structured, swap=caps.as_dict()["swap"])
        ep.caps, ep.reprobe = caps, False
        self.router.notify()


async def weight_version(ep: Endpoint) -> str | None:
    """vLLM reports the version set by `/update_weight_version` on `/weight_info`
    (dev mode); servers without it (or without dev mode) report None."""
    try:
        resp = await ep.client.get("/weight_info")
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    body = resp.json()
    value = body.get("weight_version") if isinstance(body, dict) else body
    return None if value is None else str(value)
