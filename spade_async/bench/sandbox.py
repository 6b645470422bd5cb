"""`spade bench sandbox`: what an environment instance costs, measured side by side in one run.

- bare: `python3 -I -S -c pass` started the same way a worker is (same isolation wrapper, same
  cgroup entry), spawn to exit;
- cold start: a worker launched for one environment: spawn -> ready -> load the module ->
  first observation from reset;
- warm start: the same from the pre-started pool (what the daemon pays per episode);
- step round trip: one `step` through the pipe protocol, in microseconds.
Also reports the unsandboxed bare interpreter, so the isolation's own cost is visible.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio

from spade_async.core.config import SandboxConfig
from spade_async.sandbox.reaper import reap_sandbox_orphans
from spade_async.sandbox.runtime import Sandbox
from spade_async.sandbox.worker import Worker

SEEDS = Path(__file__).resolve().parents[1] / "envs" / "seeds"
STEP_ENV = """
class Environment:
    name = "echo"
    description = "echo"
    max_turns = 64
    def reset(self, seed):
        self.n = 0
        return "go", {}
    def step(self, action):
        self.n += 1
        return action[:8], 0.0, False, False, {"n": self.n}
    def hint(self):
        return "any"
"""


def _ms(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median_ms": round(statistics.median(xs) * 1000, 2),
            "p90_ms": round(xs[int(0.9 * (len(xs) - 1))] * 1000, 2), "n": len(xs)}


def _spawn_exit(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env={}, cwd="/")
    seconds = time.perf_counter() - t0
    if res.returncode:
        raise RuntimeError(f"bare interpreter exited {res.returncode}: "
                           f"{res.stderr.decode(errors='replace')[-300:]}")
    return seconds


async def _measure(cfg: SandboxConfig, code: str, runs: int, steps: int) -> dict[str, Any]:
    async with Sandbox(cfg.model_copy(update={"warm_workers": 0, "slots": 2})) as sb:
        iso, cg = sb.isolation, sb.cgroups
        bare_argv = [str(iso.python), "-I", "-S", "-c", "pass"]
        wrapped = iso.wrap(0, bare_argv)
        if cg is not None:
            cg.prepare(0)
            wrapped = cg.enter_prefix(0) + wrapped
        slot_uids = sb.uids
        bare, bare_plain, cold = [], [], []
        for _ in range(runs):  # interleaved, so load on the machine hits all three alike
            bare.append(_spawn_exit(wrapped))
            bare_plain.append(_spawn_exit(bare_argv))
            reap_sandbox_orphans(slot_uids, set())  # bwrap's namespace init, now our orphan
            t0 = time.perf_counter()
            worker = await sb._adopt(Worker.launch(iso, 1, sb.cfg, cg, preload=False)).ready()
            await worker.call("load", 10, code=code)
            await worker.call("reset", 10, seed=0)
            cold.append(time.perf_counter() - t0)
            await worker.kill()
        layers = sb.layers()
        isolation = iso.name

    warm = []
    async with Sandbox(cfg.model_copy(update={"warm_workers": 2, "slots": 4})) as sb:
        for _ in range(runs):
            await anyio.sleep(0.05)  # the pool refills between episodes, as in the daemon
            t0 = time.perf_counter()
            async with sb.open(code) as env:
                await env.reset(0)
                warm.append(time.perf_counter() - t0)
        async with sb.open(STEP_ENV) as env:
            await env.reset(0)
            for _ in range(50):
                await env.step("warm-up")
            rtt = []
            for i in range(steps):
                t0 = time.perf_counter()
                await env.step(f"action {i}")
                rtt.append(time.perf_counter() - t0)
    b, c = _ms(bare), _ms(cold)
    return {
        "isolation": isolation,
        "layers": layers,
        "env": "number_guess seed environment",
        "bare_python_sandboxed": b,
        "bare_python_unsandboxed": _ms(bare_plain),
        "cold_start": c,
        "warm_start": _ms(warm),
        "cold_over_bare": round(c["median_ms"] / b["median_ms"], 2),
        "step_roundtrip_us": {"median": round(statistics.median(rtt) * 1e6, 1),
                              "p90": round(sorted(rtt)[int(0.9 * (len(rtt) - 1))] * 1e6, 1),
                              "n": len(rtt)},
    }


def run_sandbox_bench(cfg: SandboxConfig, runs: int = 30, steps: int = 2000) -> dict[str, Any]:
    code = (SEEDS / "number_guess.py").read_text()
    return anyio.run(_measure, cfg, code, runs, steps)
