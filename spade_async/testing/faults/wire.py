"""HTTP/1.1 on the client's side of the fault proxy, as raw bytes: reading one request off an
asyncio stream and composing the status line, headers and bodies the proxy sends back. Raw
streams, so a fault controls exactly which bytes leave the socket; no policy about faults here."""

from __future__ import annotations

import asyncio
import http
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate",
    b"proxy-authorization", b"te", b"trailer", b"trailers", b"transfer-encoding", b"upgrade",
})
HEAD_LIMIT = 1 << 20  # bytes of request line + headers
GARBAGE_BODY = b'{"id": "chatcmpl-injected", "choices": [{"message": <injected fault: not JSON'


@dataclass
class Request:
    """One request as read off the client's connection, its headers ready to forward."""

    method: str
    target: str  # origin-form: /path?query
    path: str
    headers: list[tuple[bytes, bytes]]
    body: bytes | None
    keep_alive: bool
    logged: bool = False


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_request(reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> Request | None:
    """The next request on the connection; None when the client hung up between requests.
    Raises `BadRequest` with the status to answer for one this proxy will not relay."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None  # the client hung up between requests
    except asyncio.LimitOverrunError:
        raise BadRequest(431, "request head too large") from None
    lines = head[:-4].split(b"\r\n")
    try:
        method, target, version = lines[0].decode("latin-1").split(" ")
    except ValueError:
        raise BadRequest(400, "malformed request line") from None
    if not version.startswith("HTTP/1."):
        raise BadRequest(505, f"{version} is not HTTP/1.x")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise BadRequest(400, "malformed header line")
        headers.append((name, value.strip()))
    values = _header_values(headers)
    if b"transfer-encoding" in values:
        raise BadRequest(411, "chunked request bodies are not supported; send Content-Length")
    lengths = set(values.get(b"content-length", []))
    if len(lengths) > 1 or not all(v.isdigit() for v in lengths):
        raise BadRequest(400, "bad Content-Length")
    if b"100-continue" in [v.lower() for v in values.get(b"expect", [])]:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits for it on big bodies
    body = await reader.readexactly(int(lengths.pop())) if lengths else None
    tokens = {t.strip().lower() for v in values.get(b"connection", []) for t in v.split(b",")}
    keep_alive = version == "HTTP/1.1" and b"close" not in tokens
    parts = urlsplit(target)  # origin-form, or absolute-form from a proxy-minded client
    path = parts.path or "/"
    origin = path + (f"?{parts.query}" if parts.query else "")
    dropped = HOP_BY_HOP | tokens | {b"host", b"content-length", b"expect"}
    forwarded = [(n, v) for n, v in headers if n.lower() not in dropped]
    return Request(method, origin, path, forwarded, body, keep_alive)


def _header_values(headers: list[tuple[bytes, bytes]]) -> dict[bytes, list[bytes]]:
    values: dict[bytes, list[bytes]] = {}
    for name, value in headers:
        values.setdefault(name.lower(), []).append(value)
    return values


def head(status: int, headers: list[tuple[bytes, bytes]], *, close: bool) -> bytes:
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    lines = [f"HTTP/1.1 {status} {reason}".encode("latin-1")]
    lines += [name + b": " + value for name, value in headers]
    if close:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def response(status: int, headers: list[tuple[bytes, bytes]], body: bytes, *, close: bool,
             length: bool = True) -> bytes:
    if length:
        headers = [*headers, (b"Content-Length", str(len(body)).encode())]
    return head(status, headers, close=close) + body


def error_response(status: int, message: str, *, close: bool,
                   extra: list[tuple[bytes, bytes]] | None = None) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "injected_fault" if
                                 message.startswith("injected fault") else "proxy_error",
                                 "code": status}}).encode()
    headers = [(b"Content-Type", b"application/json"), *(extra or [])]
    return response(status, headers, body, close=close)


async def close(writer: asyncio.StreamWriter) -> None:
    """Flushes and closes with a FIN; a client that stops reading gets an abort instead."""
    if writer.transport.is_closing():
        return
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), 1.0)
    except (TimeoutError, ConnectionError, OSError):
        writer.transport.abort()
