"""`spade bench endpoints`: design and evaluation throughput through every endpoint of a config,
by each path it has, side by side in one run.

Per (endpoint, path): `designs` designer requests (the daemon's prompt on fixed excerpts, its
token budget and temperature, `max_concurrency` at once) and the first `tasks` reasoning-gym
tasks (greedy, as `spade eval` runs them). The tokens path renders prompts with the policy's
tokenizer, so it is measured only on endpoints that serve the policy's base model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio

from spade_async.core.config import SpadeConfig

EXCERPTS = [
    "A stack is a last-in, first-out collection: push adds an item on top, pop removes the top "
    "item, and peek reads it without removing it.",
    "The bisect module maintains a list in sorted order without sorting after each insertion. "
    "bisect_left(a, x) returns the insertion point for x in a.",
    "A train leaves at 9:40 and arrives at 11:15; the return trip takes 20 minutes longer.",
    "Binary search halves the interval each step: with n sorted items it needs at most "
    "ceil(log2(n + 1)) comparisons.",
]


async def _designs(pool: Any, chat: Any, *, name: str, path: str, model: str, n: int,
                   cfg: SpadeConfig, concurrency: int) -> dict[str, Any]:
    from spade_async.design.designer import design

    group = pool.config(name).group
    limiter = anyio.Semaphore(concurrency)
    done: list[Any] = []
    errors: list[str] = []

    async def one(i: int) -> None:
        async with limiter:
            try:
                d = await design(pool, chat, doc_id=f"bench-{i}", chunk_id=f"bench-{i}",
                                 excerpt=EXCERPTS[i % len(EXCERPTS)], examples=[], model=model,
                                 policy_version=0, max_tokens=cfg.daemon.designer_max_tokens,
                                 temperature=cfg.daemon.designer_temperature,
                                 max_seq_len=cfg.rollout.max_seq_len, deadline_s=None,
                                 prefill=cfg.daemon.designer_prefill if path == "tokens" else "",
                                 path=path, group=group)
                done.append(d)
            except Exception as exc:  # counted, shown: a bench reports, it does not stop
                errors.append(f"{type(exc).__name__}: {exc}"[:200])

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    secs = time.perf_counter() - t0
    tokens = sum(d.completion_tokens for d in done)
    return {"n": n, "done": len(done), "errors": errors[:3], "error_count": len(errors),
            "seconds": round(secs, 2), "designs_per_min": round(60 * len(done) / secs, 2),
            "tokens": tokens, "tokens_per_s": round(tokens / secs, 1),
            "with_code": sum(d.code is not None for d in done)}


async def _eval(pool: Any, chat: Any, *, name: str, path: str, model: str, n: int,
                cfg: SpadeConfig) -> dict[str, Any]:
    from spade_async.evals.base import EvalPolicy, run_suite
    from spade_async.evals.reasoning_gym_suite import ReasoningGymSuite

    policy = EvalPolicy(pool, chat, model=model, version=0, max_tokens=cfg.eval.max_tokens,
                        max_seq_len=cfg.eval.max_seq_len, path=path,
                        group=pool.config(name).group)
    res = await run_suite(ReasoningGymSuite(), policy, limit=n,
                          concurrency=cfg.eval.concurrency)
    return {"n": res.n, "scored": res.scored, "score": res.score, "seconds": res.seconds,
            "tasks_per_min": round(60 * res.n / res.seconds, 2) if res.seconds else None,
            "tokens": res.completion_tokens,
            "tokens_per_s": round(res.completion_tokens / res.seconds, 1) if res.seconds else None}


def run_endpoints_bench(cfg: SpadeConfig, chat: Any, *, designs: int, tasks: int,
                        progress: Callable[[str], None]) -> dict[str, Any]:
    from spade_async.inference.pool import EndpointPool

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {"rows": []}
        async with EndpointPool(cfg.endpoints, cfg.pool) as pool:
            for h in await pool.check():
                caps = h.capabilities
                if not h.up or caps is None:
                    out["rows"].append({"endpoint": h.name, "error": h.error or "not probed"})
                    continue
                model = h.models[0]
                paths = [p for p in ("tokens", "chat") if caps.supports(p)]
                if model != cfg.model.served_name and "tokens" in paths:
                    paths.remove("tokens")  # our tokenizer is the policy's, not this model's
                for path in paths:
                    progress(f"{h.name} ({caps.server}), {path} path: {designs} designs")
                    conc = min(designs, pool.config(h.name).max_concurrency)
                    d = await _designs(pool, chat, name=h.name, path=path, model=model,
                                       n=designs, cfg=cfg, concurrency=conc)
                    progress(f"{h.name}, {path} path: {tasks} reasoning-gym tasks")
                    e = await _eval(pool, chat, name=h.name, path=path, model=model, n=tasks,
                                    cfg=cfg)
                    out["rows"].append({"endpoint": h.name, "server": caps.server,
                                        "model": model, "path": path, "design": d, "eval": e})
        return out

    return anyio.run(main)
