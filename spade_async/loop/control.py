"""The daemon's side of spade_async.core.control: it acts on the first stop request."""

from __future__ import annotations

import anyio

from spade_async.core.control import read_stop_request
from spade_async.core.logs import get_logger
from spade_async.loop.context import LoopContext

log = get_logger("daemon")


async def watch_stop_requests(ctx: LoopContext) -> None:
    """Poll for a stop request every status interval; act on the first."""
    while not ctx.stopping:
        req = await anyio.to_thread.run_sync(read_stop_request, ctx.run_dir)
        if req is not None:
            ctx.final_eval = bool(req.get("final_eval"))
            log.info("stop_requested", reason=req.get("reason"), final_eval=ctx.final_eval)
            ctx.stop(str(req.get("reason") or "stop request"))
            return
        await anyio.sleep(ctx.cfg.daemon.status_interval_s)
