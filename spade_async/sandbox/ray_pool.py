"""Sandbox nodes on a Ray cluster behind the local sandbox's interface (`sandbox.placement =
"ray"`): `open(code)` hands back the same `EnvSession`, whose worker is a session in a
`SandboxNode` actor on one of the cluster's sandbox nodes, so the daemon has one code path for
local and remote environments.

Placement: every alive node that offers `sandbox.ray.node_resource` gets `actors_per_node`
actors (pinned to it), each running the local sandbox with its own `sandbox.slots`. A session
goes to the least-loaded actor with a free slot. A lost actor or node (Ray says it died, or a
call misses its deadline by `call_slack_s`) fails every call of its sessions with
`SandboxNodeLost` (kind `node_lost`: the host's fault, retried elsewhere, never scored), is
taken out of rotation at once, and the node list is read again (a crashed actor on a live node
is replaced; a dead node's actors are not). This module never runs environment code: the node's
actor does (ray_node.py).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import ray
from ray import exceptions as rx
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from spade_async.core.config import SandboxConfig
from spade_async.core.logs import get_logger
from spade_async.sandbox.errors import SandboxError, SandboxNodeLost
from spade_async.sandbox.isolation import SandboxUnavailable
from spade_async.sandbox.ray_node import SandboxNode
from spade_async.sandbox.session import EnvSession

log = get_logger("sandbox")

# What Ray raises when the actor, its worker process or its node is gone: the node's fault.
NODE_LOST = (rx.RayActorError, rx.NodeDiedError, rx.WorkerCrashedError, rx.ObjectLostError,
             rx.LocalRayletDiedError, rx.ActorUnschedulableError, rx.TaskUnschedulableError)


@dataclass(eq=False)
class Member:
    """One SandboxNode actor, as the daemon sees it."""

    handle: Any  # ray.actor.ActorHandle
    node: str
    index: int
    slots: int
    info: dict[str, Any] = field(default_factory=dict)
    sessions: int = 0  # open on it now
    opened: int = 0  # ever
    lost: str | None = None  # why, once it is


class RemoteWorker:
    """A session in a SandboxNode actor, with the local Worker's `call`: the same ops, the
    raw reply, the worker's own SandboxError, or SandboxNodeLost when the node is gone."""

    def __init__(self, pool: RaySandbox, member: Member, sid: str) -> None:
        self.pool, self.member, self.sid = pool, member, sid

    @property
    def node(self) -> str:
        return self.member.node

    async def call(self, op: str, timeout: float, **fields: Any) -> Any:
        m = self.member
        return await self.pool.remote(m, m.handle.call.remote(self.sid, op, timeout, fields),
                                      timeout + self.pool.rcfg.call_slack_s, op)


