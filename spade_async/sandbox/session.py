"""An environment loaded in its worker: `reset`/`step`/`hint`/`solution` as frozen results.
Replies are untrusted: `replies.check_*` validates them here, outside the sandbox."""

from __future__ import annotations

from typing import Any

from spade_async.core.config import SandboxConfig
from spade_async.envs.contract import ContractError, EnvMeta, ResetResult, StepResult
from spade_async.envs.knobs import resolve_params
from spade_async.envs.replies import check_reset, check_step
from spade_async.sandbox.errors import SandboxError
from spade_async.sandbox.worker import Worker


class EnvSession:
    """One loaded environment instance in its own worker; methods return frozen results.
    `worker` is a local `Worker` or a session on a remote sandbox node (ray_pool.RemoteWorker):
    the same `call`, the same ops."""

    def __init__(self, worker: Worker, meta: EnvMeta, cfg: SandboxConfig) -> None:
        self.worker, self.meta, self.cfg = worker, meta, cfg

    @property
    def node(self) -> str | None:
        """The sandbox node running the worker; None for this host."""
        return self.worker.node

    async def _call(self, op: str, **fields: Any) -> Any:
        return await self.worker.call(op, self.cfg.call_timeout_s, **fields)

    async def reset(self, seed: int, params: dict[str, Any] | None = None) -> ResetResult:
        """Start an episode. An environment with knobs always gets every knob's value
        (`params` with the defaults filled in), so its reset never guesses a default; one
        without knobs gets `reset(seed)` as before. A bad `params` is the caller's mistake, not
        the environment's: it raises ContractError before the worker is asked anything."""
        fields: dict[str, Any] = {"seed": int(seed)}
        resolved = resolve_params(self.meta.params, params)
        if self.meta.params:
            fields["params"] = resolved
        return checked(check_reset, await self._call("reset", **fields), "reset")

    async def step(self, action: str) -> StepResult:
        return checked(check_step, await self._call("step", action=str(action)), "step")

    async def hint(self) -> str:
        res = await self._call("hint")
        hint = res.get("hint") if isinstance(res, dict) else None
        if not isinstance(hint, str):
            raise SandboxError("contract", f"hint() must return a str, got {type(hint).__name__}")
        return hint

    async def solution(self) -> list[str]:
        res = await self._call("solution")
        actions = res.get("actions") if isinstance(res, dict) else None
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise SandboxError("contract", "solution() must return a list of str actions")
        return actions


def checked(check, raw: Any, op: str):
    try:
        return check(raw)
    except ContractError as exc:
        raise SandboxError("contract", f"{op}: {exc}") from None

