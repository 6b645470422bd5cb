"""One sandbox actor on a Ray node: the local sandbox (its slots, warm pool and isolation layers,
unchanged) and the sessions open in it, each one worker spoken to with the same JSON-lines ops.

Runs on the node, inside a Ray worker process, never in the daemon: the daemon's side is
`ray_pool.RaySandbox`. It returns the workers' raw replies; the daemon checks them, as it checks
a local worker's. Holds nothing of the daemon's but the sandbox config.
"""

from __future__ import annotations

import os
import time
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import ray

from spade_async.core.config import SandboxConfig
from spade_async.core.logs import get_logger
from spade_async.envs.contract import EnvMeta
from spade_async.sandbox.errors import SandboxError
from spade_async.sandbox.runtime import Sandbox
from spade_async.sandbox.session import EnvSession

log = get_logger("sandbox")


@dataclass
class _Open:
    stack: AsyncExitStack  # exits Sandbox.open: kills the worker, frees its slot
    env: EnvSession
    last_used: float


class SandboxNode:
    """A Ray actor class (`ray.remote(SandboxNode)`, async: every method runs on the actor's
    event loop). Actor `index` on its node runs its slots as uids
    `uid_base + index * slots + i` (their first choice of block; the claim in `uids.py` keeps
    any two sandboxes of one host apart)."""

    def __init__(self, cfg: SandboxConfig, index: int) -> None:
        self.cfg = cfg.model_copy(update={"placement": "local",
                                          "uid_base": cfg.uid_base + index * cfg.slots})
        self.index = index
        self._stack = AsyncExitStack()
        self._sandbox: Sandbox | None = None
        self._sessions: dict[str, _Open] = {}

    async def start(self) -> dict[str, Any]:
        """Enter the local sandbox (its isolation is chosen and probed here, on this node:
        SandboxUnavailable when the node cannot isolate); what the daemon logs of it."""
        self._sandbox = await self._stack.enter_async_context(Sandbox(self.cfg))
        return {"node": ray.get_runtime_context().get_node_id(), "index": self.index,
                "pid": os.getpid(), "isolation": self._sandbox.isolation.name,
                "layers": self._sandbox.layers(), "slots": self.cfg.slots}

    async def open(self, code: str) -> tuple[str, EnvMeta]:
        """Load `code` in a fresh worker (Sandbox.open); the session's id and its checked meta.
        A load failure raises the same SandboxError a local sandbox raises."""
        assert self._sandbox is not None, "start() first"
        await self._expire()
        stack = AsyncExitStack()
        env = await stack.enter_async_context(self._sandbox.open(code))
        sid = uuid.uuid4().hex
        self._sessions[sid] = _Open(stack, env, time.monotonic())
        return sid, env.meta

    async def call(self, sid: str, op: str, timeout: float, fields: dict[str, Any]) -> Any:
        """One protocol op (reset, step, hint, solution) on the session's worker: its raw
        reply, or the worker's SandboxError."""
        session = self._sessions.get(sid)
        if session is None:
            raise SandboxError("closed", f"{op}: the session is closed")
        session.last_used = time.monotonic()
        try:
            return await session.env.worker.call(op, timeout, **fields)
        finally:
            session.last_used = time.monotonic()

    async def close(self, sid: str) -> None:
        session = self._sessions.pop(sid, None)
        if session is not None:
            await session.stack.aclose()

    async def stop(self) -> None:
        """Kill every worker and leave the sandbox (its cgroups go with it)."""
        for sid in list(self._sessions):
            await self.close(sid)
        await self._stack.aclose()

    async def _expire(self) -> None:
        """Close sessions nobody called for `session_idle_s`: their close was lost with the
        caller, and their slots would be held for good."""
        cutoff = time.monotonic() - self.cfg.ray.session_idle_s
        for sid in [s for s, o in self._sessions.items() if o.last_used < cutoff]:
            log.warning("sandbox_session_expired", session=sid,
                        idle_s=self.cfg.ray.session_idle_s)
            await self.close(sid)
