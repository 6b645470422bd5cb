"""Held-out evaluation beside the loop: every `eval.every_versions`-th published version, and,
when a bounded run asks for it, the version the run stopped on; `eval.bookend_suites` only at
version 0 and that last one."""

from __future__ import annotations

import anyio

from spade_async.core.logs import get_logger
from spade_async.inference.roles import RoleRoute
from spade_async.loop.context import LoopContext
from spade_async.loop.failures import failure_kind

log = get_logger("daemon")


def due_for_evaluation(version: int, every: int, done: set[int]) -> bool:
    """Whether the newest published `version` is evaluated now: when it is an `every`-th
    version, or when the last `every`-th version went by unevaluated while an evaluation ran
    (evaluation slower than training): the newest version then stands in for it, rather than
    the curve losing that point (an older adapter may be retired mid-evaluation)."""
    if version in done:
        return False
    if version % every == 0:
        return True
    missed = version - version % every
    return missed not in done and missed > max(done, default=-1)


class Evaluator:
    """Held-out evaluation of every `eval.every_versions`-th published version (version 0,
    the base model, included; the newest one when an evaluation outlasted that version), in
    the background: its requests share the pool with the
    loop's, at `eval.concurrency`, and a failure is logged, never raised into the loop.
    Versions already in <data_dir>/eval/results.jsonl are not evaluated again."""

    def __init__(self, ctx: LoopContext) -> None:
        self.ctx = ctx
        self._done: dict[int, set[str]] | None = None  # version -> the suites stored for it
        self._lock = anyio.Lock()

    def _evaluated(self) -> dict[int, set[str]]:
        if self._done is None:
            from spade_async.evals.base import load_results

            self._done = {}
            for r in load_results(self.ctx.cfg.paths.data_dir):
                if not r.get("external"):
                    self._done.setdefault(int(r.get("version", -1)), set()).add(
                        str(r.get("suite", "")))
        return self._done

    def suites_for(self, version: int, *, final: bool = False) -> list[str]:
        """The suites `version` is evaluated on: eval.suites, and eval.bookend_suites at
        version 0 and at the version a bounded run stopped on; less those already stored."""
        ecfg = self.ctx.cfg.eval
        wanted = list(ecfg.suites)
        if version == 0 or final:
            wanted += [s for s in ecfg.bookend_suites if s not in wanted]
        done = self._evaluated().get(version, set())
        return [s for s in wanted if s not in done]

    async def run(self) -> None:
        every = self.ctx.cfg.eval.every_versions
        while True:
            self.ctx.policy.refresh()
            if due_for_evaluation(self.ctx.policy.version, every, set(self._evaluated())):
                await self.evaluate_current()
            await anyio.sleep(self.ctx.cfg.daemon.status_interval_s)

    async def evaluate_current(self, *, final: bool = False) -> None:
        """The newest published version on the suites it has not been evaluated on (`final`:
        the version a bounded run stopped on, with the bookend suites)."""
        from spade_async.evals.run import evaluate_version
        from spade_async.evals.worker import WorkerSetupError

        ctx = self.ctx
        async with self._lock:  # the loop's and a final evaluation never run the same twice
            ctx.policy.refresh()
            version, model = ctx.policy.version, ctx.policy.model
            suites = self.suites_for(version, final=final)
            if not suites:
                return
            self._evaluated().setdefault(version, set()).update(suites)
            # The periodic evaluation is of the policy: roles.eval's route, unless that names
            # another model (`spade eval --model`'s business), then the agent's endpoints.
            route = ctx.routes["eval"]
            if route.model is not None:
                route = RoleRoute("eval", ctx.routes["agent"].group, None, "tokens")
            ctx.in_flight["evals"] += 1
            try:
                results = await evaluate_version(
                    ctx.cfg, ctx.pool, ctx.chat, version=version, model=model,
                    suites=suites, sandbox=ctx.sandbox, route=route,
                    progress=lambda m: log.info("eval_progress", detail=m))
                ctx.counters["evals"] += 1
                for r in results:
                    log.info("evaluated", **r.summary())
            except Exception as exc:  # an evaluation never stops the self-play loop...
                kind = "setup" if isinstance(exc, WorkerSetupError) else failure_kind(exc)
                if kind is None:
                    raise  # ...but a bug in it does: fail fast, with its traceback
                ctx.counters["eval_failures"] += 1
                ctx.failures.count("eval", kind, exc, version=version)
            finally:
                ctx.in_flight["evals"] -= 1
