"""One sandboxed worker process: its launch, its limits, and the protocol it speaks.

Spawned fresh (never forked from the daemon, which holds LanceDB and torch threads), spoken to over
stdin/stdout with one JSON object per line. Every call has a deadline; on a timeout, a crash, an
oversized reply or a protocol violation the whole worker is killed (process group, PID namespace,
cgroup) and the call fails with the reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from spade_async.core.config import SandboxConfig
from spade_async.envs.contract import ALLOWED_IMPORTS
from spade_async.sandbox.cgroups import SlotCgroups
from spade_async.sandbox.errors import EnvException, SandboxError
from spade_async.sandbox.isolation import MB, Isolation

WORKER_SOURCE = (Path(__file__).with_name("worker_main.py")).read_text()


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

    node: str | None = None  # where it runs: this host (a remote session names its node)

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

