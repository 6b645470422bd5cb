"""One client connection through the fault proxy: each request on it gets the armed fault (dropped,
answered with an error status or garbage, held, cut short) or the upstream's answer untouched. The
upstream side is httpx; responses are buffered whole before they are relayed, so a streamed
(SSE) upstream reply arrives at the client in one piece."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Literal

import httpx

from spade_async.testing.faults import wire
from spade_async.testing.faults.table import Armed, FaultTable

_POLL_S = 0.02  # how often a held request checks for its release or a client hang-up


class Relay:
    """Owns the upstream client; made and closed on the proxy's event loop."""

    def __init__(self, upstream: str, upstream_failure: Literal["502", "drop"],
                 table: FaultTable) -> None:
        self.upstream, self.upstream_failure, self._table = upstream, upstream_failure, table
        # `verify` matters only for an https upstream; for plain http, False spares loading the
        # CA bundle, which can take a second on a busy machine.
        self._client = httpx.AsyncClient(timeout=None, trust_env=False,
                                         verify=upstream.startswith("https:"),
                                         limits=httpx.Limits(max_connections=256))
        # Relay the client's own Accept/Accept-Encoding/User-Agent, not httpx's defaults (an
        # Accept-Encoding the client never sent would hand it a body it cannot decode).
        for name in ("accept", "accept-encoding", "user-agent"):
            del self._client.headers[name]

    async def aclose(self) -> None:
        await self._client.aclose()

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                               *, is_down: Callable[[], bool]) -> None:
        """Answers the connection's requests until one closes it or the client hangs up.
        `is_down`: whether the proxy went down, so a request cut off by that is logged as
        "down"."""
        current: wire.Request | None = None
        try:
            while True:
                try:
                    current = await wire.read_request(reader, writer)
                except wire.BadRequest as exc:
                    writer.write(wire.error_response(exc.status, str(exc), close=True))
                    break
                if current is None:
                    break
                keep_alive = await self.handle(current, reader, writer)
                current = None
                if not keep_alive:
                    break
        except asyncio.CancelledError:
            if current is not None and not current.logged and is_down():
                self._table.record(current, "down", None)
            writer.transport.abort()
            raise
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            writer.transport.abort()
            return
        await wire.close(writer)

    async def handle(self, req: wire.Request, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> bool:
        """Answers one request; returns whether the connection stays open."""
        armed = self._table.take(req.path)
        kind = armed.fault.kind if armed is not None else None
        if kind == "drop":
            self._table.record(req, "drop", None)
            return False  # the caller closes: a FIN with no response bytes before it
        # Each request is logged before its reply leaves, so a client that has its answer
        # finds it in the log.
        if kind == "status":
            assert armed is not None and armed.fault.status is not None
            status = armed.fault.status
            extra = [(b"Retry-After", b"1")] if status == 429 else []
            self._table.record(req, "status", status)
            writer.write(wire.error_response(status, f"injected fault: HTTP {status} on "
                                             f"{req.path}", close=not req.keep_alive,
                                             extra=extra))
            await writer.drain()
            return req.keep_alive
        if kind == "garbage":
            self._table.record(req, "garbage", 200)
            writer.write(wire.response(200, [(b"Content-Type", b"application/json")],
                                       wire.GARBAGE_BODY, close=not req.keep_alive))
            await writer.drain()
            return req.keep_alive
        if kind == "stall":
            assert armed is not None
            if not await self._hold(reader, armed):
                self._table.record(req, "stall", None)
                return False
        status, headers, body = await self._forward(req)
        if headers is None and self.upstream_failure == "drop":
            self._table.record(req, "upstream-error", None)
            return False  # closed without an answer, like the dead upstream's own socket
        self._table.record(req, kind or ("upstream-error" if headers is None else "ok"), status)
        if headers is None:  # the upstream failed: body is our error reply
            writer.write(wire.error_response(status, body.decode(), close=not req.keep_alive))
        elif kind == "truncate":
            # The full Content-Length, half the body, then FIN: the client sees a short body.
            cut = len(body) // 2
            declared = max(len(body), cut + 1)
            writer.write(wire.head(status, [*headers,
                                            (b"Content-Length", str(declared).encode())],
                                   close=True) + body[:cut])
        else:
            no_body = status < 200 or status in (204, 304) or req.method == "HEAD"
            writer.write(wire.response(status, headers, b"" if no_body else body,
                                       close=not req.keep_alive, length=not no_body))
        await writer.drain()
        return req.keep_alive and kind != "truncate"

    async def _hold(self, reader: asyncio.StreamReader, armed: Armed) -> bool:
        """Holds a stalled request; False if the client hung up meanwhile."""
        seconds = armed.fault.seconds
        deadline = None if seconds is None else time.monotonic() + seconds
        while deadline is None or time.monotonic() < deadline:
            if reader.at_eof() or reader.exception() is not None:
                return False
            if not self._table.live(armed):
                break
            await asyncio.sleep(_POLL_S)
        return True

    async def _forward(self, req: wire.Request
                       ) -> tuple[int, list[tuple[bytes, bytes]] | None, bytes]:
        """Relays a request; returns (status, headers to relay, raw body), or (502, None,
        message) when the upstream could not be reached or broke off."""
        request = self._client.build_request(req.method, self.upstream + req.target,
                                             headers=req.headers, content=req.body)
        self._table.count_forwarded()
        try:
            resp = await self._client.send(request, stream=True)
            try:
                body = b"".join([chunk async for chunk in resp.aiter_raw()])
            finally:
                await resp.aclose()
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            return 502, None, f"fault proxy: upstream failed: {type(exc).__name__}: {exc}".encode()
        # aiter_raw keeps any Content-Encoding, so that header travels with the bytes.
        drop = wire.HOP_BY_HOP | {b"content-length"}
        headers = [(n, v) for n, v in resp.headers.raw if n.lower() not in drop]
        if req.method == "HEAD" and "content-length" in resp.headers:
            headers.append((b"Content-Length", resp.headers["content-length"].encode()))
        return resp.status_code, headers, body
