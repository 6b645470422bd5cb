"""Async pool over OpenAI-compatible endpoints: routing, deadlines, retries, health.

Routes each request to the up endpoint with the fewest in-flight requests relative to its
`max_concurrency`, never above it; retries connect errors, timeouts, 429, 5xx and malformed
bodies with jittered exponential back-off (on another endpoint when one is free); a 4xx other
than 429 is the caller's mistake and is raised at once, with the server's message. Consecutive
failures take an endpoint out of rotation; the health loop (`run`) or a half-open retry after
`health_interval_s` brings it back.

One error contract: whatever goes wrong with a request leaves the pool as an `EndpointError`
subclass naming the endpoint, the attempts made and the seconds spent, with a `kind` that
callers count failures by. No bare `TimeoutError` or httpx exception gets out.

Each attempt's timeout fits the request and the machine: the larger of the endpoint's
`request_timeout_s` and `timeout_margin` times the time the endpoint's measured speed predicts
for the tokens asked (prompt and completion) at its current load; before there is a measurement,
`min_tokens_per_s` stands in for it. A slow CPU server gets the time it needs; a stalled one is
still given up on.

Responses keep the server's exact token ids and behaviour log-probs (vLLM's `logprobs` +
`return_token_ids`): training never re-tokenizes text. This module must never know the daemon.
"""

from __future__ import annotations

import email.utils
import json
import math
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from anyio.abc import TaskStatus

from spade_async.core.config import EndpointConfig, PoolConfig
from spade_async.core.logs import get_logger
from spade_async.inference.capabilities import Capabilities, ProbeUnanswered, probe_capabilities

log = get_logger("pool")


class EndpointError(RuntimeError):
    """Base of what the pool raises; the message names the endpoint and what went wrong.

    `endpoint` is the server that failed last (None when none was reached), `attempts` the
    tries made, `elapsed_s` the seconds since the request started; `kind` is a short label for
    counters (deadline, timeout, connection, http_5xx, http_429, malformed, no_endpoint, ...)."""

    kind = "endpoint"

    def __init__(self, message: str, *, endpoint: str | None = None, attempts: int = 0,
                 elapsed_s: float = 0.0) -> None:
        super().__init__(message)
        self.endpoint, self.attempts, self.elapsed_s = endpoint, attempts, elapsed_s


class EndpointRequestError(EndpointError):
    """The server refused the request itself (4xx): retrying elsewhere would not help."""

    kind = "rejected"

    def __init__(self, endpoint: str, status: int, detail: str, *, attempts: int = 1,
                 elapsed_s: float = 0.0) -> None:
        super().__init__(f"endpoint '{endpoint}' rejected the request with HTTP {status}: "
                         f"{detail}", endpoint=endpoint, attempts=attempts, elapsed_s=elapsed_s)
        self.status, self.detail = status, detail


class ModelNotServed(EndpointRequestError):
    """Every endpoint that is up lists its models, and none serves the one asked for."""

    kind = "model_not_served"

    def __init__(self, model: str, served: list[str]) -> None:
        super().__init__("pool", 404, f"model '{model}' is not served by any endpoint "
                         f"(served: {', '.join(served) or 'nothing'})")


class EndpointCapabilityError(EndpointError):
    """The server answered, but without what the caller needs (token ids, log-probs)."""

    kind = "capability"


class EndpointUnavailable(EndpointError):
    """No endpoint could serve the request within the attempts and deadline allowed. The
    subclass says how the last attempt failed."""

    kind = "unavailable"


class NoEndpointUp(EndpointUnavailable):
    """No endpoint was up (or had a free slot) within `wait_for_endpoint_s`."""

    kind = "no_endpoint"


class EndpointConnectionError(EndpointUnavailable):
    """The connection failed: refused, reset, or closed before a whole answer."""

    kind = "connection"


class EndpointTimeout(EndpointUnavailable):
    """An attempt got no answer within its timeout."""

    kind = "timeout"


