"""Evaluating one policy version: every suite asked for, on the eval role's route, its results
stored under <data_dir>/eval/ (`spade eval` and the daemon's periodic evaluation)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from spade_async.evals import make_suite
from spade_async.evals.base import EvalFailed, EvalPolicy, SuiteResult, run_suite, store_result
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.pool import EndpointPool
from spade_async.inference.roles import RoleRoute, group_has, role_route

if TYPE_CHECKING:
    from spade_async.sandbox.runtime import Sandbox


async def evaluate_version(cfg: Any, pool: EndpointPool, chat: ChatTokens, *, version: int,
                           model: str, suites: Sequence[str], limit: int | None = None,
                           progress: Callable[[str], None] = lambda _: None,
                           sandbox: Sandbox | None = None,
                           route: RoleRoute | None = None) -> list[SuiteResult]:
    """Run each suite against `model` and store its results under <data_dir>/eval/, on
    `route` (default roles.eval's: its endpoint group and path).
    `sandbox`: where the probe suite plays; None opens one for its run. A process that already
    holds a Sandbox (the daemon) must pass it: two in one process share the slot uids, each
    one's orphan reaper counts the other's live workers as its own dying orphans, and its
    used slots never free (its next `open` waits for ever)."""
    ecfg = cfg.eval
    route = route or role_route(cfg, "eval")
    policy = EvalPolicy(pool, chat, model=model, version=version, max_tokens=ecfg.max_tokens,
                        max_seq_len=ecfg.max_seq_len,
                        deadline_s=cfg.rollout.request_deadline_s, path=route.path,
                        group=route.group, tools=group_has(pool, route.group, "tools"))
    out = []
    for name in suites:
        suite = make_suite(name, cfg, sandbox)
        progress(f"{name}: evaluating version {version} ({model})")
        # A suite that holds resources for its run (the probe's sandbox) is a context manager.
        held = suite if isinstance(suite, AbstractAsyncContextManager) else nullcontext()
        async with held:
            result = await run_suite(suite, policy, limit=limit,
                                     concurrency=ecfg.concurrency, progress=progress)
        result.external = route.model is not None
        if result.scored == 0 and result.n:
            # Every task failed on the endpoint: that is no score, and is not stored as one.
            raise EvalFailed(f"{name}: no task got a score; every one of {result.n} failed on "
                             f"the endpoint (first: {result.tasks[0].error})")
        store_result(cfg.paths.data_dir, result)
        out.append(result)
    return out