class RaySandbox:
    """Use as `async with RaySandbox(cfg) as sb:`, then `sb.open(code)` as on `Sandbox`.
    Joins the Ray cluster at `sandbox.ray.address` unless this process already has (and then
    leaves it alone on exit). Refuses to start, like the local sandbox, when no node offers the
    resource or a node cannot isolate."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg, self.rcfg = cfg, cfg.ray
        self.members: list[Member] = []
        self.lost: list[Member] = []
        self.opened_by_node: Counter[str] = Counter()
        self._joined = False
        self._stale = True  # the node list must be read before the next open
        self._refreshed_at = 0.0
        self._refreshing = False
        self._changed = anyio.Event()

    @property
    def capacity(self) -> int:
        """Environment instances alive at once over the live actors (admission sizes by it)."""
        return sum(m.slots for m in self.members if m.lost is None)

    async def __aenter__(self) -> RaySandbox:
        if not ray.is_initialized():
            try:
                ray.init(address=self.rcfg.address, namespace=self.rcfg.namespace,
                         log_to_driver=False, logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise SandboxUnavailable(f"placement = 'ray': cannot join the Ray cluster at "
                                         f"{self.rcfg.address!r}: {exc}") from None
            self._joined = True
        try:
            await self._refresh(first=True)
            if not self.capacity:
                where = (f"offers the resource {self.rcfg.node_resource!r}"
                         if self.rcfg.node_resource else "is alive")
                raise SandboxUnavailable(f"placement = 'ray': no node of the Ray cluster {where}")
        except BaseException:
            await self.__aexit__()
            raise
        log.info("sandbox_ready", placement="ray", nodes=sorted({m.node for m in self.members}),
                 actors=len(self.members), capacity=self.capacity,
                 isolation=sorted({m.info.get("isolation", "?") for m in self.members}))
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for m in self.members:
                    tg.start_soon(self._stop, m)
            self.members = []
            if self._joined:
                ray.shutdown()

    async def _stop(self, m: Member) -> None:
        if m.lost is None:
            with anyio.move_on_after(self.rcfg.call_slack_s):
                try:
                    await m.handle.stop.remote()
                except rx.RayError:
                    pass
        _kill(m)

    def nodes(self) -> list[dict[str, Any]]:
        """The actors, live and lost: node, index, sessions open, sessions ever, why lost."""
        return [{"node": m.node, "index": m.index, "sessions": m.sessions, "opened": m.opened,
                 "lost": m.lost} for m in self.members + self.lost]

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def remote(self, m: Member, ref: Any, deadline_s: float, op: str) -> Any:
        """Await one actor call: its result; the sandbox's own error as raised on the node;
        SandboxNodeLost (and the actor out of rotation) when the node is gone or silent."""
        try:
            with anyio.fail_after(deadline_s):
                return await ref
        except rx.RayTaskError as exc:
            if isinstance(exc.cause, SandboxError | SandboxUnavailable):
                raise exc.cause from None
            raise  # our actor's own bug: fail fast with the node's traceback
        except NODE_LOST as exc:
            raise self._lose(m, f"{op}: {type(exc).__name__}: {_why(exc)}") from None
        except TimeoutError:
            raise self._lose(m, f"{op}: no answer within {deadline_s:g}s") from None

    def _lose(self, m: Member, why: str) -> SandboxNodeLost:
        if m.lost is None:
            m.lost = why
            _kill(m)  # a silent actor must not keep slots; a dead one ignores it
            if m in self.members:
                self.members.remove(m)
                self.lost.append(m)
            self._stale = True
            log.warning("sandbox_node_lost", node=m.node, actor=m.index, sessions=m.sessions,
                        reason=why)
            self._notify()
        return SandboxNodeLost(f"sandbox node {m.node[:12]} (actor {m.index}) lost: {m.lost}",
                               m.node)

    async def _refresh(self, first: bool = False) -> None:
        """Read the node list: a node gone takes its actors out of rotation, a live node gets
        its missing actors (new node, or a crashed actor replaced). One at a time; callers
        that find it running go on with the actors there are."""
        if self._refreshing:
            return
        self._refreshing = True
        try:
            try:
                nodes = await anyio.to_thread.run_sync(ray.nodes)
            except Exception as exc:  # the cluster's control plane: try again next time
                log.warning("sandbox_nodes_unreadable", error=f"{type(exc).__name__}: {exc}")
                if first:
                    raise SandboxUnavailable(f"placement = 'ray': cannot list the cluster's "
                                             f"nodes: {exc}") from None
                return
            res = self.rcfg.node_resource
            alive = sorted(n["NodeID"] for n in nodes if n.get("Alive")
                           and (not res or n.get("Resources", {}).get(res, 0) > 0))
            for m in list(self.members):
                if m.node not in alive:
                    self._lose(m, "its node is no longer alive")
            have = {(m.node, m.index) for m in self.members}
            missing = [(node, k) for node in alive for k in range(self.rcfg.actors_per_node)
                       if (node, k) not in have]
            async with anyio.create_task_group() as tg:
                for node, k in missing:
                    tg.start_soon(self._start, node, k, first)
            self._stale = False
            self._refreshed_at = time.monotonic()
        finally:
            self._refreshing = False
            self._notify()

    async def _start(self, node: str, index: int, first: bool) -> None:
        handle = ray.remote(SandboxNode).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            num_cpus=0, max_restarts=0, name=None).remote(self.cfg, index)
        m = Member(handle, node, index, self.cfg.slots)
        try:
            m.info = await self.remote(m, handle.start.remote(), self.rcfg.start_timeout_s,
                                       "start")
        except SandboxUnavailable as exc:
            _kill(m)
            if first:  # as the local sandbox: no isolation is a refusal to start
                raise SandboxUnavailable(f"sandbox node {node}: {exc}") from None
            log.error("sandbox_node_unusable", node=node, actor=index, error=str(exc))
            return
        except SandboxNodeLost as exc:
            log.warning("sandbox_actor_not_started", node=node, actor=index, error=str(exc))
            return
        self.members.append(m)
        log.info("sandbox_actor_started", node=node, actor=index,
                 isolation=m.info.get("isolation"), slots=m.slots)

    async def _take(self) -> Member:
        """The least-loaded live actor with a free slot; waits while all are full."""
        while True:
            if self._stale or time.monotonic() - self._refreshed_at > self.rcfg.refresh_s:
                await self._refresh()
            free = [m for m in self.members if m.lost is None and m.sessions < m.slots]
            if free:
                return min(free, key=lambda m: (m.sessions / m.slots, m.opened))
            if not self.capacity and not self._refreshing:
                raise SandboxNodeLost("no sandbox node is alive (sandbox.placement = 'ray')")
            await self._changed.wait()

    @asynccontextmanager
    async def open(self, code: str) -> AsyncIterator[EnvSession]:
        """Load `code` in a fresh worker on some sandbox node; the worker is killed there when
        the block exits (without waiting for it: its slot frees itself)."""
        size = len(code.encode())
        if size > self.cfg.max_code_bytes:
            raise SandboxError("contract", f"environment code is {size} bytes; the limit is "
                               f"{self.cfg.max_code_bytes}")
        m = await self._take()
        m.sessions += 1
        m.opened += 1
        self.opened_by_node[m.node] += 1
        sid: str | None = None
        try:
            deadline = self.cfg.start_timeout_s + self.cfg.load_timeout_s \
                + self.rcfg.call_slack_s
            sid, meta = await self.remote(m, m.handle.open.remote(code), deadline, "load")
            yield EnvSession(RemoteWorker(self, m, sid), meta, self.cfg)
        finally:
            m.sessions -= 1
            if sid is not None and m.lost is None:
                try:
                    m.handle.close.remote(sid)  # fire and forget: Ray runs it all the same
                except rx.RayError:
                    pass
            self._notify()


def _why(exc: BaseException) -> str:
    """Ray's message in a line: its first sentence and the cause it names (a dead node)."""
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    keep = lines[:1] + [x for x in lines[1:] if x.startswith(("The actor died because",
                                                                  "the actor's node"))]
    return " ".join(keep)[:400]


def _kill(m: Member) -> None:
    try:
        ray.kill(m.handle, no_restart=True)
    except (rx.RayError, ValueError):
        pass
