"""The sandbox's errors: what a failed sandbox call raises, and the cases callers tell apart
(the environment's own exception; no worker could be started at all; the node running the
worker was lost). They pickle with their kind, so a remote sandbox node raises them as is."""

from __future__ import annotations


class SandboxError(RuntimeError):
    """A sandbox call failed. `kind`: timeout, crashed, exception, syntax, contract, protocol,
    output_limit, closed, node_lost. The message is what a person (or the validator's report)
    reads."""

    def __init__(self, kind: str, message: str, traceback: str = "") -> None:
        super().__init__(message)
        self.kind, self.traceback = kind, traceback

    def __reduce__(self):  # the default would call cls(message) and lose the kind
        return type(self), (self.kind, str(self), self.traceback)


class EnvException(SandboxError):
    """The environment's own code raised; the worker survives and reports it."""


class WorkerStartError(SandboxError):
    """No worker could be started for the environment: the host's fault (processes, memory,
    namespaces), never the environment's, so it is no verdict on the code."""


class SandboxNodeLost(WorkerStartError):
    """The node that ran (or was to run) the worker is gone or stopped answering (a Ray
    sandbox node died, its actor crashed, a remote call missed its deadline). Like an endpoint
    failure: the host's fault, no verdict on the environment, worth another try elsewhere;
    an episode it cuts short is never scored. `node`: the lost node's id, when known."""

    def __init__(self, message: str, node: str | None = None) -> None:
        super().__init__("node_lost", message)
        self.node = node

    def __reduce__(self):
        return type(self), (str(self), self.node)
