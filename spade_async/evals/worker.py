"""A suite's package in its own venv, spoken to through a worker process: one JSON request per
line on its stdin, one reply per line on its stdout, `{"result": ...}` or `{"error": "..."}`.

Suites whose package pins clash with .venv (BFCL, TextArena) run it this way: the worker is a
script under that venv's interpreter (`python -I`, so only the standard library and the venv's
packages are importable), in its own session so a kill takes its whole process group. This
module never imports those packages, and it never evaluates anything a worker sends back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from spade_async.sandbox.errors import EnvException, SandboxError

MAX_REPLY_BYTES = 8 << 20


class WorkerSetupError(RuntimeError):
    """A worker's venv is missing or broken."""


def worker_argv(python: Path, script: Path) -> list[str]:
    return [str(python), "-I", str(script)]  # -I: only stdlib + the venv's packages on sys.path


def check_python(python: Path, setup: str, error: type[WorkerSetupError] = WorkerSetupError,
                 venv: str = "its venv") -> None:
    if not python.exists():
        raise error(f"{python} missing: `{setup}` builds {venv}")


def worker_batch(python: Path, script: Path, requests: Sequence[dict[str, Any]], *,
                 timeout_s: float = 120.0, label: str = "worker", setup: str = "",
                 error: type[WorkerSetupError] = WorkerSetupError,
                 venv: str = "its venv") -> list[Any]:
    """Run requests through a one-off worker (synchronously); the results in order. A reply
    `{"error": ...}` is a ValueError naming the request's op."""
    check_python(python, setup, error, venv)
    data = "".join(json.dumps(r) + "\n" for r in requests)
    try:
        proc = subprocess.run(worker_argv(python, script), input=data, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise error(f"the {label} took over {timeout_s:g}s") from None
    replies = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    if len(replies) != len(requests):
        raise error(f"the {label} failed (exit {proc.returncode}; is {venv} complete? "
                    f"`{setup}`): {proc.stderr.strip()[-800:]}")
    out = []
    for req, reply in zip(requests, replies, strict=True):
        if "error" in reply:
            raise ValueError(f"{label}, {req.get('op')}: {reply['error']}")
        out.append(reply["result"])
    return out


class JsonLinesWorker:
    """One worker process, spoken to asynchronously; use as `async with Worker(...) as w`.
    A request that fails to answer within `timeout_s` kills the worker."""

    def __init__(self, python: Path | str, script: Path, *, timeout_s: float = 60.0,
                 label: str = "worker", setup: str = "",
                 setup_error: type[WorkerSetupError] = WorkerSetupError,
                 venv: str = "its venv") -> None:
        self.python, self.script, self.timeout_s = Path(python), script, timeout_s
        self.label, self.setup, self.setup_error, self.venv = label, setup, setup_error, venv
        self._proc: Process | None = None
        self._reader: BufferedByteReceiveStream | None = None
        self._stderr: Any = None
        self._lock = anyio.Lock()
        self.dead: str | None = None

    async def __aenter__(self) -> JsonLinesWorker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        check_python(self.python, self.setup, self.setup_error, self.venv)
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed by aclose()
        try:
            self._proc = await anyio.open_process(
                worker_argv(self.python, self.script), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=self._stderr, start_new_session=True)
        except OSError as exc:
            self._stderr.close()
            raise self.setup_error(f"cannot start the {self.label} ({exc}); "
                                   f"`{self.setup}`") from None
        self._reader = BufferedByteReceiveStream(self._proc.stdout)

    def _stderr_tail(self) -> str:
        try:
            self._stderr.seek(0)
            return self._stderr.read().decode(errors="replace").strip()[-800:]
        except (OSError, ValueError, AttributeError):
            return ""

    async def request(self, op: str, **fields: Any) -> Any:
        """The worker's result; raises EnvException for an error it reports, SandboxError when
        it is gone, times out or breaks the protocol (the worker is then killed)."""
        if self._proc is None or self.dead is not None:
            raise SandboxError("closed", f"{op}: the {self.label} is not running"
                               + (f" ({self.dead})" if self.dead else ""))
        data = (json.dumps({"op": op, **fields}, ensure_ascii=False) + "\n").encode()
        async with self._lock:
            try:
                with anyio.fail_after(self.timeout_s):
                    await self._proc.stdin.send(data)
                    line = await self._reader.receive_until(b"\n", MAX_REPLY_BYTES)
            except TimeoutError:
                await self.aclose(f"{op} exceeded its {self.timeout_s:g}s deadline", grace_s=0)
                raise SandboxError("timeout", f"{self.label}: {op} exceeded its "
                                   f"{self.timeout_s:g}s deadline; killed") from None
            except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError,
                    anyio.ClosedResourceError, anyio.DelimiterNotFound, OSError) as exc:
                err = self._stderr_tail()
                await self.aclose(f"{op}: {type(exc).__name__}", grace_s=0)
                raise SandboxError("crashed", f"{self.label} died during {op}"
                                   + (f": {err}" if err else "")) from None
        try:
            msg = json.loads(line)
        except ValueError:
            await self.aclose(f"{op}: a non-JSON reply", grace_s=0)
            raise SandboxError("protocol", f"{self.label}: {op} got a non-JSON reply") from None
        if not isinstance(msg, dict) or ("error" not in msg and "result" not in msg):
            await self.aclose(f"{op}: a malformed reply", grace_s=0)
            raise SandboxError("protocol", f"{self.label}: {op} got a malformed reply")
        if "error" in msg:
            raise EnvException("exception", f"{self.label}, {op}: {msg['error']}"[:2000])
        return msg["result"]

    async def aclose(self, reason: str = "closed", grace_s: float = 2.0) -> None:
        """End the worker: EOF on its stdin, `grace_s` to exit, then SIGKILL to its process
        group. Safe to call twice."""
        proc, self._proc = self._proc, None
        if self.dead is None:
            self.dead = reason
        if proc is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await proc.stdin.aclose()
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
            with anyio.move_on_after(grace_s):
                await proc.wait()
            if proc.returncode is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: start_new_session
                except ProcessLookupError:
                    pass
                except PermissionError:
                    proc.kill()
            await proc.aclose()
            if self._stderr is not None:
                self._stderr.close()
                self._stderr = None
