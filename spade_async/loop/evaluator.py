"""Held-out evaluation beside the loop: every `eval.every_versions`-th published version."""

from __future__ import annotations

import anyio

from spade_async.core.logs import get_logger
from spade_async.inference.roles import RoleRoute
from spade_async.loop.context import LoopContext
from spade_async.loop.failures import failure_kind

log = get_logger("daemon")


async def evaluate_versions(ctx: LoopContext) -> None:
    """Held-out evaluation of every `eval.every_versions`-th published version (version 0,
    the base model, included), in the background: its requests share the pool with the
    loop's, at `eval.concurrency`, and a failure is logged, never raised into the loop.
    Versions already in <data_dir>/eval/results.jsonl are not evaluated again."""
    from spade_async.evals.base import load_results
    from spade_async.evals.bfcl import BfclSetupError
    from spade_async.evals.run import evaluate_version

    cfg = ctx.cfg
    every = cfg.eval.every_versions
    done = {int(r.get("version", -1)) for r in load_results(cfg.paths.data_dir)
            if not r.get("external")}
    # The periodic evaluation is of the policy: roles.eval's route, unless that names
    # another model (`spade eval --model`'s business), then the agent's endpoints.
    route = ctx.routes["eval"]
    if route.model is not None:
        route = RoleRoute("eval", ctx.routes["agent"].group, None, "tokens")
    while True:
        ctx.policy.refresh()
        version, model = ctx.policy.version, ctx.policy.model
        if version % every == 0 and version not in done:
            done.add(version)
            ctx.in_flight["evals"] += 1
            try:
                results = await evaluate_version(
                    cfg, ctx.pool, ctx.chat, version=version, model=model,
                    suites=cfg.eval.suites, sandbox=ctx.sandbox, route=route,
                    progress=lambda m: log.info("eval_progress", detail=m))
                ctx.counters["evals"] += 1
                for r in results:
                    log.info("evaluated", **r.summary())
            except Exception as exc:  # an evaluation never stops the self-play loop...
                kind = "setup" if isinstance(exc, BfclSetupError) else failure_kind(exc)
                if kind is None:
                    raise  # ...but a bug in it does: fail fast, with its traceback
                ctx.counters["eval_failures"] += 1
                ctx.failures.count("eval", kind, exc, version=version)
            finally:
                ctx.in_flight["evals"] -= 1
        await anyio.sleep(cfg.daemon.status_interval_s)
