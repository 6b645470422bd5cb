"""Publishing version N: push the saved weights into every endpoint through its backend, then
record the version where the daemon reads it (`<data_dir>/weights/current.json`).

Runs on the trainer's rank 0 only. The endpoint pool and swappers live on one event loop in a
background thread (an anyio blocking portal), so the LoRA swapper's bookkeeping of loaded
adapters and the HTTP connections survive from one publish to the next. Every HTTP call has
the endpoint's deadline and every swap attempt `publish_timeout_s`; a failed endpoint is
retried `publish_attempts` times, logged each time, and reported in `PublishError`: the
version is then not recorded, and the trainer tries again later. `current.json` moves only
once every endpoint serves the version.

The vllm-nccl endpoints form one NCCL group (trainer/swap/nccl.py `NcclGroup`), pushed as one
unit: a collective cannot leave a member out. When every publishing endpoint is vllm-nccl,
`publishes_files` is False and the trainer writes no weight files for a version (the weights
travel from its memory); its own checkpoints are unchanged.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from anyio.from_thread import start_blocking_portal

from spade_async.core.config import EndpointConfig, SpadeConfig, VllmNcclSwap
from spade_async.core.config.trainer import TrainerConfig
from spade_async.core.logs import get_logger
from spade_async.core.policy import current_version, version_dir, weights_dir, write_current
from spade_async.inference.errors import EndpointError
from spade_async.inference.pool import EndpointPool
from trainer.swap.base import WeightSwapper
from trainer.swap.factory import make_swapper
from trainer.swap.lora import LoraSwapper
from trainer.swap.nccl import NcclGroup, NcclSwapper
from trainer.swap.none import NoSwapper
from trainer.versions import prune_versions

log = get_logger("trainer.publish")


class PublishError(RuntimeError):
    """Some endpoint does not serve the version; `failures` maps endpoint -> last error."""

    def __init__(self, version: int, failures: dict[str, str]) -> None:
        detail = "; ".join(f"{name}: {why}" for name, why in sorted(failures.items()))
        super().__init__(f"version {version} not published: {detail}")
        self.version, self.failures = version, failures


class PublishConfigError(ValueError):
    """Endpoints and trainer mode that cannot work together."""


@dataclass(frozen=True)
class PublishReport:
    version: int
    model: str
    seconds: float  # publish() call -> current.json written
    swap_seconds: dict[str, float]
    attempts: dict[str, int] = field(default_factory=dict)


def artifact_kind(cfg: SpadeConfig, tcfg: TrainerConfig) -> str:
    """'adapter' (vllm-lora endpoints) or 'full' (vllm-reload / vllm-nccl); raises when the
    endpoints cannot share one model name or cannot take what this mode trains."""
    kinds = {e.weight_swap.type for e in cfg.endpoints} - {"none"}
    if not kinds:
        raise PublishConfigError(
            "publishing is on (trainer.publish_every_steps > 0) but no endpoint has a "
            "weight_swap backend other than 'none'")
    if "vllm-lora" in kinds and len(kinds) > 1:
        raise PublishConfigError(
            f"endpoints mix weight_swap types {sorted(kinds)}: vllm-lora serves "
            "'<served>-vN', the others the served name, and the daemon sends one model name")
    if "vllm-lora" in kinds:
        if tcfg.mode == "full":
            raise PublishConfigError("trainer.mode = 'full' cannot publish to vllm-lora "
                                     "endpoints; use vllm-reload or vllm-nccl")
        return "adapter"
    return "full"


def publishes_files(cfg: SpadeConfig) -> bool:
    """Whether a version needs its weight files: some publishing endpoint loads them from disk
    (vllm-reload, vllm-lora). Only vllm-nccl endpoints: no, the weights go over NCCL."""
    kinds = {e.weight_swap.type for e in cfg.endpoints} - {"none"}
    return kinds != {"vllm-nccl"}


# The settings one group has once: every vllm-nccl endpoint must give the same values.
_GROUP_KEYS = ("master_address", "port_range", "bucket_bytes", "bucket_buffers")


def nccl_group_swap(cfg: SpadeConfig) -> VllmNcclSwap | None:
    """The weight_swap settings of the one NCCL group over every vllm-nccl endpoint (the
    longest timeout_s of theirs); PublishConfigError names the endpoints that disagree on a
    setting the group has once."""
    members = [e for e in cfg.endpoints if isinstance(e.weight_swap, VllmNcclSwap)]
    if not members:
        return None
    for key in _GROUP_KEYS:
        values = {e.name: getattr(e.weight_swap, key) for e in members}
        if len({repr(v) for v in values.values()}) > 1:
            raise PublishConfigError(
                f"the vllm-nccl endpoints form one NCCL group, which has one weight_swap.{key}, "
                f"but they set {', '.join(f'{n}: {v}' for n, v in values.items())}")
    first = members[0].weight_swap
    return first.model_copy(update={"timeout_s": max(e.weight_swap.timeout_s for e in members)})


class Publisher:
    """`with Publisher(cfg, tcfg) as pub: pub.publish(version, path)` (rank 0)."""

    def __init__(self, cfg: SpadeConfig, tcfg: TrainerConfig, *,
                 transfer: Callable[[list[EndpointConfig]], Any] | None = None,
                 server_version_check: Callable[[str, str], None] | None = None) -> None:
        """`transfer(endpoints)` builds the trainer's side of the one NCCL group over the
        vllm-nccl endpoints (trainer/nccl_transfer.py); `server_version_check(version,
        endpoint)` raises when a vllm-nccl server's vLLM is not the trainer's."""
        self.cfg, self.tcfg = cfg, tcfg
        self.lineage: str | None = None  # the trainer's checkpoint lineage, into current.json
        self.kind = artifact_kind(cfg, tcfg)
        self.data_dir = cfg.paths.data_dir
        self.root = weights_dir(self.data_dir)
        self.endpoints = [e for e in cfg.endpoints if e.weight_swap.type != "none"]
        self.nccl = [e for e in self.endpoints if e.weight_swap.type == "vllm-nccl"]
        self.needs_transfer = bool(self.nccl)
        self.writes_files = publishes_files(cfg)
        nccl_group_swap(cfg)  # endpoints that cannot share one group: refused here
        self._make_transfer = transfer
        self._version_check = server_version_check
        self.transfer: Any = None
        self.group: NcclGroup | None = None
        self.swappers: dict[str, WeightSwapper] = {}
        self._stack = contextlib.ExitStack()

    # ---- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> Publisher:
        self.root.mkdir(parents=True, exist_ok=True)
        self.portal = self._stack.enter_context(start_blocking_portal())
        try:
            self.pool = EndpointPool(self.endpoints, self.cfg.pool)
            self._stack.callback(self.portal.call, self.pool.aclose)
            served = self.cfg.model.served_name
            for e in self.endpoints:
                self.swappers[e.name] = make_swapper(self.pool, e.name, served,
                                                     self.cfg.model.adapter_prefix)
            members = [s for s in self.swappers.values() if isinstance(s, NcclSwapper)]
            if members and self._make_transfer is not None:
                self.transfer = self._make_transfer(self.nccl)
                self.group = NcclGroup(members, self.transfer)
            if self._version_check is not None and self.nccl:
                self.portal.call(self._check_versions)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    async def _check_versions(self) -> None:
        """Each vllm-nccl server's vLLM must be the trainer's (one wire format); a server not
        up yet is checked when it is (the publish's own errors then say what is wrong)."""
        assert self._version_check is not None
        for health in await self.pool.check():
            caps = health.capabilities
            if self.group is None or health.name not in self.group.names or caps is None:
                continue
            if caps.server.startswith("vLLM "):
                self._version_check(caps.server.removeprefix("vLLM "), health.name)

    def set_weights(self, state: dict[str, Any], version: int | None = None) -> None:
        """The full weights of `version`, to send next to the NCCL group."""
        if self.transfer is not None:
            self.transfer.set_weights(state, version)

    # ---- alternate phases --------------------------------------------------------------------

    def generation(self, on: bool) -> None:
        """`trainer.phases = "alternate"`: stop every swapping endpoint's generation while a
        step trains (vLLM's `/pause?mode=keep`: in-flight requests are frozen, not aborted)
        and start it again after (`/resume`). An endpoint that does not answer is logged and
        left: a server that is down generates nothing anyway, and one left paused by a crash
        is resumed when the trainer starts again."""
        route = "/resume" if on else "/pause?mode=keep"

        async def call_all() -> None:
            for name in self.swappers:
                try:
                    with anyio.fail_after(30):
                        await self.pool.post(route, {}, endpoint=name)
                except (EndpointError, TimeoutError) as exc:
                    log.warning("generation_switch_failed", endpoint=name, route=route,
                                error=str(exc)[:300])

        self.portal.call(call_all)

    # ---- state -------------------------------------------------------------------------------

    def model_name(self, version: int) -> str:
        names = {s.model_name(version) for s in self.swappers.values()}
        assert len(names) == 1, names  # guaranteed by artifact_kind
        return names.pop()

    def current(self) -> int:
        return current_version(self.data_dir)

    def adopt_server_state(self, version: int) -> None:
        """After a restart at `version`: LoRA swappers learn which of our adapters each server
        still holds (so they retire them in turn); adapters of later versions, which this
        lineage never published, are unloaded. Unreachable endpoints are logged and left to
        the next publish's retries."""
        for health in self.portal.call(self.pool.check):
            swapper = self.swappers[health.name]
            if not isinstance(swapper, LoraSwapper):
                continue
            if not health.up:
                log.warning("publish_endpoint_down_at_start", endpoint=health.name,
                            error=health.error)
                continue
            held = sorted(v for v in map(swapper.version_of, health.adapters) if v is not None)
            swapper.loaded = [v for v in held if v <= version]
            for v in (v for v in held if v > version):
                log.warning("adapter_from_other_lineage_unloaded", endpoint=health.name,
                            version=v, trainer_version=version)
                swapper.loaded.append(v)
                self.portal.call(swapper.retire, v)

    def restore_lost(self, version: int) -> list[str]:
        """Endpoints that are up but no longer serve `version` get it pushed again: a
        restarted server comes back with the base weights and no adapters, and the daemon's
        requests for `policy-vN` (or samples labelled N) would otherwise fail (or lie). Returns
        the endpoints restored; one that fails is logged and tried at the next check."""
        if version == 0:
            return []
        path = version_dir(self.data_dir, version)
        restored: list[str] = []
        lost_nccl: list[str] = []
        for health in self.portal.call(self.pool.check):
            swapper = self.swappers[health.name]
            if not health.up or isinstance(swapper, NoSwapper):
                continue
            if isinstance(swapper, LoraSwapper):
                if swapper.model_name(version) in health.adapters:
                    continue
                # What the server holds now is all it holds: forget what it lost.
                swapper.loaded = [v for v in swapper.loaded
                                  if swapper.model_name(v) in health.adapters]
            elif health.weight_version == str(version) and not (
                    isinstance(swapper, NcclSwapper) and swapper.held_paused):
                continue  # (a server held paused by a partial update needs the push)
            log.warning("endpoint_lost_version", endpoint=health.name, version=version,
                        adapters=list(health.adapters), weight_version=health.weight_version)
            if isinstance(swapper, NcclSwapper):
                lost_nccl.append(health.name)  # pushed below, with the whole group
                continue
            try:
                self.portal.call(self._swap_within_deadline, swapper, version, path)
            except (EndpointError, TimeoutError) as exc:
                log.error("restore_failed", endpoint=health.name, version=version,
                          error=str(exc) or type(exc).__name__)
                continue
            log.info("version_restored", endpoint=health.name, version=version)
            restored.append(health.name)
        if lost_nccl and self.group is not None:
            # A restarted server left the group for good: every member sets it up again and
            # receives the version (one collective reaches all of them).
            self.group.connected = False
            try:
                self.portal.call(self._group_within_deadline, version)
            except (EndpointError, TimeoutError) as exc:
                log.error("restore_failed", endpoints=lost_nccl, version=version,
                          error=str(exc) or type(exc).__name__)
            else:
                log.info("version_restored", endpoints=self.group.names, version=version)
                restored.extend(lost_nccl)
        return restored

    async def _group_within_deadline(self, version: int) -> None:
        assert self.group is not None
        with anyio.fail_after(self.tcfg.publish_timeout_s):
            await self.group.swap_all(version)

    async def _swap_within_deadline(self, swapper: WeightSwapper, version: int,
                                    path: Path) -> None:
        with anyio.fail_after(self.tcfg.publish_timeout_s):
            await swapper.swap(version, path)

    # ---- publish -----------------------------------------------------------------------------

    def publish(self, version: int, path: Path, *, started: float | None = None) -> PublishReport:
        """Blocking. Every endpoint serves `version` when this returns; then current.json
        names it. `started` (perf_counter) lets the caller time from the end of its step."""
        t0 = time.perf_counter() if started is None else started
        swap_s, attempts = self.portal.call(self._push_all, version, path)
        model = self.model_name(version)
        write_current(self.data_dir, {
            "version": version, "model": model,
            "path": str(path) if Path(path).is_dir() else None,  # None: only NCCL publishes
            "endpoints": sorted(swap_s), "published_at": time.time(),
            **({"lineage": self.lineage} if self.lineage else {})})
        report = PublishReport(version, model, time.perf_counter() - t0, swap_s, attempts)
        log.info("version_published", version=version, model=model,
                 seconds=round(report.seconds, 4), endpoints=swap_s)
        prune_versions(self.data_dir, self.tcfg.keep_versions, keep=version)
        return report

    async def _push_all(self, version: int, path: Path) -> tuple[dict[str, float], dict[str, int]]:
        swap_s: dict[str, float] = {}
        failures: dict[str, str] = {}
        attempts: dict[str, int] = {}

        async def push(name: str, swapper: WeightSwapper) -> None:
            for attempt in range(1, self.tcfg.publish_attempts + 1):
                attempts[name] = attempt
                try:
                    with anyio.fail_after(self.tcfg.publish_timeout_s):
                        result = await swapper.swap(version, path)
                except (EndpointError, TimeoutError) as exc:
                    failures[name] = str(exc) or f"no answer within {self.tcfg.publish_timeout_s}s"
                    log.warning("publish_attempt_failed", endpoint=name, version=version,
                                attempt=attempt, of=self.tcfg.publish_attempts,
                                error=failures[name])
                    if attempt < self.tcfg.publish_attempts:
                        await anyio.sleep(min(0.5 * 2 ** (attempt - 1), 10.0))
                    continue
                failures.pop(name, None)
                swap_s[name] = round(result.seconds, 4)
                return

        async def push_group(group: NcclGroup) -> None:
            """The vllm-nccl servers as one unit: a collective cannot leave a member out."""
            names = group.names
            for attempt in range(1, self.tcfg.publish_attempts + 1):
                attempts.update(dict.fromkeys(names, attempt))
                try:
                    with anyio.fail_after(self.tcfg.publish_timeout_s):
                        results = await group.swap_all(version)
                except (EndpointError, TimeoutError) as exc:
                    why = str(exc) or f"no answer within {self.tcfg.publish_timeout_s}s"
                    failures.update(dict.fromkeys(names, why))
                    log.warning("publish_attempt_failed", endpoint=",".join(names),
                                version=version, attempt=attempt,
                                of=self.tcfg.publish_attempts, error=why)
                    if attempt < self.tcfg.publish_attempts:
                        await anyio.sleep(min(0.5 * 2 ** (attempt - 1), 10.0))
                    continue
                for name, result in results.items():
                    failures.pop(name, None)
                    swap_s[name] = round(result.seconds, 4)
                return

        async with anyio.create_task_group() as tg:
            for name, swapper in self.swappers.items():
                if not isinstance(swapper, NcclSwapper):
                    tg.start_soon(push, name, swapper)
            if self.nccl:
                if self.group is None:  # no transfer: the swapper's own error names it
                    for e in self.nccl:
                        tg.start_soon(push, e.name, self.swappers[e.name])
                else:
                    tg.start_soon(push_group, self.group)
        if failures:
            raise PublishError(version, failures)
        return swap_s, attempts
