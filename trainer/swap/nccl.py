"""`vllm-nccl`: vLLM's NCCL weight-transfer routes (the HTTP control plane) for ONE group over
every vllm-nccl server. `NcclSwapper` speaks to one server; `NcclGroup` drives them all at once
around the trainer's data plane (trainer/nccl_transfer.py), because every member of an NCCL
collective must be inside it together: the init handshake and each `/update_weights` go to
all servers concurrently with the trainer's side, and one broadcast per bucket reaches them all.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import anyio
import httpx

from spade_async.core.logs import get_logger
from spade_async.inference.errors import (
    EndpointConnectionError,
    EndpointError,
    EndpointRequestError,
    EndpointUnavailable,
)
from spade_async.inference.pool import EndpointPool
from trainer.swap.base import SwapError, SwapResult, WedgedServer, WeightSwapper

log = get_logger("swap")


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


class WeightTransfer(Protocol):
    """The trainer's side of vLLM's NCCL weight transfer (blocking calls, run in a thread).

    `rendezvous(world_size)` gives the init info every server gets (the group adds each
    server's `rank_offset`); `connect` joins the group as rank 0 and returns only when every
    server's workers have joined too (inside `/init_weight_transfer_engine`); `send`
    broadcasts the tensors `update_info` announced, bucket by bucket, and returns when the
    workers have received them (inside `/update_weights`). `version` is the version whose
    weights it holds (None: unknown)."""

    version: int | None

    def rendezvous(self, world_size: int) -> dict[str, Any]: ...
    def connect(self) -> None: ...
    def update_info(self) -> dict[str, Any]: ...
    def send(self) -> None: ...
    def close(self) -> None: ...


class NcclGroupError(SwapError):
    """Some members of the group failed a step; `failed` maps endpoint -> what went wrong
    ('trainer' for the trainer's own side)."""

    def __init__(self, step: str, failed: dict[str, str]) -> None:
        detail = "; ".join(f"{name}: {why}" for name, why in failed.items())
        super().__init__(f"NCCL group {step} failed: {detail}")
        self.step, self.failed = step, failed


class NcclSwapper(WeightSwapper):
    """One `vllm-nccl` server (started with `--weight-transfer-config '{"backend": "nccl"}'`
    in dev mode): its control-plane calls and its state in the group. It cannot be swapped
    alone: `swap` swaps the whole group it belongs to (a collective needs every member)."""

    COLLECTIVE = ("/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
                  "/finish_weight_update")

    def __init__(self, pool: EndpointPool, endpoint: str, served_name: str,
                 timeout_s: float = 120.0) -> None:
        super().__init__(pool, endpoint, served_name)
        self.timeout_s = timeout_s
        self.group: NcclGroup | None = None
        self.connected = False  # its workers are in the group
        self.held_paused = False  # a partial update: the server must not serve until fixed

    def attach(self, transfer: WeightTransfer) -> NcclGroup:
        """A group of this server alone (the Publisher builds one over all of them)."""
        return NcclGroup([self], transfer)

    def model_name(self, version: int) -> str:
        return self.served_name

    async def swap(self, version: int, path: Path | None = None) -> SwapResult:
        """The whole group swaps (`path` is not read: the weights travel over NCCL from the
        trainer's memory, and may have no files at all)."""
        if self.group is None:
            raise SwapError(f"{self.endpoint}: vllm-nccl needs the trainer's weight transfer "
                            "(only the trainer process, which holds the weights on GPU, can "
                            "publish through it)")
        return (await self.group.swap_all(version))[self.endpoint]

    async def _swap(self, version: int, path: Path) -> None:
        await self.swap(version, path)

    async def nccl_post(self, path: str, payload: dict, *, deadline_s: float | None = None
                        ) -> dict:
        once = path in self.COLLECTIVE
        return (await self.pool.post(path, payload, endpoint=self.endpoint,
                                     deadline_s=deadline_s or self.timeout_s,
                                     attempts=1 if once else None))[1]

    async def world_size(self) -> int:
        cfg = self.pool.config(self.endpoint)
        try:
            with anyio.fail_after(min(self.timeout_s, cfg.request_timeout_s)):
                async with httpx.AsyncClient(base_url=cfg.base_url.rstrip("/"),
                                             headers=cfg.request_headers(),
                                             timeout=cfg.request_timeout_s) as client:
                    resp = await client.get("/get_world_size", params={"include_dp": "true"})
        except (httpx.HTTPError, TimeoutError) as exc:
            raise SwapError(f"GET /get_world_size failed: {type(exc).__name__}: {exc}") from None
        if resp.status_code != 200:
            raise SwapError(f"GET /get_world_size answered HTTP {resp.status_code}: "
                            f"{resp.text[:200]}")
        return int(resp.json()["world_size"])

    async def end_session(self) -> None:
        """After a failure inside a session: end it so the next `/start_weight_update` can
        run. The server answers quickly unless its workers are stuck in the broadcast; an
        answer saying there is no session (a failed update already ended it) is fine."""
        try:
            await self.nccl_post("/finish_weight_update", {},
                                 deadline_s=min(30.0, self.timeout_s))
        except EndpointRequestError:
            return  # 4xx: no session open
        except EndpointConnectionError as exc:  # gone, not stuck: restore_lost brings it back
            log.warning("nccl_server_gone", endpoint=self.endpoint, error=str(exc))
            return
        except EndpointUnavailable as exc:
            if getattr(exc, "status", 0) >= 500:
                return  # vLLM 0.32 answers 500 for "finish ... without a matching start"
            raise WedgedServer(
                f"{self.endpoint}: its workers are stuck in the NCCL broadcast (the session "
                f"did not end: {exc}); restart that inference server, then the next publish "
                "sets the group up again") from None


class NcclGroup:
    """One NCCL group: the trainer at rank 0 and every member server's workers after it
    (`trainer.nccl_transfer.group_layout`).

    Once (and again after any failure): `GET /get_world_size` of every server, then
    `/init_weight_transfer_engine` to all of them concurrently with the trainer's rendezvous.
    Per version, on every server at once: `/pause?mode=keep`, `/start_weight_update`,
    `/update_weights` (all concurrently with the trainer's packed broadcasts),
    `/finish_weight_update` (which also records the version), `/reset_prefix_cache`, `/resume`.

    Failures (vLLM 0.32's worker rules: one update session at a time; a failed
    `update_weights` ends its session; the engine cannot shut down during a session):
    - the collective and session calls are sent once, never retried (a duplicate
      `/update_weights` would wait for a broadcast that never comes); every step has
      `timeout_s`; a collective step fails for all as soon as one member fails it;
    - a server whose session was open has it ended; one that may have received tensors (it
      was inside `/update_weights` and did not finish) stays PAUSED, its weights part old,
      part new, until a publish completes; the others resume on their weights;
    - then the group is torn down on every server and on the trainer; the next swap sets it
      up again, with every server (one that restarted has left the group for good);
    - a server that does not answer the session's end is stuck in the collective: it is
      reported as wedged (WedgedServer), with the one remedy, a restart.
    """

    def __init__(self, members: list[NcclSwapper], transfer: WeightTransfer) -> None:
        self.members, self.transfer = members, transfer
        self.timeout_s = max(m.timeout_s for m in members)
        self.connected = False
        self.layout: dict[str, tuple[int, int]] = {}  # endpoint -> (rank_offset, world size)
        for m in members:
            m.group = self

    @property
    def names(self) -> list[str]:
        return [m.endpoint for m in self.members]

    async def swap_all(self, version: int) -> dict[str, SwapResult]:
        """Every member serves `version` when this returns (the weights the transfer holds)."""
        held = self.transfer.version
        if held != version:
            what = "no weights" if held is None else f"version {held}'s weights"
            raise SwapError(f"{', '.join(self.names)}: the trainer holds {what}, not version "
                            f"{version}'s (the NCCL group sends what the trainer holds; the "
                            "next publish sends its own version)")
        start = time.perf_counter()
        stage: dict[str, str] = {}  # endpoint -> the last step begun on it
        done: set[str] = set()  # finished: the server serves `version`
        try:
            if not self.connected:
                await self._connect()
            await self._each("pause", lambda m: m._post("/pause?mode=keep", {}), stage)
            await self._each("start", lambda m: m.nccl_post("/start_weight_update", {}),
                             stage)
            try:
                payload = {"update_info": self.transfer.update_info()}
            except Exception as exc:
                raise NcclGroupError("update", {"trainer": f"describing the weights failed: "
                                                f"{type(exc).__name__}: {exc}"}) from exc
            # from here tensors may land: the old weights are gone
            await self._collective("update", "/update_weights",
                                   {m.endpoint: payload for m in self.members},
                                   self.transfer.send, stage)

            async def finish(m: NcclSwapper) -> None:
                await m.nccl_post("/finish_weight_update", {"weight_version": str(version)})
                done.add(m.endpoint)
                m.held_paused = False

            await self._each("finish", finish, stage)
            await self._each("reset_prefix_cache",
                             lambda m: m._post("/reset_prefix_cache", {}), stage)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._recover(stage, done, exc)
            raise
        finally:
            with anyio.move_on_after(30, shield=True):
                await self._resume([m for m in self.members
                                    if m.endpoint in stage and not m.held_paused])
        seconds = time.perf_counter() - start
        results = {}
        for m in self.members:
            m.version = version
            results[m.endpoint] = SwapResult(m.endpoint, version, m.model_name(version),
                                             seconds)
        log.info("nccl_group_swapped", endpoints=self.names, version=version,
                 seconds=round(seconds, 4), layout=self.layout,
                 broadcasts=getattr(self.transfer, "broadcasts", None))
        return results

    # ---- steps -------------------------------------------------------------------------------

    async def _each(self, step: str, call: Callable[[NcclSwapper], Awaitable[Any]],
                    stage: dict[str, str]) -> None:
        """`call` on every member concurrently; each one's outcome is waited for, then the
        failures (naming their servers) are raised together."""
        failed: dict[str, str] = {}

        async def one(m: NcclSwapper) -> None:
            stage[m.endpoint] = step
            try:
                with anyio.fail_after(self.timeout_s):
                    await call(m)
            except (EndpointError, TimeoutError) as exc:
                failed[m.endpoint] = str(exc) or f"no answer within {self.timeout_s}s"

        async with anyio.create_task_group() as tg:
            for m in self.members:
                tg.start_soon(one, m)
        if failed:
            raise NcclGroupError(step, failed)

    async def _collective(self, step: str, call: str, payloads: dict[str, dict],
                          work: Callable[[], Any], stage: dict[str, str]) -> None:
        """POST `call` to every member while `work` (the trainer's side) runs in a thread:
        all of them meet inside one NCCL collective. The first failure, on any side, fails
        the step for all (the others would wait for it in NCCL): the rest are cancelled (a
        thread stuck in NCCL is abandoned until `close` aborts its group)."""
        waiting = set(payloads)
        failed: dict[str, str] = {}

        async def server_side(m: NcclSwapper) -> None:
            stage[m.endpoint] = step
            try:
                await m.nccl_post(call, payloads[m.endpoint])
            except EndpointError as exc:
                failed[m.endpoint] = f"{call} failed: {exc}"
                raise
            waiting.discard(m.endpoint)

        async def trainer_side() -> None:
            try:
                with anyio.fail_after(self.timeout_s):
                    await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
            except TimeoutError:
                still = ", ".join(sorted(waiting)) or "none"
                failed["trainer"] = (f"its side of {call} did not finish within "
                                     f"{self.timeout_s}s (servers still inside it: {still})")
                raise
            except Exception as exc:
                failed["trainer"] = f"its side of {call} failed: {type(exc).__name__}: {exc}"
                raise

        try:
            async with anyio.create_task_group() as tg:
                for m in self.members:
                    tg.start_soon(server_side, m)
                await trainer_side()
        except BaseExceptionGroup as group:
            cancelled = anyio.get_cancelled_exc_class()
            errors = [e for e in _leaves(group) if not isinstance(e, cancelled)]
            if not errors:
                raise
            raise NcclGroupError(step, failed or {"trainer": str(errors[0])}) from errors[0]

    async def _connect(self) -> None:
        from trainer.nccl_transfer import group_layout  # torch is only needed here

        stale = [m for m in self.members if m.connected]
        if stale:  # a member left (restarted): the rest still hold the old group, and so may we
            await self._teardown(stale)
        sizes: dict[str, int] = {}

        async def ask(m: NcclSwapper) -> None:
            sizes[m.endpoint] = await m.world_size()

        await self._each("handshake (GET /get_world_size)", ask, {})
        offsets, world = group_layout([sizes[n] for n in self.names])
        self.layout = {n: (off, sizes[n]) for n, off in zip(self.names, offsets, strict=True)}
        info = self.transfer.rendezvous(world)
        payloads = {n: {"init_info": {**info, "rank_offset": off}}
                    for n, (off, _) in self.layout.items()}
        log.info("nccl_group_rendezvous", world_size=world, layout=self.layout,
                 master=f"{info.get('master_address')}:{info.get('master_port')}")
        try:
            await self._collective("handshake", "/init_weight_transfer_engine", payloads,
                                   self.transfer.connect, {})
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._teardown(self.members)  # any server that joined leaves again
            raise
        self.connected = True
        for m in self.members:
            m.connected = True

    async def _resume(self, members: list[NcclSwapper]) -> None:
        async def one(m: NcclSwapper) -> None:
            try:
                await m._post("/resume", {})
            except EndpointError as exc:
                log.warning("nccl_resume_failed", endpoint=m.endpoint, error=str(exc))

        async with anyio.create_task_group() as tg:
            for m in members:
                tg.start_soon(one, m)

    async def _teardown(self, members: list[NcclSwapper]) -> None:
        """Shielded and time-bounded: every server leaves the group, and the trainer too."""
        self.connected = False

        async def one(m: NcclSwapper) -> None:
            m.connected = False
            try:
                await m.nccl_post("/shutdown_weight_transfer_engine", {})
            except EndpointError as exc:
                log.warning("nccl_shutdown_failed", endpoint=m.endpoint, error=str(exc))

        with anyio.move_on_after(min(30.0, self.timeout_s), shield=True):
            async with anyio.create_task_group() as tg:
                for m in members:
                    tg.start_soon(one, m)
            await anyio.to_thread.run_sync(self.transfer.close)

    async def _recover(self, stage: dict[str, str], done: set[str],
                       exc: BaseException) -> None:
        """Each server's state after a failure (see the class docstring)."""
        wedged: list[WedgedServer] = []
        in_session = [m for m in self.members if m.endpoint not in done
                      and stage.get(m.endpoint) in ("start", "update", "finish")]

        async def end(m: NcclSwapper) -> None:
            try:
                with anyio.fail_after(min(40.0, self.timeout_s + 10)):
                    await m.end_session()
            except WedgedServer as w:
                wedged.append(w)
            except (EndpointError, TimeoutError) as other:
                log.warning("nccl_end_session_failed", endpoint=m.endpoint, error=str(other))

        async with anyio.create_task_group() as tg:
            for m in in_session:
                tg.start_soon(end, m)
        for m in in_session:
            if stage[m.endpoint] in ("update", "finish"):
                m.held_paused = True
                log.error("nccl_partial_update_server_held_paused", endpoint=m.endpoint,
                          error=str(exc) or type(exc).__name__,
                          remedy="the next publish replaces every weight and resumes it")
        for w in wedged:
            log.error("nccl_server_wedged", error=str(w))
        # A half-done transfer leaves the group unusable on every side; a thread still
        # blocked in a collective is released by `close` (which aborts the communicator).
        if self.connected:
            await self._teardown(self.members)
        if wedged:
            raise WedgedServer("; ".join(map(str, wedged))) from exc
