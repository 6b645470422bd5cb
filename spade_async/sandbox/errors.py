"""The sandbox's errors: what a failed sandbox call raises, and the two cases callers tell apart
(the environment's own exception; no worker could be started at all)."""

from __future__ import annotations


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
