"""Which endpoint takes a request: slots, least-loaded routing, up/down state, back-pressure.

Routes each request to the up endpoint with the fewest in-flight requests relative to its
`max_concurrency`, never above it, preferring one not tried yet. Consecutive failures take an
endpoint out of rotation; a half-open try after `health_interval_s` (or the health loop) brings
it back. While endpoints are up but every slot is taken, a request queues: that is
back-pressure, counted by `busy`, not an outage.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable

import anyio

from spade_async.core.config import PoolConfig
from spade_async.core.logs import get_logger
from spade_async.inference.endpoint import Endpoint
from spade_async.inference.errors import EndpointCapabilityError, EndpointError, ModelNotServed

log = get_logger("pool")


class Router:
    """The pool's endpoints and their slots; `acquire` a slot, `release` it when done."""

    def __init__(self, endpoints: list[Endpoint], cfg: PoolConfig) -> None:
        self.endpoints = endpoints
        self.cfg = cfg
        self._changed = anyio.Event()
        # Requests queued in `acquire` for a slot, by the group they asked for (None: any).
        self._waiting: Counter[str | None] = Counter()

    @property
    def names(self) -> list[str]:
        return [ep.name for ep in self.endpoints]

    def get(self, name: str) -> Endpoint:
        for ep in self.endpoints:
            if ep.name == name:
                return ep
        raise EndpointError(f"no endpoint named '{name}' (have {self.names})")

    def capacity(self, group: str | None = None) -> int:
        return sum(ep.cfg.max_concurrency for ep in self.endpoints
                   if group is None or ep.cfg.group == group)

    def busy(self, group: str | None = None) -> int:
        in_flight = sum(ep.in_flight for ep in self.endpoints
                        if group is None or ep.cfg.group == group)
        waiting = (sum(self._waiting.values()) if group is None
                   else self._waiting[group] + self._waiting[None])
        return in_flight + waiting

    # ---- up and down -----------------------------------------------------------------------

    def mark_up(self, ep: Endpoint, models: frozenset[str] | None = None) -> None:
        if not ep.up:
            log.info("endpoint_up", endpoint=ep.name)
        ep.up, ep.failures = True, 0
        if models is not None:
            ep.models = models
        self.notify()

    def mark_failed(self, ep: Endpoint, reason: str, *, force_down: bool = False) -> None:
        ep.failures += 1
        ep.last_failure = time.monotonic()
        if ep.up and (force_down or ep.failures >= self.cfg.down_after_failures):
            ep.up, ep.reprobe = False, True
            log.warning("endpoint_down", endpoint=ep.name, reason=reason, failures=ep.failures)

    def notify(self) -> None:
        """Wake the requests waiting for a slot: something they wait on changed."""
        self._changed.set()
        self._changed = anyio.Event()

    def note_model(self, ep: Endpoint, model: str, *, served: bool) -> None:
        if ep.models is not None:
            ep.models = ep.models | {model} if served else ep.models - {model}
            self.notify()

    def serves(self, model: str) -> list[str]:
        return [ep.name for ep in self.endpoints if ep.models is not None and model in ep.models]

    # ---- slots -----------------------------------------------------------------------------

    def _eligible(self, ep: Endpoint, model: str | None, now: float,
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

    def _unable(self, group: str | None, need: str | None) -> EndpointCapabilityError | None:
        """The error to raise when every endpoint of `group` is known to lack `need`."""
        if need is None:
            return None
        members = [ep for ep in self.endpoints if group is None or ep.cfg.group == group]
        if not members or any(ep.caps is None or ep.caps.supports(need) for ep in members):
            return None
        lacks = "; ".join(f"endpoint '{ep.name}' lacks " + ", ".join(ep.caps.missing(need))
                          for ep in members if ep.caps is not None)
        where = f"group '{group}'" if group is not None else "the pool"
        return EndpointCapabilityError(f"no endpoint of {where} can take the {need} path: "
                                       f"{lacks}", endpoint=members[0].name)

    async def acquire(self, model: str | None, exclude: set[str], group: str | None = None,
                      need: str | None = None, *,
                      refresh_models: Callable[[float], Awaitable[None]],
                      prefer: str | None = None) -> Endpoint:
        """A slot on an endpoint of `group` (None: any) that serves `model` and has the
        capabilities of path `need` ("tokens" or "chat"; unknown until probed counts as
        having them). Raises TimeoutError after `wait_for_endpoint_s` without any endpoint
        up, EndpointCapabilityError at once when every endpoint of the group is known to
        lack the path; while endpoints are up but every slot is taken (or rate-limited) the
        request queues (that is back-pressure, not an outage: the request deadline, if any,
        bounds it). When no endpoint up lists `model`, `refresh_models(asked_at)` re-lists
        them once before the request fails with ModelNotServed. `prefer` (an episode's
        endpoint so far) is taken whenever it is eligible and not excluded, so a multi-turn
        episode stays on one server and reuses its prefix cache; otherwise the least loaded."""
        asked_at = time.monotonic()
        give_up_at = asked_at + self.cfg.wait_for_endpoint_s
        refreshed = False
        while True:
            now = time.monotonic()
            unable = self._unable(group, need)
            if unable is not None:
                raise unable
            candidates = [ep for ep in self.endpoints
                          if self._eligible(ep, model, now, group, need)]
            preferred = [ep for ep in candidates if ep.name not in exclude] or candidates
            if preferred:
                sticky = [e for e in preferred if e.name == prefer and e.up]
                ep = sticky[0] if sticky else min(
                    preferred, key=lambda e: (not e.up, e.load(), e.in_flight))
                ep.add_in_flight(1)
                return ep
            up = [ep for ep in self.endpoints if ep.up
                  and (group is None or ep.cfg.group == group)]
            if model is not None and up and all(
                ep.models is not None and model not in ep.models for ep in up
            ):
                if not refreshed:  # the lists may be older than the model
                    refreshed = True
                    await refresh_models(asked_at)
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

    async def acquire_pinned(self, name: str) -> Endpoint:
        """A slot on endpoint `name` whatever its load or state (an admin call), once a 429's
        back-off there has passed: a pinned call honours a 429 too."""
        ep = self.get(name)
        if ep.not_before > time.monotonic():
            await anyio.sleep(ep.not_before - time.monotonic())
        ep.add_in_flight(1)
        return ep

    def release(self, ep: Endpoint) -> None:
        ep.add_in_flight(-1)
        self.notify()
