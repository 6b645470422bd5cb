"""The sandbox pool: slots (one uid and cgroup each), a warm pool of pre-started workers, and
`open(code)`, which loads an environment in a fresh worker and hands back its session.

One worker process per environment instance (worker.py); the worker dies with its environment.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from spade_async.core.config import SandboxConfig
from spade_async.core.logs import get_logger
from spade_async.envs.replies import check_meta
from spade_async.sandbox.cgroups import SlotCgroups
from spade_async.sandbox.errors import SandboxError, WorkerStartError
from spade_async.sandbox.isolation import MB, Isolation, choose_isolation
from spade_async.sandbox.reaper import become_subreaper, reap_sandbox_orphans
from spade_async.sandbox.session import EnvSession, checked
from spade_async.sandbox.uids import UidBlock, claim_uids
from spade_async.sandbox.worker import Worker

log = get_logger("sandbox")


@dataclass
class SandboxStats:
    started_cold: int = 0
    started_warm: int = 0
    killed: int = 0


_instances = itertools.count()


class Sandbox:
    """Slots (one uid and cgroup each), a warm pool of pre-started workers, and `open(code)`.

    Use as `async with Sandbox(cfg) as sb:`. Workers are launched with a non-blocking Popen,
    so the warm pool refills right where a slot frees up, without a background task.
    """

    def __init__(self, cfg: SandboxConfig, isolation: Isolation | None = None) -> None:
        self.cfg = cfg
        self._iso = isolation
        self.cgroups: SlotCgroups | None = None
        self._free: deque[int] = deque(range(cfg.slots))
        self._warm: deque[Worker] = deque()
        self._all: set[Worker] = set()
        self._dying: list[Worker] = []  # killed, slot not yet clean
        self._changed = anyio.Event()
        self._open = False
        self._uids: UidBlock | None = None
        self.stats = SandboxStats()

    @property
    def capacity(self) -> int:
        """Environment instances alive at once (admission sizes by it)."""
        return self.cfg.slots

    @property
    def isolation(self) -> Isolation:
        assert self._iso is not None, "use `async with Sandbox(...)`"
        return self._iso

    @property
    def uids(self) -> range:
        """The slot uids this sandbox runs environments as (slot i: `uids[i]`)."""
        return range(self.isolation.uid_base, self.isolation.uid_base + self.cfg.slots)

    def layers(self) -> dict[str, bool]:
        d = self.isolation.layers().describe()
        d["cgroups"] = self.cgroups is not None
        return d

    async def __aenter__(self) -> Sandbox:
        if self._iso is None:
            if os.geteuid() == 0 and self.cfg.isolation != "none":
                # Slot uids are host-wide: claim a block no other sandbox on this host holds.
                self._uids = claim_uids(self.cfg.uid_base, self.cfg.slots)
            try:
                self._iso = await anyio.to_thread.run_sync(
                    choose_isolation, self.cfg, self._uids.first if self._uids else None)
            except BaseException:
                self._release_uids()
                raise
        if self.isolation.is_root and self.isolation.name != "none":
            # One group per Sandbox: a second one in this process must not sweep our slots.
            self.cgroups = SlotCgroups.create(f"spade-sandbox-{os.getpid()}-{next(_instances)}",
                                              self.cfg.memory_mb * MB, self.cfg.processes)
        self._subreaper = self.isolation.name != "none" and become_subreaper()
        self._open = True
        self._refill()
        log.info("sandbox_ready", isolation=self.isolation.name, layers=self.layers(),
                 slots=self.cfg.slots, warm=self.cfg.warm_workers,
                 uids=f"{self.uids.start}-{self.uids.stop - 1}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._open = False
        with anyio.CancelScope(shield=True):
            while self._warm:
                await self._warm.popleft().kill()
            while self._dying:
                await self._dying.pop().kill()
            if self.cgroups is not None:
                self.cgroups.remove()
        self._release_uids()  # every worker is dead: the uids are free for another sandbox

    def _release_uids(self) -> None:
        if self._uids is not None:
            self._uids.release()
            self._uids = None

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _adopt(self, worker: Worker) -> Worker:
        if getattr(self, "_subreaper", False):
            uids = self.uids

            def reap() -> int:
                return reap_sandbox_orphans(uids, self._live_pids())

            worker.reaper = reap
        if len(self._all) >= 2 * self.cfg.slots:  # bounded in every isolation mode: the dead go
            self._live_pids()
        self._all.add(worker)
        return worker

    def _live_pids(self) -> set[int]:
        self._all = {w for w in self._all if w.proc.returncode is None}
        return {w.proc.pid for w in self._all}

    def _refill(self) -> None:
        while self._open and len(self._warm) < self.cfg.warm_workers and self._free:
            slot = self._free.popleft()
            try:
                self._warm.append(self._adopt(Worker.launch(
                    self.isolation, slot, self.cfg, self.cgroups, preload=False)))
            except SandboxError as exc:
                log.error("warm_worker_failed", slot=slot, error=str(exc))
                self._free.append(slot)
                return

    def _collect(self) -> None:
        """Free the slots of killed workers whose teardown has completed."""
        if not self._dying:
            return
        still = [w for w in self._dying if not w.finished()]
        freed = len(self._dying) - len(still)
        if freed:
            for w in self._dying:
                if w not in still:
                    self._free.append(w.slot)
            self._dying = still
            self.stats.killed += freed
            self._refill()
            self._notify()

    async def _take_worker(self) -> Worker:
        while True:
            self._collect()
            while self._warm:
                worker = self._warm.popleft()
                try:
                    await worker.ready()
                except SandboxError as exc:
                    log.warning("warm_worker_lost", slot=worker.slot, error=str(exc))
                    await worker.kill("died while warm")
                    self._free.append(worker.slot)
                    continue
                except BaseException:  # cancelled while it got ready: out of the pool, so
                    self._give_back(worker)  # killed here or nowhere
                    raise
                self.stats.started_warm += 1
                self._refill()
                return worker
            if self._free:
                slot = self._free.popleft()
                try:
                    worker = self._adopt(Worker.launch(
                        self.isolation, slot, self.cfg, self.cgroups, preload=False))
                except BaseException:
                    self._free.append(slot)
                    self._notify()
                    raise
                try:
                    await worker.ready()
                except SandboxError as exc:
                    self._give_back(worker)
                    raise WorkerStartError(exc.kind, str(exc)) from None
                except BaseException:  # cancelled while it started: killed, its slot back
                    self._give_back(worker)
                    raise
                self.stats.started_cold += 1
                return worker
            if self._dying:  # a slot frees itself as soon as the kernel is done with it
                with anyio.move_on_after(0.002):
                    await self._changed.wait()
            else:
                await self._changed.wait()

    def _give_back(self, worker: Worker) -> None:
        worker.start_kill()
        self._dying.append(worker)
        self._collect()
        # Wake every waiter even if the slot is not clean yet: one that saw no dying worker
        # sleeps on the event alone, and must switch to polling the teardown.
        self._notify()

    @asynccontextmanager
    async def open(self, code: str) -> AsyncIterator[EnvSession]:
        """Load `code` in a fresh worker; the worker is killed when the block exits."""
        size = len(code.encode())
        if size > self.cfg.max_code_bytes:
            raise SandboxError("contract", f"environment code is {size} bytes; the limit is "
                               f"{self.cfg.max_code_bytes}")
        worker = await self._take_worker()
        try:
            raw = await worker.call("load", self.cfg.load_timeout_s, code=code)
            meta = checked(check_meta, raw, "load")
            yield EnvSession(worker, meta, self.cfg)
        finally:
            self._give_back(worker)


@asynccontextmanager
async def open_env(cfg: SandboxConfig, code: str) -> AsyncIterator[EnvSession]:
    """One-off: a sandbox with no warm pool, one environment (CLI commands)."""
    one = cfg.model_copy(update={"warm_workers": 0, "slots": 1})
    async with Sandbox(one) as sb, sb.open(code) as env:
        yield env
