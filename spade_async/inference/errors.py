"""The pool's error contract: what leaves `EndpointPool` when a request goes wrong.

One error contract: whatever goes wrong with a request leaves the pool as an `EndpointError`
subclass naming the endpoint, the attempts made and the seconds spent, with a `kind` that
callers count failures by. No bare `TimeoutError` or httpx exception gets out.
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

import httpx


class EndpointError(RuntimeError):
    """Base of what the pool raises; the message names the endpoint and what went wrong.

    `endpoint` is the server that failed last (None when none was reached), `attempts` the
    tries made, `elapsed_s` the seconds since the request started; `kind` is a short label for
    counters (deadline, timeout, connection, http_5xx, http_429, malformed, no_endpoint, ...)."""

    kind = "endpoint"

    def __init__(self, message: str, *, endpoint: str | None = None, attempts: int = 0,
                 elapsed_s: float = 0.0) -> None:
        super().__init__(message)
        self.endpoint, self.attempts, self.elapsed_s = endpoint, attempts, elapsed_s


class EndpointRequestError(EndpointError):
    """The server refused the request itself (4xx): retrying elsewhere would not help."""

    kind = "rejected"

    def __init__(self, endpoint: str, status: int, detail: str, *, attempts: int = 1,
                 elapsed_s: float = 0.0) -> None:
        super().__init__(f"endpoint '{endpoint}' rejected the request with HTTP {status}: "
                         f"{detail}", endpoint=endpoint, attempts=attempts, elapsed_s=elapsed_s)
        self.status, self.detail = status, detail


class ModelNotServed(EndpointRequestError):
    """Every endpoint that is up lists its models, and none serves the one asked for."""

    kind = "model_not_served"

    def __init__(self, model: str, served: list[str]) -> None:
        super().__init__("pool", 404, f"model '{model}' is not served by any endpoint "
                         f"(served: {', '.join(served) or 'nothing'})")


class EndpointCapabilityError(EndpointError):
    """The server answered, but without what the caller needs (token ids, log-probs)."""

    kind = "capability"


class EndpointUnavailable(EndpointError):
    """No endpoint could serve the request within the attempts and deadline allowed. The
    subclass says how the last attempt failed."""

    kind = "unavailable"


class NoEndpointUp(EndpointUnavailable):
    """No endpoint was up (or had a free slot) within `wait_for_endpoint_s`."""

    kind = "no_endpoint"


class EndpointConnectionError(EndpointUnavailable):
    """The connection failed: refused, reset, or closed before a whole answer."""

    kind = "connection"


class EndpointTimeout(EndpointUnavailable):
    """An attempt got no answer within its timeout."""

    kind = "timeout"


class EndpointServerError(EndpointUnavailable):
    """The server answered 5xx or 429 (overloaded) on the last attempt."""

    kind = "http_5xx"

    def __init__(self, message: str, *, status: int, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.status = status
        if status == 429:
            self.kind = "http_429"


class EndpointMalformedResponse(EndpointUnavailable):
    """The server answered 2xx with a body that is not the expected JSON."""

    kind = "malformed"


class EndpointDeadlineExceeded(EndpointUnavailable):
    """The request's own deadline (`deadline_s`, retries included) passed."""

    kind = "deadline"


class Retryable(Exception):
    """One attempt failed in a way another attempt may not (timeout, connection, 429, 5xx, a
    malformed body): the pool retries it and, when attempts run out, raises `cls`. Never
    leaves the inference package."""

    def __init__(self, kind: type[EndpointUnavailable], reason: str, status: int = 0,
                 retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.cls, self.reason, self.status, self.retry_after = kind, reason, status, retry_after


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds a Retry-After header asks for: delta-seconds or an HTTP date; None if absent
    or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def detail(resp: httpx.Response) -> str:
    """The server's own words for a failed response, at most 300 characters."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:300] or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message", body)))
        if isinstance(err, dict):
            err = err.get("message", err)
        return str(err)[:300]
    return str(body)[:300]


def describe(exc: BaseException) -> str:
    """A transport or HTTP failure in one line, for logs and error messages."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}: {detail(exc.response)}"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"
