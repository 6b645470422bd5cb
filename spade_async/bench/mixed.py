"""The mixed workload of `spade bench pipeline`: the real daemon (admission, sandbox validation,
LanceDB memory, spool) designing ~700-token environments beside multi-turn episodes, against
fake endpoints of different capacities in their own processes; then a bare async client
sending the very requests the daemon sent, each endpoint at its `max_concurrency`.

Both paths are measured over a window of the same length after a warm-up: completion tokens
generated inside it (each request's tokens spread over its time at the server, the fake's
nominal latency ending when it answered, so a 7-second design that straddles an edge counts
for its part inside), and (daemon) each endpoint's saturation, the mean of
min(in flight, max_concurrency) / max_concurrency over the window. The fakes answer after a
fixed latency per request and per token whatever their load, so a bare client at full
concurrency is the ceiling and the ratio says what the orchestration leaves on the table.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx

from spade_async.core.config import (
    DaemonConfig,
    EndpointConfig,
    PathsConfig,
    PoolConfig,
    RolloutConfig,
    SandboxConfig,
    SpadeConfig,
    ValidationConfig,
)
from spade_async.core.config.corpus import CorpusConfig, JsonlSourceConfig
from spade_async.corpus.sampler import CorpusSampler
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.pool import EndpointPool


def _inside(finished: list[tuple[float, int]], t0: float, t1: float, per_request: float,
            per_token: float) -> float:
    """Tokens generated in [t0, t1]: each request's spread evenly over the nominal time the
    fake took for it, ending when it answered."""
    total = 0.0
    for end, tokens in finished:
        start = end - per_request - per_token * tokens
        overlap = min(end, t1) - max(start, t0)
        if overlap > 0:
            total += tokens * overlap / max(end - start, 1e-9)
    return total


def _corpus(path: Path, n: int) -> None:
    words = ("river stone market winter signal garden ledger copper lantern meadow harbor "
             "orbit quartz timber willow").split()
    with open(path, "w") as f:
        for i in range(n):
            text = " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(120))
            f.write(json.dumps({"id": f"doc{i}", "text": f"Document {i}. {text}"}) + "\n")


async def _daemon_window(cfg: SpadeConfig, chat: ChatTokens, warmup_s: float, window_s: float,
                         latency: tuple[float, float],
                         progress: Callable[[str], None]) -> dict[str, Any]:
    from spade_async.core.spool.files import FileSpool
    from spade_async.loop.daemon import Daemon
    from spade_async.memory.port import open_memory
    from spade_async.sandbox.runtime import Sandbox

    data = cfg.paths.data_dir
    finished: list[tuple[float, int, str, dict[str, Any], str]] = []
    sampler = CorpusSampler.from_config(cfg.corpus, data / "corpus.json", autocommit=False)
    spool = FileSpool(data / "spool", writer=True)
    async with EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb, \
            open_memory(cfg) as memory:
        post = pool.post

        async def recording_post(path: str, payload: dict[str, Any], **kw: Any) -> Any:
            name, out = await post(path, payload, **kw)
            tokens = getattr(out, "completion_tokens", 0) or 0
            finished.append((time.monotonic(), tokens, path, payload, name))
            return name, out

        pool.post = recording_post  # type: ignore[method-assign]
        daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=memory, spool=spool,
                        corpus=sampler, chat=chat, run_dir=data / "run")
        stopped = anyio.Event()

        async def run() -> None:
            try:
                await daemon.run()
            finally:
                stopped.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            progress(f"daemon: warm-up {warmup_s:g} s, then a {window_s:g} s window")
            await anyio.sleep(warmup_s)
            t0 = time.monotonic()
            area0 = {n: pool.saturation_area(n) for n in pool.names}
            await anyio.sleep(window_s)
            t1 = time.monotonic()
            area1 = {n: pool.saturation_area(n) for n in pool.names}
            counters = dict(daemon.counters)
            daemon.stop("bench")
            with anyio.move_on_after(10):  # the drain; what is left is cancelled
                await stopped.wait()
            tg.cancel_scope.cancel()
    inside = [f for f in finished if t0 <= f[0] <= t1]
    tokens = round(_inside([(f[0], f[1]) for f in finished], t0, t1, *latency))
    return {"seconds": round(t1 - t0, 3), "tokens": tokens,
           "tokens_per_s": round(tokens / (t1 - t0), 1), "requests": len(inside),
           "design_requests": sum("Environment Designer" in chat.tok.decode(f[3]["prompt"])
                                  for f in inside if "prompt" in f[3]),
           "saturation": {n: round((area1[n] - area0[n]) / (t1 - t0), 4) for n in area0},
           "counters": {k: counters.get(k, 0) for k in (
               "designs", "designs_accepted", "episodes", "replays", "batches")},
           "requests_sent": [(f[2], f[3], f[4]) for f in inside]}


async def _bare_window(endpoints: list[EndpointConfig], requests: list[tuple[str, dict, str]],
                       warmup_s: float, window_s: float,
                       latency: tuple[float, float]) -> dict[str, Any]:
    """Each endpoint's share of the daemon's requests, replayed in a loop by `max_concurrency`
    plain httpx workers; tokens of the requests that finished inside the window."""
    finished: list[tuple[float, int]] = []
    start = time.monotonic()
    t0, t1 = start + warmup_s, start + warmup_s + window_s

    async def endpoint(ep: EndpointConfig) -> None:
        mine = [(p, b) for p, b, name in requests if name == ep.name] or [
            (p, b) for p, b, _ in requests]
        limits = httpx.Limits(max_connections=ep.max_concurrency)
        async with httpx.AsyncClient(base_url=ep.base_url, timeout=600, limits=limits) as c:
            nxt = [0]

            async def worker() -> None:
                while time.monotonic() < t1:
                    path, body = mine[nxt[0] % len(mine)]
                    nxt[0] += 1
                    r = await c.post(path, json=body)
                    r.raise_for_status()
                    choice = r.json()["choices"][0]
                    finished.append((time.monotonic(), len(choice.get("token_ids") or [])))

            async with anyio.create_task_group() as tg:
                for _ in range(ep.max_concurrency):
                    tg.start_soon(worker)

    async with anyio.create_task_group() as tg:
        for ep in endpoints:
            tg.start_soon(endpoint, ep)
    inside = [f for f in finished if t0 <= f[0] <= t1]
    tokens = round(_inside(finished, t0, t1, *latency))
    return {"seconds": round(window_s, 3), "tokens": tokens,
            "tokens_per_s": round(tokens / window_s, 1), "requests": len(inside)}


def run_mixed_bench(checkpoint: Path, *, capacities: tuple[int, ...] = (8, 4),
                    token_latency_s: float = 0.01, request_latency_s: float = 0.02,
                    warmup_s: float = 10.0, window_s: float = 30.0,
                    progress: Callable[[str], None] = lambda m: None,
                    daemon: dict[str, Any] | None = None) -> dict[str, Any]:
    """`daemon`: DaemonConfig overrides (e.g. the fixed caps documents_in_flight = 2 and
    envs_in_flight = 4 that sized the work in flight before admission by capacity)."""
    from spade_async.inference.launch import free_port, wait_healthy

    chat = ChatTokens.from_pretrained(checkpoint)
    fakes, endpoints = [], []
    with tempfile.TemporaryDirectory(prefix="spade-bench-mixed-") as tmp:
        try:
            for i, cap in enumerate(capacities):
                port = free_port()
                fakes.append(subprocess.Popen(
                    [sys.executable, "-m", "spade_async.testing.scripted", str(port),
                     str(checkpoint), str(token_latency_s), "mixed", str(request_latency_s)]))
                endpoints.append(EndpointConfig(
                    name=f"fake{i}", base_url=f"http://127.0.0.1:{port}", max_concurrency=cap,
                    request_timeout_s=600))
            for ep, proc in zip(endpoints, fakes, strict=True):
                wait_healthy(ep.base_url, proc, 60, what="the fake endpoint")
            root = Path(tmp)
            _corpus(root / "docs.jsonl", 400)
            total = sum(capacities)
            cfg = SpadeConfig(
                paths=PathsConfig(data_dir=root / "data"),
                endpoints=endpoints,
                pool=PoolConfig(),
                sandbox=SandboxConfig(slots=2 * total + 8, warm_workers=min(16, total)),
                rollout=RolloutConfig(k_unhinted=4, k_hinted=2, max_tokens_per_turn=32),
                daemon=DaemonConfig(designs_per_document=4, designer_max_tokens=768,
                                    examples_k=1, replay_probability=0.25,
                                    status_interval_s=0.5, **(daemon or {})),
                corpus=CorpusConfig(source=JsonlSourceConfig(path=root / "docs.jsonl",
                                                             id_field="id"), min_chars=10),
                # the window measures designs beside episodes, and the bare client replays
                # those: the hint reader's chat requests (validation) are neither
                validation=ValidationConfig(reader=False),
            )
            latency = (request_latency_s, token_latency_s)
            d = anyio.run(_daemon_window, cfg, chat, warmup_s, window_s, latency, progress)
            requests = d.pop("requests_sent")
            progress(f"bare client: the daemon's {len(requests)} requests, each endpoint at "
                     "its max_concurrency")
            b = anyio.run(_bare_window, endpoints, requests, 2.0, window_s, latency)
        finally:
            for proc in fakes:
                proc.terminate()
            for proc in fakes:
                proc.wait(10)
    return {"endpoints": {ep.name: ep.max_concurrency for ep in endpoints},
            "token_latency_s": token_latency_s, "request_latency_s": request_latency_s,
            "daemon": d, "bare": b,
            "ratio": round(d["tokens_per_s"] / b["tokens_per_s"], 3) if b["tokens"] else None,
            "saturation_min": min(d["saturation"].values())}
