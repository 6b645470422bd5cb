"""A fault-injection HTTP proxy that tests put between a client and an OpenAI-compatible server.

`FaultProxy(upstream)` listens on 127.0.0.1 and relays HTTP/1.1 requests to a real vLLM server or
the in-process fake (`fake_openai.py`) until a test asks it to misbehave: hold a request (stall),
hang up without answering (drop), answer an error status, cut a body short (truncate), answer
200 with a body that is not JSON (garbage), or stop listening altogether (down). Faults are armed
from the test's own thread (`inject`, `schedule`, `down`/`up`, `clear`) and counted, so a test
can check what the client under test saw against what was done to it.

The client side is raw asyncio streams, so a fault controls exactly which bytes leave the socket;
the upstream side is httpx. The proxy runs in its own thread with its own event loop, in the
style of `FakeOpenAIServer`. Responses are buffered whole before they are relayed, so a streamed
(SSE) upstream reply arrives at the client in one piece.

It is a test harness and must never be used by the daemon, imported by production code, or put
in front of an endpoint that serves real work: it reads every request and may throw any of them
away.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import http
import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal, NamedTuple, get_args
from urllib.parse import urlsplit

import httpx

FaultKind = Literal["stall", "drop", "status", "truncate", "garbage", "down"]
KINDS: tuple[FaultKind, ...] = get_args(FaultKind)
# Requests a fault spares unless its `paths` say otherwise: the pool's health checks keep
# seeing the server "up" while its real requests fail.
SPARED_PATHS: tuple[str, ...] = ("/health", "/v1/models")
ALL_PATHS: tuple[str, ...] = ("*",)

_HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate",
    b"proxy-authorization", b"te", b"trailer", b"trailers", b"transfer-encoding", b"upgrade",
})
_HEAD_LIMIT = 1 << 20  # bytes of request line + headers
_POLL_S = 0.02  # how often a held request checks for its release or a client hang-up
_CALL_TIMEOUT_S = 10.0
GARBAGE_BODY = b'{"id": "chatcmpl-injected", "choices": [{"message": <injected fault: not JSON'


@dataclass(frozen=True)
class Fault:
    """One armed fault. `count`: the next N matching requests (None: no limit). `duration`:
    seconds the fault stays armed from when it is injected (None: until `count` is used up or
    `clear()`); for `down`, how long the proxy stays down (None: until `up()`/`clear()`).
    `seconds`: `stall` only, how long each request is held before it is forwarded (None: until
    the fault ends by `clear()`, its duration or the next schedule phase, or the client hangs
    up). `status`: `status` only (default 500). `paths`: glob patterns of the paths hit
    (None: all but `SPARED_PATHS`; `ALL_PATHS`: every path); not for `down`."""

    kind: FaultKind
    count: int | None = None
    duration: float | None = None
    seconds: float | None = None
    status: int | None = None
    paths: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        kind = "down" if self.kind == "die" else self.kind
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {', '.join(KINDS)}")
        object.__setattr__(self, "kind", kind)
        if isinstance(self.paths, str):
            object.__setattr__(self, "paths", (self.paths,))
        elif self.paths is not None:
            object.__setattr__(self, "paths", tuple(self.paths))
        if self.count is not None and self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")
        for name in ("duration", "seconds"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.seconds is not None and kind != "stall":
            raise ValueError(f"seconds is the hold of a stall; a {kind} fault lasts `duration`")
        if kind == "status":
            status = 500 if self.status is None else self.status
            if not 200 <= status <= 599:
                raise ValueError(f"status must be 200..599, got {status}")
            object.__setattr__(self, "status", status)
        elif self.status is not None:
            raise ValueError(f"status is for `status` faults, not {kind}")
        if kind == "down" and (self.count is not None or self.paths is not None):
            raise ValueError("a down fault closes the whole proxy: no count, no paths")

    def matches(self, path: str) -> bool:
        if self.paths is None:
            return path not in SPARED_PATHS
        return any(fnmatchcase(path, pattern) for pattern in self.paths)


# A schedule phase: (start offset in seconds from `schedule()`, the fault to arm then).
Phase = tuple[float, Fault]


class RequestRecord(NamedTuple):
    """One request as the proxy handled it. `outcome`: the fault kind applied, "ok" (relayed
    untouched) or "upstream-error" (the upstream failed; the client got a 502). `status`: what
    the client was sent, None when it got no status line."""

    t: float  # seconds since start()
    path: str
    outcome: str
    status: int | None


@dataclass(eq=False)
class _Armed:
    fault: Fault
    remaining: int | None
    expires: float | None  # time.monotonic()
    generation: int  # a clear() ends every fault armed before it
    released: bool = False

    def ended(self, now: float) -> bool:
        return self.released or (self.expires is not None and now >= self.expires)


@dataclass
class _Request:
    method: str
    target: str  # origin-form: /path?query
    path: str
    headers: list[tuple[bytes, bytes]]
    body: bytes | None
    keep_alive: bool
    logged: bool = False


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


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
        self._lock = threading.Lock()  # guards the armed faults and the counters
        self._armed: list[_Armed] = []
        self._generation = 0
        self._seen = 0
        self._forwarded = 0
        self._connections = 0
        self._applied: Counter[str] = Counter()
        self._log: list[RequestRecord] = []
        self._t0 = time.monotonic()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Loop-side state, touched only on the proxy's loop.
        self._stopping: asyncio.Event | None = None
        self._client: httpx.AsyncClient | None = None
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
        self._t0 = time.monotonic()
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
        # `verify` matters only for an https upstream; for plain http, False spares loading the
        # CA bundle, which can take a second on a busy machine.
        self._client = httpx.AsyncClient(timeout=None, trust_env=False,
                                         verify=self.upstream.startswith("https:"),
                                         limits=httpx.Limits(max_connections=256))
        # Relay the client's own Accept/Accept-Encoding/User-Agent, not httpx's defaults (an
        # Accept-Encoding the client never sent would hand it a body it cannot decode).
        for name in ("accept", "accept-encoding", "user-agent"):
            del self._client.headers[name]
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
            await self._client.aclose()

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
            self._arm(fault)
        return fault

    def clear(self) -> None:
        """Ends every fault and schedule, releases held requests and brings the proxy up."""
        self._release_all()
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
        return self._seen

    @property
    def requests_forwarded(self) -> int:
        return self._forwarded

    @property
    def connections(self) -> int:
        """Client connections accepted (keep-alive: several requests share one)."""
        return self._connections

    @property
    def faults_applied(self) -> Counter[str]:
        """Requests each fault kind was applied to; for `down`, the outages."""
        with self._lock:
            return Counter(self._applied)

    @property
    def log(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._log)

    # ---- fault table (any thread, under the lock) --------------------------------------------

    def _arm(self, fault: Fault) -> _Armed:
        expires = None if fault.duration is None else time.monotonic() + fault.duration
        with self._lock:
            armed = _Armed(fault, fault.count, expires, self._generation)
            self._armed.append(armed)
        return armed

    def _take(self, path: str) -> _Armed | None:
        now = time.monotonic()
        with self._lock:
            self._seen += 1
            self._armed = [a for a in self._armed if not a.ended(now)]
            for armed in self._armed:
                if armed.fault.matches(path):
                    if armed.remaining is not None:
                        armed.remaining -= 1
                        if armed.remaining == 0:
                            self._armed.remove(armed)
                    self._applied[armed.fault.kind] += 1
                    return armed
        return None

    def _release(self, armed: _Armed) -> None:
        with self._lock:
            armed.released = True
            if armed in self._armed:
                self._armed.remove(armed)

    def _release_all(self) -> None:
        with self._lock:
            self._generation += 1
            for armed in self._armed:
                armed.released = True
            self._armed.clear()

    def _record(self, req: _Request, outcome: str, status: int | None) -> None:
        req.logged = True
        with self._lock:
            self._log.append(RequestRecord(time.monotonic() - self._t0, req.path, outcome, status))

    def _live(self, armed: _Armed) -> bool:
        return not armed.ended(time.monotonic()) and armed.generation == self._generation

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
                                                      limit=_HEAD_LIMIT)
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
            with self._lock:
                self._applied["down"] += 1
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
        self._release_all()
        await self._go_up()

    async def _play(self, phases: list[Phase]) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._schedules.add(task)
        try:
            start = time.monotonic()
            current: _Armed | Literal["down"] | None = None
            for at, fault in phases:
                await asyncio.sleep(max(0.0, start + at - time.monotonic()))
                if current == "down":
                    await self._go_up()
                elif current is not None:
                    self._release(current)
                if fault.kind == "down":
                    await self._go_down(fault.duration)
                    current = "down"
                else:
                    current = self._arm(fault)
            if phases and phases[-1][1].duration is not None:
                at, fault = phases[-1]
                await asyncio.sleep(max(0.0, start + at + (fault.duration or 0) - time.monotonic()))
                # Done means ended: up again, or the last fault disarmed (its own timers may
                # lag this wake-up by a poll).
                if current == "down":
                    await self._go_up()
                elif current is not None:
                    self._release(current)
        finally:
            self._schedules.discard(task)

    def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._accepting or self._loop is None:  # accepted just before going down
            writer.transport.abort()
            return
        self._connections += 1
        task = self._loop.create_task(self._serve_connection(reader, writer))
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

    # ---- one client connection -----------------------------------------------------------------

    async def _serve_connection(self, reader: asyncio.StreamReader,
                                writer: asyncio.StreamWriter) -> None:
        current: _Request | None = None
        try:
            while True:
                try:
                    current = await self._read_request(reader, writer)
                except _BadRequest as exc:
                    writer.write(_error_response(exc.status, str(exc), close=True))
                    break
                if current is None:
                    break
                keep_alive = await self._handle(current, reader, writer)
                current = None
                if not keep_alive:
                    break
        except asyncio.CancelledError:
            if current is not None and not current.logged and self._down:
                self._record(current, "down", None)
            writer.transport.abort()
            raise
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            writer.transport.abort()
            return
        await _close(writer)

    async def _read_request(self, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> _Request | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None  # the client hung up between requests
        except asyncio.LimitOverrunError:
            raise _BadRequest(431, "request head too large") from None
        lines = head[:-4].split(b"\r\n")
        try:
            method, target, version = lines[0].decode("latin-1").split(" ")
        except ValueError:
            raise _BadRequest(400, "malformed request line") from None
        if not version.startswith("HTTP/1."):
            raise _BadRequest(505, f"{version} is not HTTP/1.x")
        headers: list[tuple[bytes, bytes]] = []
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                raise _BadRequest(400, "malformed header line")
            headers.append((name, value.strip()))
        values = _header_values(headers)
        if b"transfer-encoding" in values:
            raise _BadRequest(411, "chunked request bodies are not supported; send Content-Length")
        lengths = set(values.get(b"content-length", []))
        if len(lengths) > 1 or not all(v.isdigit() for v in lengths):
            raise _BadRequest(400, "bad Content-Length")
        if b"100-continue" in [v.lower() for v in values.get(b"expect", [])]:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits for it on big bodies
        body = await reader.readexactly(int(lengths.pop())) if lengths else None
        tokens = {t.strip().lower() for v in values.get(b"connection", []) for t in v.split(b",")}
        keep_alive = version == "HTTP/1.1" and b"close" not in tokens
        parts = urlsplit(target)  # origin-form, or absolute-form from a proxy-minded client
        path = parts.path or "/"
        origin = path + (f"?{parts.query}" if parts.query else "")
        dropped = _HOP_BY_HOP | tokens | {b"host", b"content-length", b"expect"}
        forwarded = [(n, v) for n, v in headers if n.lower() not in dropped]
        return _Request(method, origin, path, forwarded, body, keep_alive)

    async def _handle(self, req: _Request, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> bool:
        """Answers one request; returns whether the connection stays open."""
        armed = self._take(req.path)
        kind = armed.fault.kind if armed is not None else None
        if kind == "drop":
            self._record(req, "drop", None)
            return False  # the caller closes: a FIN with no response bytes before it
        # Each request is logged before its reply leaves, so a client that has its answer
        # finds it in the log.
        if kind == "status":
            assert armed is not None and armed.fault.status is not None
            status = armed.fault.status
            extra = [(b"Retry-After", b"1")] if status == 429 else []
            self._record(req, "status", status)
            writer.write(_error_response(status, f"injected fault: HTTP {status} on {req.path}",
                                         close=not req.keep_alive, extra=extra))
            await writer.drain()
            return req.keep_alive
        if kind == "garbage":
            self._record(req, "garbage", 200)
            writer.write(_response(200, [(b"Content-Type", b"application/json")], GARBAGE_BODY,
                                   close=not req.keep_alive))
            await writer.drain()
            return req.keep_alive
        if kind == "stall":
            assert armed is not None
            if not await self._hold(reader, armed):
                self._record(req, "stall", None)
                return False
        status, headers, body = await self._forward(req)
        if headers is None and self.upstream_failure == "drop":
            self._record(req, "upstream-error", None)
            return False  # closed without an answer, like the dead upstream's own socket
        self._record(req, kind or ("upstream-error" if headers is None else "ok"), status)
        if headers is None:  # the upstream failed: body is our error reply
            writer.write(_error_response(status, body.decode(), close=not req.keep_alive))
        elif kind == "truncate":
            # The full Content-Length, half the body, then FIN: the client sees a short body.
            cut = len(body) // 2
            declared = max(len(body), cut + 1)
            writer.write(_head(status, [*headers, (b"Content-Length", str(declared).encode())],
                               close=True) + body[:cut])
        else:
            no_body = status < 200 or status in (204, 304) or req.method == "HEAD"
            writer.write(_response(status, headers, b"" if no_body else body,
                                   close=not req.keep_alive, length=not no_body))
        await writer.drain()
        return req.keep_alive and kind != "truncate"

    async def _hold(self, reader: asyncio.StreamReader, armed: _Armed) -> bool:
        """Holds a stalled request; False if the client hung up meanwhile."""
        seconds = armed.fault.seconds
        deadline = None if seconds is None else time.monotonic() + seconds
        while deadline is None or time.monotonic() < deadline:
            if reader.at_eof() or reader.exception() is not None:
                return False
            if not self._live(armed):
                break
            await asyncio.sleep(_POLL_S)
        return True

    async def _forward(self, req: _Request) -> tuple[int, list[tuple[bytes, bytes]] | None, bytes]:
        """Relays a request; returns (status, headers to relay, raw body), or (502, None,
        message) when the upstream could not be reached or broke off."""
        assert self._client is not None
        request = self._client.build_request(req.method, self.upstream + req.target,
                                             headers=req.headers, content=req.body)
        with self._lock:
            self._forwarded += 1
        try:
            resp = await self._client.send(request, stream=True)
            try:
                body = b"".join([chunk async for chunk in resp.aiter_raw()])
            finally:
                await resp.aclose()
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            return 502, None, f"fault proxy: upstream failed: {type(exc).__name__}: {exc}".encode()
        # aiter_raw keeps any Content-Encoding, so that header travels with the bytes.
        drop = _HOP_BY_HOP | {b"content-length"}
        headers = [(n, v) for n, v in resp.headers.raw if n.lower() not in drop]
        if req.method == "HEAD" and "content-length" in resp.headers:
            headers.append((b"Content-Length", resp.headers["content-length"].encode()))
        return resp.status_code, headers, body


# ---- bytes on the wire -----------------------------------------------------------------------


def _header_values(headers: list[tuple[bytes, bytes]]) -> dict[bytes, list[bytes]]:
    values: dict[bytes, list[bytes]] = {}
    for name, value in headers:
        values.setdefault(name.lower(), []).append(value)
    return values


def _head(status: int, headers: list[tuple[bytes, bytes]], *, close: bool) -> bytes:
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    lines = [f"HTTP/1.1 {status} {reason}".encode("latin-1")]
    lines += [name + b": " + value for name, value in headers]
    if close:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _response(status: int, headers: list[tuple[bytes, bytes]], body: bytes, *, close: bool,
              length: bool = True) -> bytes:
    if length:
        headers = [*headers, (b"Content-Length", str(len(body)).encode())]
    return _head(status, headers, close=close) + body


def _error_response(status: int, message: str, *, close: bool,
                    extra: list[tuple[bytes, bytes]] | None = None) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "injected_fault" if
                                 message.startswith("injected fault") else "proxy_error",
                                 "code": status}}).encode()
    headers = [(b"Content-Type", b"application/json"), *(extra or [])]
    return _response(status, headers, body, close=close)


async def _close(writer: asyncio.StreamWriter) -> None:
    """Flushes and closes with a FIN; a client that stops reading gets an abort instead."""
    if writer.transport.is_closing():
        return
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), 1.0)
    except (TimeoutError, ConnectionError, OSError):
        writer.transport.abort()


# ---- shell ---------------------------------------------------------------------------------------


def _parse_fault(spec: str, count: int | None, duration: float | None,
                 paths: tuple[str, ...] | None) -> Fault:
    kind, _, arg = spec.partition(":")
    kind = "down" if kind == "die" else kind
    if kind == "status":
        return Fault("status", count=count, duration=duration, status=int(arg or 500),
                     paths=paths)
    if kind == "stall":
        return Fault("stall", count=count, duration=duration,
                     seconds=float(arg) if arg else None, paths=paths)
    if kind == "down":
        return Fault("down", duration=float(arg) if arg else duration)
    if arg:
        raise ValueError(f"{kind} takes no argument")
    return Fault(kind, count=count, duration=duration, paths=paths)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m spade_async.testing.faults --upstream URL --port P [--fault KIND[:ARG] ...]`:
    the proxy from a shell, one line per request. KIND[:ARG]: stall[:SECONDS], drop,
    status[:CODE], truncate, garbage, down[:SECONDS] (alias die). Faults apply in the order
    given, each to --count requests (default: every request, so only the first applies)."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--upstream", required=True, help="e.g. http://127.0.0.1:8000")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--fault", action="append", default=[], metavar="KIND[:ARG]")
    ap.add_argument("--count", type=int, default=None, help="requests each fault applies to")
    ap.add_argument("--duration", type=float, default=None, help="seconds each fault stays armed")
    ap.add_argument("--all-paths", action="store_true",
                    help=f"faults hit {', '.join(SPARED_PATHS)} too")
    args = ap.parse_args(argv)
    paths = ALL_PATHS if args.all_paths else None
    try:
        faults = [_parse_fault(s, args.count, args.duration, paths) for s in args.fault]
    except ValueError as exc:
        ap.error(str(exc))
    # Ctrl-C stops it even when started with SIGINT ignored (a background job of a
    # non-interactive shell inherits SIG_IGN, and Python then installs no handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with FaultProxy(args.upstream, args.port) as proxy:
        print(f"fault proxy on {proxy.base_url} -> {proxy.upstream}", flush=True)
        for fault in faults:
            proxy.inject(fault)
        shown = 0
        try:
            while True:
                time.sleep(0.1)
                records = proxy.log
                for rec in records[shown:]:
                    status = "-" if rec.status is None else str(rec.status)
                    print(f"{rec.t:9.3f}s {rec.outcome:>14} {status:>4} {rec.path}", flush=True)
                shown = len(records)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