class EndpointServerError(EndpointUnavailable):
    """The server answered 5xx or 429 (overloaded) on the last attempt."""

    kind = "http_5xx"

    def __init__(self, message: str, *, status: int, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.status = status
        if status == 429:
            self.kind = "http_429"


class EndpointMalformedResponse(EndpointUnavailable):
    """The server answered 2xx with a body that is not the expected JSON."""

    kind = "malformed"


class EndpointDeadlineExceeded(EndpointUnavailable):
    """The request's own deadline (`deadline_s`, retries included) passed."""

    kind = "deadline"


class _Retryable(Exception):
    def __init__(self, kind: type[EndpointUnavailable], reason: str, status: int = 0,
                 retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.cls, self.reason, self.status, self.retry_after = kind, reason, status, retry_after


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds a Retry-After header asks for: delta-seconds or an HTTP date; None if absent
    or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class _Malformed(Exception):
    """Raised by a response parser: the body is not what the route returns."""


@dataclass(frozen=True)
class Completion:
    """One sampled completion, as the server produced it (token ids, not text, are the truth)."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_token_ids: tuple[int, ...]
    finish_reason: str | None
    model: str
    endpoint: str
    latency_s: float
    usage: dict[str, int] = field(default_factory=dict)
    # native tool calls of a chat reply: ({"id", "name", "arguments": dict}, ...)
    tool_calls: tuple[dict[str, Any], ...] = ()
    path: str = "tokens"  # "tokens" (/v1/completions, ids) or "chat" (text)

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids) or self.usage.get("completion_tokens", 0)


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


class _Endpoint:
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
        # window's mean is (area difference) / (seconds); see `saturation_area`.
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
        """Seconds one attempt of `work` may take here (see the module docstring)."""
        floor = self.cfg.request_timeout_s
        if work is None:
            return floor
        per_unit = self.speed.quantile()
        if per_unit is None:  # not measured yet: the slowest speed we are told to wait for
            return max(floor, work.max_tokens / self.cfg.min_tokens_per_s)
        return max(floor, margin * per_unit * work.units() * max(1, self.in_flight))


class EndpointPool:
    """Use as `async with EndpointPool(...) as pool:`; run `pool.run` in a task group for health."""

    def __init__(
        self,
        endpoints: Sequence[EndpointConfig],
        cfg: PoolConfig | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not endpoints:
            raise EndpointError("no endpoints configured: add an [[endpoints]] section")
        names = [e.name for e in endpoints]
        if len(set(names)) != len(names):
            raise EndpointError(f"endpoint names must be unique, got {names}")
        self.cfg = cfg or PoolConfig()
        self._endpoints = [
            _Endpoint(
                e,
                httpx.AsyncClient(
                    base_url=e.base_url.rstrip("/"),
                    # Each attempt's deadline is ours (anyio, sized per request); httpx only
                    # bounds the connect.
                    timeout=httpx.Timeout(None, connect=min(5.0, e.request_timeout_s)),
                    limits=httpx.Limits(max_connections=e.max_concurrency + 4),
                    headers=e.request_headers() or None,
                    transport=transport,
                ),
                self.cfg.speed_window,
            )
            for e in endpoints
        ]
        self._changed = anyio.Event()
        self._models_lock = anyio.Lock()
        self._models_probed_at = -1.0  # monotonic time of the last on-demand model refresh
        # Requests queued in `_acquire` for a slot, by the group they asked for (None: any).
        self._waiting: Counter[str | None] = Counter()

    # ---- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> EndpointPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        with anyio.move_on_after(5, shield=True):
            for ep in self._endpoints:
                await ep.client.aclose()

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
                    ep = self._get(h.name)
                    if h.up and h.models and (ep.caps is None or ep.reprobe) and not ep.probing:
                        ep.probing = True
                        tg.start_soon(self._probe_capabilities, ep, h.models[0])

    # ---- introspection ---------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return [ep.name for ep in self._endpoints]

    def snapshot(self) -> list[dict[str, Any]]:
        """Per endpoint, for status: up or down, requests in flight against its limit."""
        out = []
        for ep in self._endpoints:
            per_unit = ep.speed.quantile()
            out.append({"name": ep.name, "group": ep.cfg.group, "base_url": ep.cfg.base_url,
                        "up": ep.up, "server": None if ep.caps is None else ep.caps.server,
                        "paths": None if ep.caps is None else ep.caps.as_dict()["paths"],
                        "rate_limited_s": round(max(0.0, ep.not_before - time.monotonic()), 1),
                        "in_flight": ep.in_flight, "max_concurrency": ep.cfg.max_concurrency,
                        "weight_swap": ep.cfg.weight_swap.type,
                        # p90 seconds per sampled token of one request alone: what the
                        # attempt timeouts scale with
                        "s_per_token_p90": None if per_unit is None else round(per_unit, 5)})
        return out

    def capacity(self, group: str | None = None) -> int:
        """Requests the endpoints of `group` (None: all) take at once: the sum of their
        `max_concurrency`, up or not (an outage is waited out by the work itself)."""
        return sum(ep.cfg.max_concurrency for ep in self._endpoints
                   if group is None or ep.cfg.group == group)

    def busy(self, group: str | None = None) -> int:
        """Requests of `group` (None: all) in flight or queued for a slot: what admission
        compares with `capacity`. Requests that asked for any group count everywhere."""
        in_flight = sum(ep.in_flight for ep in self._endpoints
                        if group is None or ep.cfg.group == group)
        waiting = (sum(self._waiting.values()) if group is None
                   else self._waiting[group] + self._waiting[None])
        return in_flight + waiting

    def saturation_area(self, name: str) -> float:
        """Seconds-weighted saturation of endpoint `name` since the pool started: the integral
        of min(in flight, max_concurrency) / max_concurrency over time. The mean saturation of
        a window is the difference of two readings over the window's seconds (DESIGN §10)."""
        return self._get(name).area()

    def in_flight_for(self, name: str, model: str) -> int:
        """Requests in flight on endpoint `name` that asked for `model` (an adapter, say)."""
        return self._get(name).model_in_flight[model]

    def is_up(self, name: str) -> bool:
        return self._get(name).up

    def config(self, name: str) -> EndpointConfig:
        return self._get(name).cfg

    def _get(self, name: str) -> _Endpoint:
        for ep in self._endpoints:
            if ep.name == name:
                return ep
        raise EndpointError(f"no endpoint named '{name}' (have {self.names})")

    # ---- health ----------------------------------------------------------------------------

    async def check(self, *, capabilities: bool = True) -> list[EndpointHealth]:
        """Probe all endpoints concurrently; updates their up/down state and served models,
        and (with `capabilities`) probes the capabilities of those not probed since they
        came up."""
        results: dict[str, EndpointHealth] = {}

        async def probe(ep: _Endpoint) -> None:
            results[ep.name] = await self._probe(ep, capabilities)

        async with anyio.create_task_group() as tg:
            for ep in self._endpoints:
                tg.start_soon(probe, ep)
        return [results[ep.name] for ep in self._endpoints]

    async def _probe(self, ep: _Endpoint, capabilities: bool = True) -> EndpointHealth:
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
                    version = await self._weight_version(ep)
        except (httpx.HTTPError, TimeoutError, ValueError, KeyError) as exc:
            error = _describe(exc)
            # Refused or reset: nobody is there. A slow answer is different: a CPU server
            # busy with a full batch may miss the probe's deadline while it serves well, so
            # that takes `down_after_failures` misses in a row, like a failed request.
            refused = isinstance(exc, httpx.TransportError) and not isinstance(
                exc, httpx.TimeoutException)
        if error is None:
            self._mark_up(ep, frozenset(models + adapters))
            if capabilities and (ep.caps is None or ep.reprobe) and models and not ep.probing:
                ep.probing = True
                await self._probe_capabilities(ep, models[0])
            return EndpointHealth(
                ep.name, ep.cfg.base_url, True, round(latency, 2), tuple(models), tuple(adapters),
                version, ep.in_flight, group=ep.cfg.group, capabilities=ep.caps,
            )
        self._mark_failed(ep, error, force_down=refused)
        return EndpointHealth(ep.name, ep.cfg.base_url, False, None, (), (), None, ep.in_flight,
                              error, group=ep.cfg.group, capabilities=ep.caps)

    async def _probe_capabilities(self, ep: _Endpoint, model: str) -> None:
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
        self._notify()

    def capabilities(self, name: str) -> Capabilities | None:
        return self._get(name).caps

    def models_of(self, name: str) -> frozenset[str] | None:
        """The model ids endpoint `name` listed last (None: not probed yet)."""
        return self._get(name).models

    def group_endpoints(self, group: str) -> list[str]:
        return [ep.name for ep in self._endpoints if ep.cfg.group == group]

    async def _weight_version(self, ep: _Endpoint) -> str | None:
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

    def _mark_up(self, ep: _Endpoint, models: frozenset[str] | None = None) -> None:
        if not ep.up:
            log.info("endpoint_up", endpoint=ep.name)
        ep.up, ep.failures = True, 0
        if models is not None:
            ep.models = models
        self._notify()

    def _mark_failed(self, ep: _Endpoint, reason: str, *, force_down: bool = False) -> None:
        ep.failures += 1
        ep.last_failure = time.monotonic()
        if ep.up and (force_down or ep.failures >= self.cfg.down_after_failures):
            ep.up, ep.reprobe = False, True
            log.warning("endpoint_down", endpoint=ep.name, reason=reason, failures=ep.failures)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    # ---- routing ---------------------------------------------------------------------------

    def _eligible(self, ep: _Endpoint, model: str | None, now: float,
                  group: str | None = None, need: str | None = None) -> bool:
        if ep.in_flight >= ep.cfg.max_concurrency or now < ep.not_before:
            return False
        if group is not None and ep.cfg.group != group:
            return False
        if need is not None and ep.caps is not None and not ep.caps.supports(need):
            return False
        if model is not None and ep.models is not None and model not in ep.models:
            return False
        # A down endpoint gets one half-open try per health interval, so a pool without a
        # running health loop (a one-off CLI call) still recovers.
        return ep.up or (now - ep.last_failure >= self.cfg.health_interval_s and ep.in_flight == 0)

    async def _refresh_models(self, asked_at: float) -> None:
        """Re-list every endpoint's models now, once for all the requests waiting since
        `asked_at`: another process (the trainer) may have loaded an adapter since the last
        health probe."""
        async with self._models_lock:
            if self._models_probed_at >= asked_at:
                return  # a refresh started after this request asked: its answer stands
            started = time.monotonic()
            await self.check()
            self._models_probed_at = started

    def _unable(self, group: str | None, need: str | None) -> EndpointCapabilityError | None:
        """The error to raise when every endpoint of `group` is known to lack `need`."""
        if need is None:
            return None
        members = [ep for ep in self._endpoints if group is None or ep.cfg.group == group]
        if not members or any(ep.caps is None or ep.caps.supports(need) for ep in members):
            return None
        lacks = "; ".join(f"endpoint '{ep.name}' lacks " + ", ".join(ep.caps.missing(need))
                          for ep in members if ep.caps is not None)
        where = f"group '{group}'" if group is not None else "the pool"
        return EndpointCapabilityError(f"no endpoint of {where} can take the {need} path: "
                                       f"{lacks}", endpoint=members[0].name)

    async def _acquire(self, model: str | None, exclude: set[str], group: str | None = None,
                       need: str | None = None) -> _Endpoint:
        """A slot on an endpoint of `group` (None: any) that serves `model` and has the
        capabilities of path `need` ("tokens" or "chat"; unknown until probed counts as
        having them). Raises TimeoutError after `wait_for_endpoint_s` without any endpoint
        up, EndpointCapabilityError at once when every endpoint of the group is known to
        lack the path; while endpoints are up but every slot is taken (or rate-limited) the
        request queues (that is back-pressure, not an outage: the request deadline, if any,
        bounds it)."""
        asked_at = time.monotonic()
        give_up_at = asked_at + self.cfg.wait_for_endpoint_s
        refreshed = False
        while True:
            now = time.monotonic()
            unable = self._unable(group, need)
            if unable is not None:
                raise unable
            candidates = [ep for ep in self._endpoints
                          if self._eligible(ep, model, now, group, need)]
            preferred = [ep for ep in candidates if ep.name not in exclude] or candidates
            if preferred:
                ep = min(preferred, key=lambda e: (not e.up, e.load(), e.in_flight))
                ep.add_in_flight(1)
                return ep
            up = [ep for ep in self._endpoints if ep.up
                  and (group is None or ep.cfg.group == group)]
            if model is not None and up and all(
                ep.models is not None and model not in ep.models for ep in up
            ):
                if not refreshed:  # the lists may be older than the model
                    refreshed = True
                    await self._refresh_models(asked_at)
                    continue
                # Waiting cannot help: fail like the server would (404), at once.
                raise ModelNotServed(model, sorted(set().union(*(ep.models for ep in up))))
            if up:  # busy, not down
                give_up_at = now + self.cfg.wait_for_endpoint_s
            elif now >= give_up_at:
                raise TimeoutError
            self._waiting[group] += 1
            try:
                with anyio.move_on_after(min(1.0, self.cfg.health_interval_s,
                                             give_up_at - now)):
                    await self._changed.wait()
            finally:
                self._waiting[group] -= 1

    def _release(self, ep: _Endpoint) -> None:
        ep.add_in_flight(-1)
        self._notify()

    def note_model(self, endpoint: str, model: str, *, served: bool) -> None:
        """A weight swap added or removed `model` on `endpoint` (before the next health probe)."""
        ep = self._get(endpoint)
        if ep.models is not None:
            ep.models = ep.models | {model} if served else ep.models - {model}
            self._notify()

    def serves(self, model: str) -> list[str]:
        """Names of the endpoints known to serve `model` (base name or adapter)."""
        return [ep.name for ep in self._endpoints if ep.models is not None and model in ep.models]

    # ---- requests --------------------------------------------------------------------------

    async def post(
        self,
        path: str,
        payload: dict[str, Any],
        *,
        model: str | None = None,
        endpoint: str | None = None,
        deadline_s: float | None = None,
        work: Work | None = None,
        parse: Callable[[dict[str, Any], str], Any] | None = None,
        group: str | None = None,
        need: str | None = None,
        attempts: int | None = None,
    ) -> tuple[str, Any]:
        """POST with routing and retries; returns (endpoint name, JSON body or `parse(body,
        endpoint)`). `attempts` caps the tries (default `pool.max_attempts`): 1 for a call
        that must never be sent twice (an NCCL collective: a duplicate blocks for ever).

        `endpoint` pins the request to one server (admin calls such as loading an adapter);
        otherwise `model` restricts routing to servers that serve it, `group` to one endpoint
        group and `need` to servers with that path's capabilities. `work` sizes each
        attempt's timeout; `deadline_s` bounds the whole request, retries included. `parse`
        turns the body into the caller's result inside the attempt, so a malformed body is
        retried like any other transient failure.
        """
        errors: list[str] = []
        tried: set[str] = set()
        start = time.monotonic()
        last: _Retryable | None = None
        last_ep: str | None = None
        max_attempts = self.cfg.max_attempts if attempts is None else max(1, attempts)
        attempts = 0

        def fail(cls: type[EndpointUnavailable], what: str, **kw: Any) -> EndpointUnavailable:
            where = f"endpoint '{last_ep}'" if last_ep else "no endpoint reached"
            return cls(f"POST {path} {what} after {attempts} attempt(s) in "
                       f"{time.monotonic() - start:.1f}s ({where}): "
                       + ("; ".join(errors) or "no attempt"),
                       endpoint=last_ep, attempts=attempts,
                       elapsed_s=round(time.monotonic() - start, 3), **kw)

        with anyio.move_on_after(math.inf if deadline_s is None else deadline_s) as scope:
            for attempt in range(max_attempts):
                if endpoint is not None:
                    ep = self._get(endpoint)
                    if ep.not_before > time.monotonic():  # a pinned call honours a 429 too
                        await anyio.sleep(ep.not_before - time.monotonic())
                    ep.add_in_flight(1)
                else:
                    try:
                        ep = await self._acquire(model, tried, group, need)
                    except TimeoutError:
                        errors.append(f"no endpoint up after {self.cfg.wait_for_endpoint_s}s")
                        raise fail(NoEndpointUp, "found no endpoint") from None
                attempts, last_ep = attempt + 1, ep.name
                tried.add(ep.name)
                if model is not None:
                    ep.model_in_flight[model] += 1
                load_before = ep.in_flight
                sent = time.monotonic()
                try:
                    body = await self._post_once(ep, path, payload,
                                                 ep.attempt_timeout(work, self.cfg.timeout_margin))
                    result = body if parse is None else _parse_or_retry(parse, body, ep.name)
                except _Retryable as exc:
                    last = exc
                    errors.append(f"{ep.name}: {exc.reason}")
                    if exc.status == 429:  # up but rate-limited: no requests here until then
                        wait = min(self.cfg.retry_after_max_s,
                                   exc.retry_after if exc.retry_after is not None
                                   else self._backoff(attempt))
                        ep.not_before = time.monotonic() + wait
                        log.info("rate_limited", endpoint=ep.name, path=path,
                                 attempt=attempt + 1, retry_after_s=round(wait, 2))
                        continue  # the next attempt waits in _acquire for a free endpoint
                    self._mark_failed(ep, exc.reason)
                    log.info("request_retry", endpoint=ep.name, path=path, attempt=attempt + 1,
                             reason=exc.reason)
                except EndpointRequestError as exc:
                    if exc.status == 404 and endpoint is None and (
                            model is None or model not in exc.detail):
                        # Not the model: the route itself is missing (a chat-only server
                        # asked for /v1/completions). No retry can help.
                        raise EndpointCapabilityError(
                            f"endpoint '{ep.name}' has no POST {path} (HTTP 404: "
                            f"{exc.detail}); `spade endpoints check` shows what it serves",
                            endpoint=ep.name, attempts=attempts,
                            elapsed_s=round(time.monotonic() - start, 3)) from None
                    if exc.status == 404 and model is not None and endpoint is None:
                        # The server no longer has the model (a restart lost an adapter the
                        # last listing showed): route again; with nobody serving it, that is
                        # ModelNotServed, which callers wait out.
                        ep.models = (ep.models or frozenset({model})) - {model}
                        errors.append(f"{ep.name}: HTTP 404: {exc.detail}")
                        continue
                    exc.attempts, exc.elapsed_s = attempts, round(time.monotonic() - start, 3)
                    raise
                except EndpointError as exc:
                    exc.attempts, exc.elapsed_s = attempts, round(time.monotonic() - start, 3)
                    raise
                else:
                    self._mark_up(ep)
                    if work is not None:
                        ep.speed.observe(time.monotonic() - sent,
                                         work.units(_completion_tokens(result)),
                                         (load_before + ep.in_flight) / 2)
                    return ep.name, result
                finally:
                    if model is not None:
                        ep.model_in_flight[model] -= 1
                    self._release(ep)
                if attempt + 1 < max_attempts:
                    await anyio.sleep(self._backoff(attempt))
        if scope.cancelled_caught:
            errors.append(f"deadline of {deadline_s:g}s passed")
            raise fail(EndpointDeadlineExceeded, "missed its deadline")
        if last is None:  # every attempt was a 404 for the model: nobody serves it now
            raise ModelNotServed(model or "?", sorted(set().union(
                *(e.models for e in self._endpoints if e.models is not None))))
        extra = {"status": last.status} if last.cls is EndpointServerError else {}
        raise fail(last.cls, "failed", **extra)

    def _backoff(self, attempt: int) -> float:
        cap = min(self.cfg.backoff_max_s, self.cfg.backoff_initial_s * 2**attempt)
        return cap * random.uniform(0.5, 1.0)

    async def _post_once(self, ep: _Endpoint, path: str, payload: dict[str, Any],
                         timeout_s: float) -> dict[str, Any]:
        try:
            with anyio.fail_after(timeout_s):
                resp = await ep.client.post(path, json=payload)
        except TimeoutError:
            raise _Retryable(EndpointTimeout, f"no answer within {timeout_s:.0f}s") from None
        except httpx.TransportError as exc:  # refused, reset, closed mid-body
            raise _Retryable(EndpointConnectionError, _describe(exc)) from None
        if resp.status_code == 429 or resp.status_code >= 500:
            raise _Retryable(EndpointServerError, f"HTTP {resp.status_code}: {_detail(resp)}",
                             resp.status_code, retry_after_s(resp.headers.get("retry-after")))
        if resp.status_code >= 400:
            raise EndpointRequestError(ep.name, resp.status_code, _detail(resp))
        if not resp.content:
            return {}
        try:
            body = resp.json()
        except ValueError:
            if "json" in resp.headers.get("content-type", ""):
                raise _Retryable(EndpointMalformedResponse,
                                 f"HTTP {resp.status_code} with a body that is not JSON: "
                                 f"{resp.text[:120]!r}") from None
            # vLLM's admin routes (load/unload_lora_adapter) answer 200 with plain text.
            return {"text": resp.text}
        return body if isinstance(body, dict) else {"data": body}

    async def chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        model: str,
        max_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
        deadline_s: float | None = None,
        extra: dict[str, Any] | None = None,
        token_level: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
        group: str | None = None,
    ) -> Completion:
        """One chat completion; `model` is the base name or a LoRA adapter's name.
        `token_level` asks for vLLM's ids and log-probs too (a hosted API may refuse those
        parameters: the text path leaves them out); `tools` are OpenAI function tools, whose
        calls come back in `Completion.tool_calls`."""
        payload: dict[str, Any] = {
            "model": model,
            "messages": list(messages),
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        if top_p != 1.0 or token_level:
            payload["top_p"] = top_p
        if token_level:
            payload.update(logprobs=True, return_token_ids=True)
        if seed is not None:
            payload["seed"] = seed
        if stop:
            payload["stop"] = list(stop)
        if tools:
            payload["tools"] = list(tools)
        if extra:
            payload.update(extra)
        start = time.perf_counter()
        chars = sum(len(str(m.get("content") or "")) for m in messages)
        _, out = await self.post(
            "/v1/chat/completions", payload, model=model, deadline_s=deadline_s,
            work=Work(chars // 4, max_tokens),  # ~4 characters a token, for sizing only
            group=group, need=None if token_level else "chat",
            parse=lambda body, name: _parse_chat(body, name, model,
                                                 time.perf_counter() - start))
        return out

    async def complete(
        self,
        prompt_ids: Sequence[int],
        *,
        model: str,
        max_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        deadline_s: float | None = None,
        extra: dict[str, Any] | None = None,
        group: str | None = None,
    ) -> Completion:
        """A completion continuing exactly `prompt_ids` (no server-side re-tokenization): the
        token-exact path for multi-turn episodes. Returns sampled ids and their log-probs.
        Only endpoints (of `group`) that have the tokens path take it."""
        payload: dict[str, Any] = {
            "model": model,
            "prompt": [int(t) for t in prompt_ids],
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "logprobs": 0,
            "return_token_ids": True,
        }
        if seed is not None:
            payload["seed"] = seed
        if extra:
            payload.update(extra)
        start = time.perf_counter()
        _, out = await self.post(
            "/v1/completions", payload, model=model, deadline_s=deadline_s,
            work=Work(len(prompt_ids), max_tokens), group=group, need="tokens",
            parse=lambda body, name: _parse_completion(body, name, model,
                                                       time.perf_counter() - start, prompt_ids))
        return out


def _parse_or_retry(parse: Callable[[dict[str, Any], str], Any], body: dict[str, Any],
                    endpoint: str) -> Any:
    try:
        return parse(body, endpoint)
    except _Malformed as exc:
        raise _Retryable(EndpointMalformedResponse, str(exc)) from None


def _completion_tokens(result: Any) -> int | None:
    return result.completion_tokens if isinstance(result, Completion) else None


def _parse_completion(body: dict[str, Any], endpoint: str, model: str, latency: float,
                      prompt_ids: Sequence[int]) -> Completion:
    try:
        choice = body["choices"][0]
        token_ids = tuple(int(t) for t in choice.get("token_ids") or ())
        logprobs = tuple(float(x) for x in ((choice.get("logprobs") or {}).get("token_logprobs")
                                            or ()))
        served_prompt = tuple(int(t) for t in choice.get("prompt_token_ids") or prompt_ids)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise _Malformed(f"a malformed completion ({exc!r}): {str(body)[:200]}") from None
    if not token_ids and choice.get("text"):
        raise EndpointCapabilityError(
            f"endpoint '{endpoint}' returned no token ids: it must support vLLM's "
            "`return_token_ids` for token-exact training", endpoint=endpoint)
    if len(token_ids) != len(logprobs):
        raise EndpointCapabilityError(
            f"endpoint '{endpoint}' returned {len(token_ids)} token ids but {len(logprobs)} "
            "log-probs", endpoint=endpoint)
    return Completion(
        text=choice.get("text") or "",
        token_ids=token_ids,
        logprobs=logprobs,
        prompt_token_ids=served_prompt,
        finish_reason=choice.get("finish_reason"),
        model=body.get("model", model),
        endpoint=endpoint,
        latency_s=latency,
        usage={k: int(v) for k, v in (body.get("usage") or {}).items() if isinstance(v, int)},
    )


def _parse_chat(body: dict[str, Any], endpoint: str, model: str, latency: float) -> Completion:
    try:
        choice = body["choices"][0]
        text = choice["message"].get("content") or ""
        content = (choice.get("logprobs") or {}).get("content") or []
        logprobs = tuple(float(t["logprob"]) for t in content)
        token_ids = tuple(int(t) for t in choice.get("token_ids") or ())
        prompt_ids = tuple(int(t) for t in body.get("prompt_token_ids") or ())
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise _Malformed(f"a malformed chat completion ({exc!r}): {str(body)[:200]}") from None
    if token_ids and logprobs and len(token_ids) != len(logprobs):
        raise EndpointCapabilityError(
            f"endpoint '{endpoint}' returned {len(token_ids)} token ids but {len(logprobs)} "
            "log-probs", endpoint=endpoint)
    calls = []
    for call in choice["message"].get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        fn = call.get("function") or {}
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except ValueError:
                args = {"_unparsed": args}
        calls.append({"id": call.get("id") or f"call_{len(calls)}", "name": fn.get("name"),
                      "arguments": args if isinstance(args, dict) else {}})
    return Completion(
        tool_calls=tuple(calls), path="chat",
        text=text,
        token_ids=token_ids,
        logprobs=logprobs,
        prompt_token_ids=prompt_ids,
        finish_reason=choice.get("finish_reason"),
        model=body.get("model", model),
        endpoint=endpoint,
        latency_s=latency,
        usage={k: int(v) for k, v in (body.get("usage") or {}).items() if isinstance(v, int)},
    )


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:300] or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message", body)))
        if isinstance(err, dict):
            err = err.get("message", err)
        return str(err)[:300]
    return str(body)[:300]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}: {_detail(exc.response)}"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"
