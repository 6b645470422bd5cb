"""`FaultProxy`: the fault-injecting listener tests put in front of an OpenAI-compatible server.

It runs in its own thread with its own event loop, in the style of `FakeOpenAIServer`. Faults are
armed from the test's own thread (`inject`, `schedule`, `down`/`up`, `clear`) and counted, so a
test can check what the client under test saw against what was done to it. This module owns the
listener, its connections, outages and schedules; what happens on one connection is `relay.py`'s.
Never for production code: it reads every request and may throw any of them away.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import Counter
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any, Literal

from spade_async.testing.faults import wire
from spade_async.testing.faults.plan import Fault, FaultKind, Phase
from spade_async.testing.faults.relay import Relay
from spade_async.testing.faults.table import Armed, FaultTable, RequestRecord

_CALL_TIMEOUT_S = 10.0


class FaultProxy:
    """Use as `with FaultProxy(server.base_url) as proxy:`, then point the client at
    `proxy.base_url`. Every public method may be called from any thread but the proxy's own."""

    def __init__(self, upstream: str, port: int = 0, *,
                 upstream_failure: Literal["502", "drop"] = "502") -> None:
        """`upstream_failure`: what a client sees when the upstream cannot be reached: a 502
        (as from a reverse proxy), or "drop": its connection closed without an answer, as if
        it had spoken to the dead server itself (a test that kills the server behind the
        proxy wants the client to see what it would see without one)."""
        self.upstream = upstream.rstrip("/")
        self.upstream_failure = upstream_failure
        self._port = port
        self._table = FaultTable()
        self._connections = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Loop-side state, touched only on the proxy's loop.
        self._stopping: asyncio.Event | None = None
        self._relay: Relay | None = None
        self._server: asyncio.Server | None = None
        self._accepting = False
        self._down = False
        self._conns: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._schedules: set[asyncio.Task[Any]] = set()
        self._up_timer: asyncio.Task[None] | None = None

    # ---- lifecycle -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> FaultProxy:
        if self._thread is not None:
            raise RuntimeError("the proxy is already running")
        ready = threading.Event()
        errors: list[BaseException] = []
        self._table.t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, args=(ready, errors),
                                        name=f"fault-proxy-{self._port}", daemon=True)
        self._thread.start()
        if not ready.wait(timeout=_CALL_TIMEOUT_S) or errors:
            self.stop()
            raise RuntimeError(f"fault proxy did not start on port {self._port}: {errors}")
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and self._stopping is not None:
            try:
                loop.call_soon_threadsafe(self._stopping.set)
            except RuntimeError:  # the loop already closed
                pass
        if thread is not None:
            thread.join(timeout=_CALL_TIMEOUT_S)
        self._thread = self._loop = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, ready: threading.Event, errors: list[BaseException]) -> None:
        try:
            asyncio.run(self._main(ready, errors))
        except Exception as exc:  # reported by start(), not lost in a dead thread
            errors.append(exc)
        finally:
            ready.set()

    async def _main(self, ready: threading.Event, errors: list[BaseException]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._relay = Relay(self.upstream, self.upstream_failure, self._table)
        try:
            try:
                await self._listen()
            except OSError as exc:
                errors.append(exc)
                return
            ready.set()
            await self._stopping.wait()
        finally:
            for task in list(self._schedules):
                task.cancel()
            self._cancel_up_timer()
            self._accepting = False
            server, self._server = self._server, None
            if server is not None:
                server.close()
            await self._drop_connections()
            if server is not None:
                await server.wait_closed()
            await self._relay.aclose()

    # ---- faults, from the test's thread ----------------------------------------------------

    def inject(self, kind: FaultKind | Literal["die"] | Fault, *, count: int | None = None,
               duration: float | None = None, seconds: float | None = None,
               status: int | None = None, paths: Sequence[str] | None = None) -> Fault:
        """Arms a fault (see `Fault` for the parameters). Faults apply first-armed-first: with
        `inject("drop", count=1); inject("status", count=1)` the next request is dropped and the
        one after gets a 500. A `down` fault takes effect before this returns."""
        if isinstance(kind, Fault):
            if (count, duration, seconds, status, paths) != (None,) * 5:
                raise TypeError("inject(Fault(...)) takes no other parameters")
            fault = kind
        else:
            fault = Fault(kind, count=count, duration=duration, seconds=seconds, status=status,
                          paths=None if paths is None else tuple(paths))
        if fault.kind == "down":
            self._call(self._go_down(fault.duration))
        else:
            self._table.arm(fault)
        return fault

    def clear(self) -> None:
        """Ends every fault and schedule, releases held requests and brings the proxy up."""
        self._table.release_all()
        if self._loop is not None:
            self._call(self._reset())

    def down(self, duration: float | None = None) -> None:
        """Stops listening and closes every client connection (connects are refused), for
        `duration` seconds or until `up()`. The port is kept."""
        self.inject(Fault("down", duration=duration))

    def up(self) -> None:
        """Listens again, on the same port."""
        self._call(self._go_up())

    def schedule(self, phases: Iterable[Phase]) -> concurrent.futures.Future[None]:
        """Plays `(start offset, Fault)` phases in the background, in order of their offsets.
        Phases are exclusive: a phase's fault ends when the next phase starts, or earlier by its
        own `count`/`duration`; the last one lasts by its own terms. The future is done when the
        last phase has started and, if it has a duration, ended; `clear()` cancels it."""
        ordered = sorted(phases, key=lambda phase: phase[0])
        if any(at < 0 for at, _ in ordered):
            raise ValueError("phase offsets must be >= 0")
        loop = self._running_loop()
        return asyncio.run_coroutine_threadsafe(self._play(ordered), loop)

    @property
    def is_down(self) -> bool:
        return self._down

    # ---- counters --------------------------------------------------------------------------

    @property
    def requests_seen(self) -> int:
        return self._table.seen

    @property
    def requests_forwarded(self) -> int:
        return self._table.forwarded

    @property
    def connections(self) -> int:
        """Client connections accepted (keep-alive: several requests share one)."""
        return self._connections

    @property
    def faults_applied(self) -> Counter[str]:
        """Requests each fault kind was applied to; for `down`, the outages."""
        return self._table.applied

    @property
    def log(self) -> list[RequestRecord]:
        return self._table.log

    # ---- loop plumbing -----------------------------------------------------------------------

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None or loop.is_closed():
            raise RuntimeError("the fault proxy is not running")
        if self._thread is threading.current_thread():
            raise RuntimeError("call the fault proxy from another thread than its own")
        return loop

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            loop = self._running_loop()
        except RuntimeError:
            coro.close()
            raise
        asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=_CALL_TIMEOUT_S)

    async def _listen(self) -> None:
        self._accepting = True  # before the first accept, which may run inside start_server
        try:
            self._server = await asyncio.start_server(self._on_connect, "127.0.0.1", self._port,
                                                      limit=wire.HEAD_LIMIT)
        except BaseException:
            self._accepting = False
            raise
        self._port = self._server.sockets[0].getsockname()[1]
        self._down = False

    async def _go_down(self, duration: float | None) -> None:
        self._cancel_up_timer()
        if self._server is not None:
            self._accepting, self._down = False, True
            server, self._server = self._server, None
            server.close()  # the listening socket: connects are refused from here on
            await self._drop_connections()
            await server.wait_closed()
            self._table.count_outage()
        if duration is not None:
            assert self._loop is not None
            self._up_timer = self._loop.create_task(self._up_after(duration))

    async def _up_after(self, duration: float) -> None:
        await asyncio.sleep(duration)
        self._up_timer = None
        for _ in range(100):  # the port may linger for a moment
            try:
                await self._listen()
                return
            except OSError:
                await asyncio.sleep(0.02)

    async def _go_up(self) -> None:
        self._cancel_up_timer()
        if self._server is None:
            await self._listen()

    def _cancel_up_timer(self) -> None:
        if self._up_timer is not None and self._up_timer is not asyncio.current_task():
            self._up_timer.cancel()
        self._up_timer = None

    async def _reset(self) -> None:
        current = asyncio.current_task()
        tasks = [t for t in self._schedules if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._table.release_all()
        await self._go_up()

    async def _play(self, phases: list[Phase]) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._schedules.add(task)
        try:
            start = time.monotonic()
            current: Armed | Literal["down"] | None = None
            for at, fault in phases:
                await asyncio.sleep(max(0.0, start + at - time.monotonic()))
                if current == "down":
                    await self._go_up()
                elif current is not None:
                    self._table.release(current)
                if fault.kind == "down":
                    await self._go_down(fault.duration)
                    current = "down"
                else:
                    current = self._table.arm(fault)
            if phases and phases[-1][1].duration is not None:
                at, fault = phases[-1]
                await asyncio.sleep(max(0.0, start + at + (fault.duration or 0) - time.monotonic()))
                # Done means ended: up again, or the last fault disarmed (its own timers may
                # lag this wake-up by a poll).
                if current == "down":
                    await self._go_up()
                elif current is not None:
                    self._table.release(current)
        finally:
            self._schedules.discard(task)

    # ---- client connections (each served by the relay) ---------------------------------------

    def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._accepting or self._loop is None:  # accepted just before going down
            writer.transport.abort()
            return
        self._connections += 1
        assert self._relay is not None
        task = self._loop.create_task(
            self._relay.serve_connection(reader, writer, is_down=lambda: self._down))
        self._conns[task] = writer
        task.add_done_callback(self._connection_done)

    def _connection_done(self, task: asyncio.Task[None]) -> None:
        self._conns.pop(task, None)
        if not task.cancelled() and (exc := task.exception()) is not None and self._loop:
            # A bug here, not a network event (those are caught): make it loud.
            self._loop.call_exception_handler({"message": "fault proxy connection failed",
                                               "exception": exc, "task": task})

    async def _drop_connections(self) -> None:
        # A request cut off here is logged as "down" by its own task when `_down` is set.
        tasks = list(self._conns)
        for task, writer in list(self._conns.items()):
            writer.transport.abort()  # RST: no more bytes, no lingering half-open socket
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
