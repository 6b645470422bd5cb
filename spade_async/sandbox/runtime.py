"""The sandbox runtime: sandboxed worker processes, a warm pool of them, and environment sessions.

One worker process per environment instance, spawned fresh (never forked from the daemon, which
holds LanceDB and torch threads), spoken to over stdin/stdout with one JSON object per line. Every
call has a deadline; on a timeout, a crash, an oversized reply or a protocol violation the whole
worker is killed (process group, PID namespace, cgroup) and the session fails with the reason.
Replies are untrusted: `contract.check_*` validates them here, outside the sandbox.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from spade_async.core.config import SandboxConfig
from spade_async.core.logs import get_logger
from spade_async.envs.contract import (
    ALLOWED_IMPORTS,
    ContractError,
    EnvMeta,
    ResetResult,
    StepResult,
    check_meta,
    check_reset,
    check_step,
    resolve_params,
)
from spade_async.sandbox.cgroups import SlotCgroups
from spade_async.sandbox.isolation import MB, Isolation, choose_isolation

log = get_logger("sandbox")
WORKER_SOURCE = (Path(__file__).with_name("worker_main.py")).read_text()


class SandboxError(RuntimeError):
    """A sandbox call failed. `kind`: timeout, crashed, exception, syntax, contract, protocol,
    output_limit, closed. The message is what a person (or the validator's report) reads."""

    def __init__(self, kind: str, message: str, traceback: str = "") -> None:
        super().__init__(message)
        self.kind, self.traceback = kind, traceback


class EnvException(SandboxError):
    """The environment's own code raised; the worker survives and reports it."""


class WorkerStartError(SandboxError):
    """No worker could be started for the environment: the host's fault (processes, memory,
    namespaces), never the environment's, so it is no verdict on the code."""


def worker_limits(cfg: SandboxConfig, preload: bool) -> dict[str, Any]:
    return {
        "address_space_bytes": cfg.address_space_mb * MB,
        "cpu_seconds": cfg.cpu_seconds,
        "file_size_bytes": cfg.file_size_mb * MB,
        "open_files": cfg.open_files,
        "processes": cfg.processes,
        "allowed_imports": sorted(ALLOWED_IMPORTS),
        "preload": preload,
    }


class Worker:
    """One sandboxed worker process. Not reusable across environments: it dies with its env.

    Launched with a plain `Popen` (fork+exec of a fresh interpreter, nothing inherited but
    three pipes) so that the warm pool refills without a background task; the pipes are
    non-blocking and read through `anyio.wait_readable`.
    """

    def __init__(self, proc: subprocess.Popen, slot: int, cfg: SandboxConfig,
                 cgroups: SlotCgroups | None) -> None:
        self.proc, self.slot, self.cfg, self.cgroups = proc, slot, cfg, cgroups
        self._buf = bytearray()
        self._next_id = 1
        self.dead: str | None = None  # why, once it is
        self.info: dict[str, Any] | None = None  # the ready message, once read
        self.launched_at = time.perf_counter()
        self.reaper: Callable[[], int] | None = None  # set by the Sandbox that owns it
        for f in (proc.stdin, proc.stdout, proc.stderr):
            os.set_blocking(f.fileno(), False)

    @classmethod
    def launch(cls, iso: Isolation, slot: int, cfg: SandboxConfig,
               cgroups: SlotCgroups | None, preload: bool) -> Worker:
        argv = [str(iso.python), "-I", "-S", "-c", WORKER_SOURCE,
                json.dumps(worker_limits(cfg, preload))]
        cmd = iso.wrap(slot, argv)
        if cgroups is not None:
            cgroups.prepare(slot)
            cmd = cgroups.enter_prefix(slot) + cmd
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    close_fds=True, env={}, cwd="/")
        except OSError as exc:
            raise SandboxError("crashed", f"cannot launch a worker: {exc}") from None
        return cls(proc, slot, cfg, cgroups)

    async def ready(self) -> Worker:
        """Wait for the worker's ready line (already there for a warm one)."""
        if self.info is None:
            try:
                self.info = await self._reply(0, "start", self.cfg.start_timeout_s)
            except SandboxError as exc:
                err = self._stderr_tail()
                raise SandboxError(exc.kind, f"worker did not start: {exc}"
                                   + (f": {err}" if err else "")) from None
        return self

    def _stderr_tail(self) -> str:
        try:
            data = os.read(self.proc.stderr.fileno(), 4096)
        except (OSError, ValueError):  # ValueError: the pipe was closed (the worker was reaped)
            data = b""
        return data.decode(errors="replace").strip()[-600:]

    @property
    def alive(self) -> bool:
        return self.dead is None and self.proc.poll() is None

    async def _read_line(self) -> bytes:
        limit = self.cfg.max_response_bytes
        fd = self.proc.stdout.fileno()
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                return line
            if len(self._buf) > limit:
                raise SandboxError("output_limit", f"reply exceeds {limit} bytes; worker killed")
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                await anyio.wait_readable(fd)
                continue
            if not chunk:
                raise SandboxError("crashed", "worker exited")
            self._buf += chunk

    async def _reply(self, rid: int, op: str, timeout: float) -> Any:
        try:
            with anyio.fail_after(timeout):
                while True:
                    line = await self._read_line()
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        raise SandboxError("protocol", f"{op}: worker sent a non-JSON line") from None
                    if isinstance(msg, dict) and msg.get("id") == rid:
                        break
                    # A line with another id: forged by the environment or stale; drop it.
        except TimeoutError:
            await self.kill(f"{op} exceeded its {timeout:g}s deadline")
            raise SandboxError("timeout", f"{op} exceeded its {timeout:g}s deadline; "
                               "worker killed") from None
        except SandboxError as exc:
            if exc.kind == "crashed":
                code = await self._exit_code(2.0)
                exc = SandboxError("crashed", f"{op}: worker died ({_describe_exit(code)})")
            await self.kill(str(exc))
            raise exc from None
        if not msg.get("ok"):
            kind = str(msg.get("kind", "exception"))
            error = str(msg.get("error", "unknown error"))[:2000]
            raise EnvException(kind, error, str(msg.get("traceback", ""))[:4000])
        return msg.get("result")

    async def _exit_code(self, timeout: float) -> int | None:
        delay = 0.0005
        with anyio.move_on_after(timeout):
            while self.proc.poll() is None:
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.02)
        return self.proc.returncode

    async def _write(self, data: bytes) -> None:
        fd = self.proc.stdin.fileno()
        view = memoryview(data)
        while view:
            try:
                n = os.write(fd, view)
            except BlockingIOError:
                await anyio.wait_writable(fd)
                continue
            view = view[n:]

    async def call(self, op: str, timeout: float, **fields: Any) -> Any:
        if not self.alive:
            raise SandboxError("closed", f"{op}: the environment's worker is gone"
                               + (f" ({self.dead})" if self.dead else ""))
        await self.ready()
        rid, self._next_id = self._next_id, self._next_id + 1
        data = json.dumps({"id": rid, "op": op, **fields}, ensure_ascii=False).encode() + b"\n"
        try:
            with anyio.fail_after(timeout):
                await self._write(data)
        except TimeoutError:
            await self.kill(f"{op}: worker stopped reading its input")
            raise SandboxError("timeout", f"{op}: worker stopped reading its input; killed") from None
        except OSError:
            await self.kill(f"{op}: worker exited")
            raise SandboxError("crashed", f"{op}: worker exited before the call") from None
        return await self._reply(rid, op, timeout)

    async def kill(self, reason: str = "closed") -> None:
        """Kill the whole worker: its process group, its PID namespace (bwrap dies -> its init
        dies -> the kernel kills the namespace) and anything left in its cgroup."""
        if self.dead is None:
            self.dead = reason
        with anyio.CancelScope(shield=True):
            self._signal_all()
            await self._exit_code(5.0)
            if self.cgroups is not None:
                with anyio.move_on_after(2.0):
                    while self.cgroups.sweep(self.slot):
                        await anyio.sleep(0.01)
            if self.reaper is not None:
                with anyio.move_on_after(1.0):
                    while self.reaper():  # orphans still dying: reap them as they go
                        await anyio.sleep(0.001)
            self._close_pipes()

    def _signal_all(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.cgroups is not None:
            self.cgroups.sweep(self.slot)

    def _close_pipes(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass

    def start_kill(self, reason: str = "closed") -> None:
        """SIGKILL everything now; `finished()` says when the slot is clean again. Lets an
        episode return without waiting for the kernel to tear the namespaces down."""
        if self.dead is None:
            self.dead = reason
        self._signal_all()

    def finished(self) -> bool:
        """Non-blocking: the process has exited, its orphans are reaped and its cgroup is empty."""
        if self.proc.poll() is None:
            return False
        if self.reaper is not None and self.reaper():
            return False
        if self.cgroups is not None and self.cgroups.sweep(self.slot):
            return False
        self._close_pipes()
        return True

    async def close(self) -> None:
        # No goodbye round trip: the worker holds nothing worth a graceful exit.
        await self.kill()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class EnvSession:
    """One loaded environment instance in its own worker; methods return frozen results."""

    def __init__(self, worker: Worker, meta: EnvMeta, cfg: SandboxConfig) -> None:
        self.worker, self.meta, self.cfg = worker, meta, cfg

    async def _call(self, op: str, **fields: Any) -> Any:
        return await self.worker.call(op, self.cfg.call_timeout_s, **fields)

    async def reset(self, seed: int, params: dict[str, Any] | None = None) -> ResetResult:
        """Start an episode. An environment with knobs always gets every knob's value
        (`params` with the defaults filled in), so its reset never guesses a default; one
        without knobs gets `reset(seed)` as before. A bad `params` is the caller's mistake, not
        the environment's: it raises ContractError before the worker is asked anything."""
        fields: dict[str, Any] = {"seed": int(seed)}
        resolved = resolve_params(self.meta.params, params)
        if self.meta.params:
            fields["params"] = resolved
        return _checked(check_reset, await self._call("reset", **fields), "reset")

    async def step(self, action: str) -> StepResult:
        return _checked(check_step, await self._call("step", action=str(action)), "step")

    async def hint(self) -> str:
        res = await self._call("hint")
        hint = res.get("hint") if isinstance(res, dict) else None
        if not isinstance(hint, str):
            raise SandboxError("contract", f"hint() must return a str, got {type(hint).__name__}")
        return hint

    async def solution(self) -> list[str]:
        res = await self._call("solution")
        actions = res.get("actions") if isinstance(res, dict) else None
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise SandboxError("contract", "solution() must return a list of str actions")
        return actions


def _checked(check, raw: Any, op: str):
    try:
        return check(raw)
    except ContractError as exc:
        raise SandboxError("contract", f"{op}: {exc}") from None


@dataclass
class SandboxStats:
    started_cold: int = 0
    started_warm: int = 0
    killed: int = 0


PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> bool:
    """Orphans of a killed sandbox (its PID namespace's processes) are re-parented to us, not to
    the host's init, so we reap them at once: a slow init would otherwise leave zombies that
    still count against the slot's pids limit."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_sandbox_orphans(uids: range, keep: set[int]) -> int:
    """waitpid() our zombie children that ran under a slot uid and are not a Worker's own
    process (those belong to their Popen); returns how many such children are still alive.
    Never touches any other child of this process."""
    children: set[int] = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                children |= {int(p) for p in
                             Path(f"/proc/self/task/{tid}/children").read_text().split()}
            except OSError:
                pass
    except OSError:
        return 0
    alive = 0
    for pid in children - keep:
        try:
            fields = dict(line.split(":", 1) for line in
                          Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
            if int(fields["Uid"].split()[0]) not in uids:
                continue
            if fields["State"].strip().startswith("Z"):
                os.waitpid(pid, os.WNOHANG)
            else:
                alive += 1
        except (OSError, ValueError, KeyError):
            pass
    return alive


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
        self.stats = SandboxStats()

    @property
    def isolation(self) -> Isolation:
        assert self._iso is not None, "use `async with Sandbox(...)`"
        return self._iso

    def layers(self) -> dict[str, bool]:
        d = self.isolation.layers().describe()
        d["cgroups"] = self.cgroups is not None
        return d

    async def __aenter__(self) -> Sandbox:
        if self._iso is None:
            self._iso = await anyio.to_thread.run_sync(choose_isolation, self.cfg)
        if self.isolation.is_root and self.isolation.name != "none":
            # One group per Sandbox: a second one in this process must not sweep our slots.
            self.cgroups = SlotCgroups.create(f"spade-sandbox-{os.getpid()}-{next(_instances)}",
                                              self.cfg.memory_mb * MB, self.cfg.processes)
        self._subreaper = self.isolation.name != "none" and _become_subreaper()
        self._open = True
        self._refill()
        log.info("sandbox_ready", isolation=self.isolation.name, layers=self.layers(),
                 slots=self.cfg.slots, warm=self.cfg.warm_workers)
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

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _adopt(self, worker: Worker) -> Worker:
        if getattr(self, "_subreaper", False):
            uids = range(self.cfg.uid_base, self.cfg.uid_base + self.cfg.slots)

            def reap() -> int:
                return reap_sandbox_orphans(uids, self._live_pids())

            worker.reaper = reap
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
                self.stats.started_warm += 1
                self._refill()
                return worker
            if self._free:
                slot = self._free.popleft()
                try:
                    worker = await self._adopt(Worker.launch(
                        self.isolation, slot, self.cfg, self.cgroups, preload=False)).ready()
                except SandboxError as exc:
                    self._free.append(slot)
                    self._notify()
                    raise WorkerStartError(exc.kind, str(exc)) from None
                except BaseException:
                    self._free.append(slot)
                    self._notify()
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
            meta = _checked(check_meta, raw, "load")
            yield EnvSession(worker, meta, self.cfg)
        finally:
            self._give_back(worker)


@asynccontextmanager
async def open_env(cfg: SandboxConfig, code: str) -> AsyncIterator[EnvSession]:
    """One-off: a sandbox with no warm pool, one environment (CLI commands)."""
    one = cfg.model_copy(update={"warm_workers": 0, "slots": 1})
    async with Sandbox(one) as sb, sb.open(code) as env:
        yield env
