"""Async pool over OpenAI-compatible endpoints: routing, deadlines, retries, health.

Routes each request to the up endpoint with the fewest in-flight requests relative to its
`max_concurrency`, never above it; retries connect errors, timeouts, 429, 5xx and malformed
bodies with jittered exponential back-off (on another endpoint when one is free); a 4xx other
than 429 is the caller's mistake and is raised at once, with the server's message. Consecutive
failures take an endpoint out of rotation; the health loop (`run`) or a half-open retry after
`health_interval_s` brings it back.

This module holds the pool's public face and its retry loop; the parts live beside it:
`errors` (the error contract), `speed` (attempt timeouts), `endpoint` (one server, one
attempt), `routing` (slots and load), `health` (probes), `completions` (the two request
formats and their `Completion`). This module must never know the daemon.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import httpx
from anyio.abc import TaskStatus

from spade_async.core.config import EndpointConfig, PoolConfig
from spade_async.core.logs import get_logger
from spade_async.inference.capabilities import Capabilities
from spade_async.inference.completions import (
    Completion,
    chat_payload,
    completion_payload,
    parse_chat,
    parse_completion,
)
from spade_async.inference.endpoint import Endpoint, open_client
from spade_async.inference.errors import (
    EndpointCapabilityError,
    EndpointDeadlineExceeded,
    EndpointError,
    EndpointRequestError,
    EndpointServerError,
    EndpointUnavailable,
    ModelNotServed,
    NoEndpointUp,
    Retryable,
)
from spade_async.inference.health import EndpointHealth, HealthMonitor
from spade_async.inference.routing import Router
from spade_async.inference.speed import Work

log = get_logger("pool")


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
        self._router = Router([Endpoint(e, open_client(e, transport), self.cfg.speed_window)
                               for e in endpoints], self.cfg)
        self._health = HealthMonitor(self._router, self.cfg)

    # ---- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> EndpointPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        with anyio.move_on_after(5, shield=True):
            for ep in self._router.endpoints:
                await ep.client.aclose()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Health loop: probes every endpoint each `health_interval_s`; ready after the first
        pass (see `HealthMonitor.run`)."""
        await self._health.run(task_status=task_status)

    async def check(self, *, capabilities: bool = True) -> list[EndpointHealth]:
        """Probe all endpoints concurrently; updates their up/down state and served models,
        and (with `capabilities`) probes the capabilities of those not probed since they
        came up."""
        return await self._health.check(capabilities=capabilities)

    # ---- introspection ---------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return self._router.names

    def snapshot(self) -> list[dict[str, Any]]:
        """Per endpoint, for status: up or down, requests in flight against its limit."""
        return [ep.snapshot() for ep in self._router.endpoints]

    def capacity(self, group: str | None = None) -> int:
        """Requests the endpoints of `group` (None: all) take at once: the sum of their
        `max_concurrency`, up or not (an outage is waited out by the work itself)."""
        return self._router.capacity(group)

    def busy(self, group: str | None = None) -> int:
        """Requests of `group` (None: all) in flight or queued for a slot: what admission
        compares with `capacity`. Requests that asked for any group count everywhere."""
        return self._router.busy(group)

    def saturation_area(self, name: str) -> float:
        """Seconds-weighted saturation of endpoint `name` since the pool started: the integral
        of min(in flight, max_concurrency) / max_concurrency over time. The mean saturation of
        a window is the difference of two readings over the window's seconds (DESIGN §10)."""
        return self._router.get(name).area()

    def in_flight_for(self, name: str, model: str) -> int:
        """Requests in flight on endpoint `name` that asked for `model` (an adapter, say)."""
        return self._router.get(name).model_in_flight[model]

    def is_up(self, name: str) -> bool:
        return self._router.get(name).up

    def config(self, name: str) -> EndpointConfig:
        return self._router.get(name).cfg

    def capabilities(self, name: str) -> Capabilities | None:
        return self._router.get(name).caps

    def models_of(self, name: str) -> frozenset[str] | None:
        """The model ids endpoint `name` listed last (None: not probed yet)."""
        return self._router.get(name).models

    def group_endpoints(self, group: str) -> list[str]:
        return [ep.name for ep in self._router.endpoints if ep.cfg.group == group]

    def note_model(self, endpoint: str, model: str, *, served: bool) -> None:
        """A weight swap added or removed `model` on `endpoint` (before the next health probe)."""
        self._router.note_model(self._router.get(endpoint), model, served=served)

    def serves(self, model: str) -> list[str]:
        """Names of the endpoints known to serve `model` (base name or adapter)."""
        return self._router.serves(model)

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
        prefer: str | None = None,
    ) -> tuple[str, Any]:
        """POST with routing and retries; returns (endpoint name, JSON body or `parse(body,
        endpoint)`). `attempts` caps the tries (default `pool.max_attempts`): 1 for a call
        that must never be sent twice (an NCCL collective: a duplicate blocks for ever).

        `endpoint` pins the request to one server (admin calls such as loading an adapter);
        otherwise `model` restricts routing to servers that serve it, `group` to one endpoint
        group and `need` to servers with that path's capabilities; `prefer` names the
        server to stay on while it can take the request (sticky episodes). `work` sizes each
        attempt's timeout; `deadline_s` bounds the whole request, retries included. `parse`
        turns the body into the caller's result inside the attempt, so a malformed body is
        retried like any other transient failure.
        """
        errors: list[str] = []
        tried: set[str] = set()
        start = time.monotonic()
        last: Retryable | None = None
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
                    ep = await self._router.acquire_pinned(endpoint)
                else:
                    try:
                        ep = await self._router.acquire(
                            model, tried, group, need,
                            refresh_models=self._health.refresh_models, prefer=prefer)
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
                    body = await ep.post_once(path, payload,
                                              ep.attempt_timeout(work, self.cfg.timeout_margin))
                    result = body if parse is None else parse(body, ep.name)
                except Retryable as exc:
                    last = exc
                    errors.append(f"{ep.name}: {exc.reason}")
                    if exc.status == 429:  # up but rate-limited: no requests here until then
                        wait = min(self.cfg.retry_after_max_s,
                                   exc.retry_after if exc.retry_after is not None
                                   else self._backoff(attempt))
                        ep.not_before = time.monotonic() + wait
                        log.info("rate_limited", endpoint=ep.name, path=path,
                                 attempt=attempt + 1, retry_after_s=round(wait, 2))
                        continue  # the next attempt waits in acquire for a free endpoint
                    self._router.mark_failed(ep, exc.reason)
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
                    self._router.mark_up(ep)
                    if work is not None:
                        ep.speed.observe(time.monotonic() - sent,
                                         work.units(_completion_tokens(result)),
                                         (load_before + ep.in_flight) / 2)
                    return ep.name, result
                finally:
                    if model is not None:
                        ep.model_in_flight[model] -= 1
                    self._router.release(ep)
                if attempt + 1 < max_attempts:
                    await anyio.sleep(self._backoff(attempt))
        if scope.cancelled_caught:
            errors.append(f"deadline of {deadline_s:g}s passed")
            raise fail(EndpointDeadlineExceeded, "missed its deadline")
        if last is None:  # every attempt was a 404 for the model: nobody serves it now
            raise ModelNotServed(model or "?", sorted(set().union(
                *(e.models for e in self._router.endpoints if e.models is not None))))
        extra = {"status": last.status} if last.cls is EndpointServerError else {}
        raise fail(last.cls, "failed", **extra)

    def _backoff(self, attempt: int) -> float:
        cap = min(self.cfg.backoff_max_s, self.cfg.backoff_initial_s * 2**attempt)
        return cap * random.uniform(0.5, 1.0)

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
        prefer: str | None = None,
    ) -> Completion:
        """One chat completion; `model` is the base name or a LoRA adapter's name.
        `token_level` asks for vLLM's ids and log-probs too (a hosted API may refuse those
        parameters: the text path leaves them out); `tools` are OpenAI function tools, whose
        calls come back in `Completion.tool_calls`."""
        payload = chat_payload(messages, model=model, max_tokens=max_tokens,
                               temperature=temperature, top_p=top_p, seed=seed, stop=stop,
                               extra=extra, token_level=token_level, tools=tools)
        start = time.perf_counter()
        chars = sum(len(str(m.get("content") or "")) for m in messages)
        _, out = await self.post(
            "/v1/chat/completions", payload, model=model, deadline_s=deadline_s,
            work=Work(chars // 4, max_tokens),  # ~4 characters a token, for sizing only
            group=group, need=None if token_level else "chat", prefer=prefer,
            parse=lambda body, name: parse_chat(body, name, model,
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
        prefer: str | None = None,
    ) -> Completion:
        """A completion continuing exactly `prompt_ids` (no server-side re-tokenization): the
        token-exact path for multi-turn episodes. Returns sampled ids and their log-probs.
        Only endpoints (of `group`) that have the tokens path take it."""
        payload = completion_payload(prompt_ids, model=model, max_tokens=max_tokens,
                                     temperature=temperature, top_p=top_p, seed=seed,
                                     extra=extra)
        start = time.perf_counter()
        _, out = await self.post(
            "/v1/completions", payload, model=model, deadline_s=deadline_s,
            work=Work(len(prompt_ids), max_tokens), group=group, need="tokens", prefer=prefer,
            parse=lambda body, name: parse_completion(body, name, model,
                                                       time.perf_counter() - start, prompt_ids))
        return out


def _completion_tokens(result: Any) -> int | None:
    return result.completion_tokens if isinstance(result, Completion) else None
