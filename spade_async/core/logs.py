"""structlog set up once per process: JSON lines when stderr is not a terminal, console in one.

Each component logs through `get_logger(name)`, which adds `component`; the context of an
event (env id, episode id, policy version) is passed with the event itself. Tests read logs
with `structlog.testing.capture_logs`.
"""

from __future__ import annotations

import logging
import sys

import structlog

_configured = False


class _StderrLogger:
    """Writes to whatever `sys.stderr` is at call time (pytest and CliRunner swap it), never to
    stdout, which belongs to `--json` output."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


def _stderr_logger(*_args: object) -> _StderrLogger:
    return _StderrLogger()


def configure_logging(level: str = "info", *, json: bool | None = None, force: bool = False) -> None:
    """Idempotent: the first call wins unless force=True (tests and the CLI's --log-json)."""
    global _configured
    if _configured and not force:
        return
    if json is None:
        json = not sys.stderr.isatty()
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer = (
        [structlog.processors.dict_tracebacks, structlog.processors.JSONRenderer()]
        if json
        else [structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())]
    )
    structlog.configure(
        processors=[*shared, *renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
    _configured = True


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(component=name)
