"""`vllm-nccl`: vLLM's NCCL weight-transfer routes (the HTTP control plane); the data plane, the
NCCL group holding the trainer's GPU weights, is attached by the trainer (trainer/nccl_transfer.py).
"""

from __future__ import annotations

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
from trainer.swap.base import SwapError, WedgedServer, WeightSwapper

log = get_logger("swap")


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


class WeightTransfer(Protocol):
    """The trainer's side of vLLM's NCCL weight transfer (blocking calls, run in a thread).

    `connect` joins the trainer <-> inference-workers group as rank 0 and returns only when
    the workers have joined too (they do so inside `/init_weight_transfer_engine`); `send`
    broadcasts every tensor `update_info` announced, in that order, and returns when the
    workers have received them (inside `/update_weights`)."""

    def rendezvous(self, inference_world_size: int) -> dict[str, Any]: ...
    def connect(self) -> None: ...
    def update_info(self) -> dict[str, Any]: ...
    def send(self) -> None: ...
    def close(self) -> None: ...


class NcclSwapper(WeightSwapper):
    """`vllm-nccl`: vLLM's weight-transfer routes (server started with
    `--weight-transfer-config '{"backend": "nccl"}'` in dev mode), one NCCL group per endpoint.

    Once: `GET /get_world_size`, then `/init_weight_transfer_engine` concurrently with the
    trainer's rendezvous. Per version, inside `/pause?mode=keep` ... `/resume`:
    `/start_weight_update`, `/update_weights` concurrently with the broadcast,
    `/finish_weight_update` (which also records the version), `/reset_prefix_cache` (cached
    KV blocks were computed by the old weights). `path` (the version saved on disk) is checked
    to exist but not read: the weights travel over NCCL.

    Failures (vLLM 0.32's worker rules: one update session at a time; a failed
    `update_weights` ends its session; the engine cannot shut down during a session):
    - the collective and session calls (init, start, update, finish) are sent once, never
      retried: a duplicate `/update_weights` would wait for a broadcast that never comes;
      every step has `timeout_s`, on both sides;
    - a failure before any tensor could arrive ends the session (`/finish_weight_update`)
      and resumes the server: its weights are intact;
    - a failure once the broadcast began leaves the server PAUSED (its weights are part old,
      part new: it must not serve them) until the next publish completes;
    - then the group is torn down on both sides; the next swap sets it up again;
    - a server that does not answer the session's end is stuck in the collective: it is
      reported as wedged (WedgedServer), with the one remedy, a restart.
    """

    COLLECTIVE = ("/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
                  "/finish_weight_update")

    def __init__(self, pool: EndpointPool, endpoint: str, served_name: str,
                 timeout_s: float = 120.0, transfer: WeightTransfer | None = None) -> None:
        super().__init__(pool, endpoint, served_name)
        self.timeout_s = timeout_s
        self.transfer = transfer
        self.connected = False
        self.held_paused = False  # a partial update: the server must not serve until fixed

    def attach(self, transfer: WeightTransfer) -> None:
        self.transfer, self.connected = transfer, False

    def model_name(self, version: int) -> str:
        return self.served_name

    async def _nccl_post(self, path: str, payload: dict, *, deadline_s: float | None = None
                         ) -> dict:
        once = path in self.COLLECTIVE
        return (await self.pool.post(path, payload, endpoint=self.endpoint,
                                     deadline_s=deadline_s or self.timeout_s,
                                     attempts=1 if once else None))[1]

    async def _world_size(self) -> int:
        cfg = self.pool.config(self.endpoint)
        headers = cfg.request_headers()
        try:
            with anyio.fail_after(min(self.timeout_s, cfg.request_timeout_s)):
                async with httpx.AsyncClient(base_url=cfg.base_url.rstrip("/"), headers=headers,
                                             timeout=cfg.request_timeout_s) as client:
                    resp = await client.get("/get_world_size", params={"include_dp": "true"})
        except (httpx.HTTPError, TimeoutError) as exc:
            raise SwapError(f"{self.endpoint}: GET /get_world_size failed: "
                            f"{type(exc).__name__}: {exc}") from None
        if resp.status_code != 200:
            raise SwapError(f"{self.endpoint}: GET /get_world_size answered HTTP "
                            f"{resp.status_code}: {resp.text[:200]}")
        return int(resp.json()["world_size"])

    async def _blocking_with(self, call: str, payload: dict, work: Any) -> None:
        """POST `call` while `work` runs in a thread: both sides meet inside one collective.
        Whichever side fails first is raised (as a SwapError / EndpointError); the other is
        cancelled (a thread stuck in NCCL is abandoned until `close` aborts its group)."""

        async def trainer_side() -> None:
            try:
                with anyio.fail_after(self.timeout_s):
                    await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
            except TimeoutError:
                raise SwapError(f"{self.endpoint}: the trainer side of {call} did not finish "
                                f"within {self.timeout_s}s") from None
            except EndpointError:
                raise
            except Exception as exc:
                raise SwapError(f"{self.endpoint}: the trainer side of {call} failed: "
                                f"{type(exc).__name__}: {exc}") from exc

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._nccl_post, call, payload)
                await trainer_side()
        except BaseExceptionGroup as group:
            cancelled = anyio.get_cancelled_exc_class()
            errors = [e for e in _leaves(group) if not isinstance(e, cancelled)]
            if not errors:
                raise
            raise errors[0] from None

    async def _connect(self) -> None:
        assert self.transfer is not None
        world = await self._world_size()
        info = self.transfer.rendezvous(world)
        await self._blocking_with("/init_weight_transfer_engine", {"init_info": info},
                                  self.transfer.connect)
        self.connected = True

    async def _end_session(self) -> None:
        """After a failure inside a session: end it so the next `/start_weight_update` can
        run. The server answers quickly unless its workers are stuck in the broadcast; an
        answer saying there is no session (a failed update already ended it) is fine."""
        try:
            await self._nccl_post("/finish_weight_update", {},
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

    async def _teardown(self) -> None:
        """Shielded and time-bounded: runs on the way out of a failed or cancelled swap."""
        was_connected, self.connected = self.connected, False
        with anyio.move_on_after(min(30.0, self.timeout_s), shield=True):
            if was_connected:
                try:
                    await self._nccl_post("/shutdown_weight_transfer_engine", {})
                except EndpointError as exc:
                    log.warning("nccl_shutdown_failed", endpoint=self.endpoint, error=str(exc))
            if self.transfer is not None:
                await anyio.to_thread.run_sync(self.transfer.close)

    async def _swap(self, version: int, path: Path) -> None:
        if self.transfer is None:
            raise SwapError(f"{self.endpoint}: vllm-nccl needs the trainer's weight transfer "
                            "(only the trainer process, which holds the weights on GPU, can "
                            "publish through it)")
        stage = "connect"
        try:
            if not self.connected:
                await self._connect()
            stage = "pause"
            await self._post("/pause?mode=keep", {})
            stage = "start"
            await self._nccl_post("/start_weight_update", {})
            payload = {"update_info": self.transfer.update_info()}
            stage = "update"  # from here tensors may land: the old weights are gone
            await self._blocking_with("/update_weights", payload, self.transfer.send)
            stage = "finish"
            await self._nccl_post("/finish_weight_update", {"weight_version": str(version)})
            stage = "done"
            self.held_paused = False
            await self._post("/reset_prefix_cache", {})
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._recover(stage, exc)
            raise
        finally:
            if not self.held_paused and stage != "connect":
                with anyio.move_on_after(30, shield=True):
                    await self._post("/resume", {})

    async def _recover(self, stage: str, exc: BaseException) -> None:
        """The server's state after a failure at `stage` (see the class docstring)."""
        wedged: WedgedServer | None = None
        if stage in ("start", "update", "finish"):
            try:
                with anyio.fail_after(min(40.0, self.timeout_s + 10)):
                    await self._end_session()
            except WedgedServer as w:
                wedged = w
            except (EndpointError, TimeoutError) as other:
                log.warning("nccl_end_session_failed", endpoint=self.endpoint, error=str(other))
        if stage in ("update", "finish"):
            self.held_paused = True
            log.error("nccl_partial_update_server_held_paused", endpoint=self.endpoint,
                      error=str(exc) or type(exc).__name__,
                      remedy="the next publish replaces every weight and resumes it")
        if wedged is not None:
            log.error("nccl_server_wedged", endpoint=self.endpoint, error=str(wedged))
        # A half-done transfer leaves the group unusable on both sides; a thread still
        # blocked in a collective is released by `close` (which aborts the communicator).
        await self._teardown()
        if wedged is not None:
            raise wedged from exc
