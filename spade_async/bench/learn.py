"""`spade bench learn`: does the optimiser learn at all, apart from the curriculum?

The fixed loop (daemon.mode = "fixed": no designer, one seed family at one rung) with the real
vLLM server, daemon and trainer for N minutes, measured with the loop stopped before and after:

- a probe of `probe_seeds` held-out episodes (fixed episode seeds, fixed per-request sampling
  seeds), sampled at the rollout temperature and greedily, on version 0 and on the last
  version, with the paired difference (same seed, same sampling seed) and its 95% interval;
- teacher-forced log-probabilities, under the base weights and under the last version's, of
  the base model's own sampled probe replies, split into the ones that solved their episode
  and the ones that did not (learning raises the first and lowers the second, whatever the
  reply's format);
- the unhinted solve rate of the loop's own plays over time (run/plays.jsonl), in bins;
- the trainer's steps (trainer/metrics.jsonl): steps per hour, samples per step, tokens/s,
  padded / real tokens, KL to the base model.

Everything lives in one directory (`<data_dir>/bench/learn/<name>/`): `learn.toml` (the given
config with the bench's tables laid over it), the run's data dir `run/`, the processes' logs,
and the result `learn.json`. The server runs through scripts/inference.sh as in production.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from spade_async.core.config import SpadeConfig, checkpoint_dir
from spade_async.core.io import atomic_write_text
from spade_async.envs.variants import SEEDS_DIR
from spade_async.evals.base import wilson_interval
from spade_async.evals.paired import paired_difference
from spade_async.experiment.layout import toml_dumps
from spade_async.inference.launch import REPO

PROBE_SEED_BASE = 737_000_000  # the bench's probe seeds: base + 0, 1, ... (training draws at random)
SOLVED = 1.0 - 1e-9


class LearnBenchError(RuntimeError):
    """A process of the bench's stack failed; the message names it and its log."""


# ---- the bench's config ------------------------------------------------------------------------


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node: Any = tree
    for i, k in enumerate(keys[:-1]):
        nxt = keys[i + 1]
        if isinstance(node, list):
            node = node[int(k)]
            continue
        if k not in node:
            node[k] = [] if nxt.isdigit() else {}
        node = node[k]
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`section.key=value`, the value a TOML literal (1e-3, true, "x", ["a", "b"]) or else a
    bare string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set {text!r}: expected KEY=VALUE, e.g. trainer.lr=1e-3")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip(), value


def bench_tables(cfg: SpadeConfig, config_path: Path, out: Path, *, family: str,
                 params: dict[str, Any], probe_seeds: int,
                 overrides: Sequence[tuple[str, Any]] = ()) -> dict[str, Any]:
    """The tables `learn.toml` lays over the given config: the fixed loop on one family at one
    point, the run's own data dir, no background evaluation, and the --set overrides."""
    endpoints = [e.model_dump(mode="json", exclude_none=True) for e in cfg.endpoints]
    tables: dict[str, Any] = {
        "extends": str(config_path.resolve()),
        "endpoints": endpoints,
        "paths": {"data_dir": str(out / "run"),
                  "models_dir": str(checkpoint_dir(cfg).parent.resolve())},
        "daemon": {"mode": "fixed", "bootstrap_seeds": True, "bootstrap_families": [family],
                   "fixed_rungs": ["easiest"]},
        "eval": {"every_versions": 0,
                 "probe_variants": [{"family": family, "params": params}],
                 "probe_seeds": probe_seeds},
    }
    for key, value in overrides:
        if key.endswith("weight_swap.type"):  # another backend: its own options, defaulted
            key, value = key.removesuffix(".type"), {"type": value}
        _set_path(tables, key, value)
    return tables


def write_bench_config(cfg: SpadeConfig, config_path: Path, out: Path, **kw: Any) -> Path:
    path = out / "learn.toml"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "# written by `spade bench learn`: the given config with the "
                            "bench's tables laid over it\n" + toml_dumps(
                                bench_tables(cfg, config_path, out, **kw)))
    return path


# ---- measuring ---------------------------------------------------------------------------------


def rate(solved: Sequence[bool]) -> dict[str, Any]:
    k, n = sum(solved), len(solved)
    lo, hi = wilson_interval(k, n)
    return {"n": n, "solved": k, "rate": round(k / n, 4) if n else None,
            "ci95": [round(lo, 3), round(hi, 3)]}


def solve_rate_over_time(plays: Path, start: float, bin_s: float) -> list[dict[str, Any]]:
    """Unhinted solve rate of the loop's plays per time bin (minutes since `start`)."""
    bins: dict[int, list[bool]] = {}
    versions: dict[int, set[int]] = {}
    if plays.exists():
        with open(plays, encoding="utf-8") as f:
            for line in f:
                try:
                    p = json.loads(line)
                except ValueError:
                    continue
                b = int((float(p.get("time", start)) - start) // bin_s)
                bins.setdefault(b, []).extend(s >= SOLVED for s in p.get("unhinted", []))
                versions.setdefault(b, set()).add(int(p.get("policy_version", 0)))
    return [{"minutes": [round(b * bin_s / 60, 1), round((b + 1) * bin_s / 60, 1)],
             "versions": sorted(versions[b]), **rate(bins[b])} for b in sorted(bins)]


async def play_probe(cfg: SpadeConfig, pool: Any, chat: Any, sandbox: Any, *, code: str,
                     params: dict[str, Any], seeds: Sequence[int], model: str, version: int,
                     temperature: float, concurrency: int = 16) -> list[Any]:
    """One unhinted episode per seed (per-request sampling seeded by the episode seed), as
    training plays them; an episode that failed on the endpoint or in the sandbox is retried
    once, then kept as failed (no score)."""
    from spade_async.inference.errors import EndpointError
    from spade_async.rollout.episode import run_episode
    from spade_async.sandbox.errors import SandboxError

    rollout = cfg.rollout.model_copy(update={"temperature": temperature})
    limiter = anyio.CapacityLimiter(concurrency)
    out: list[Any] = [None] * len(seeds)

    async def one(i: int, seed: int) -> None:
        async with limiter:
            for attempt in range(2):
                try:
                    async with sandbox.open(code) as env:
                        out[i] = await run_episode(
                            env, pool, chat, env_id="bench-learn", seed=seed, hint=None,
                            model=model, policy_version=version, cfg=rollout, params=params,
                            request_seed=seed)
                    return
                except (SandboxError, EndpointError) as exc:
                    if attempt:
                        out[i] = exc

    async with anyio.create_task_group() as tg:
        for i, s in enumerate(seeds):
            tg.start_soon(one, i, s)
    return out


def _solved(episodes: Sequence[Any]) -> list[bool | None]:
    return [None if not hasattr(e, "score") or e.error else e.score >= SOLVED for e in episodes]


def teacher_forced(base_dir: Path, version_path: Path | None, tcfg: Any,
                   episodes: Sequence[Any]) -> dict[str, float | None]:
    """Mean log-prob per sampled token of `episodes` (their exact ids) under the base weights
    (version_path None) or a published version (an adapter directory or full weights), at the
    trainer's scoring temperature; separately for solved and unsolved episodes."""
    import numpy as np
    import torch

    from trainer.data import TrainSample, collate
    from trainer.model import load_policy

    adapter = version_path is not None and (version_path / "adapter_config.json").is_file()
    mode = "lora" if adapter else "full"
    policy = load_policy(version_path if (version_path and not adapter) else base_dir,
                         mode=mode, lora_rank=tcfg.lora_rank, lora_alpha=tcfg.lora_alpha,
                         lora_dropout=0.0, lora_targets=tcfg.lora_targets,
                         temperature=tcfg.logprob_temperature, trainable=False)
    if adapter:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(policy.lm, load_file(version_path / "adapter_model.safetensors"))
    policy.eval()
    sums: dict[bool, list[float]] = {True: [], False: []}
    for e in episodes:
        if not hasattr(e, "score") or e.error or not e.sampled_tokens:
            continue
        s = TrainSample(row=0, sample_id=e.episode_id, role="agent", policy_version=0,
                        token_ids=np.asarray(e.token_ids, dtype=np.int64),
                        loss_mask=np.asarray(e.loss_mask, dtype=bool),
                        behaviour_logprobs=np.asarray(e.logprobs, dtype=np.float32),
                        advantage=0.0, weight=1.0, staleness=0)
        mb = collate([s])
        with torch.no_grad():
            lp, _ = policy(mb.input_ids, **mb.model_inputs())
        sums[e.score >= SOLVED].append(float(lp.mean()))
    return {"solved": round(sum(sums[True]) / len(sums[True]), 4) if sums[True] else None,
            "unsolved": round(sum(sums[False]) / len(sums[False]), 4) if sums[False] else None,
            "n_solved": len(sums[True]), "n_unsolved": len(sums[False])}


# ---- the stack ---------------------------------------------------------------------------------


class Stack:
    """The daemon and the trainer as subprocesses on the bench's config (vLLM is started
    separately, before them, and outlives them)."""

    def __init__(self, config: Path, out: Path) -> None:
        self.config, self.out = config, out
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        env = dict(os.environ, HF_HUB_OFFLINE="1", SPADE_CONFIG=str(self.config))
        argv = {"daemon": [sys.executable, "-m", "spade_async.cli", "run", "-c",
                           str(self.config)],
                "trainer": [sys.executable, "-m", "trainer", "--config", str(self.config)]}
        for name, cmd in argv.items():
            with open(self.out / f"{name}.log", "ab") as log:
                self.procs[name] = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log,
                                                    stderr=subprocess.STDOUT,
                                                    start_new_session=True)

    def running(self) -> bool:
        """True while both run; False once one has ended by itself with exit code 0 (a bounded
        daemon, daemon.stop_after_versions); raises when one failed."""
        for name, p in self.procs.items():
            if p.poll() is None:
                continue
            if p.returncode == 0:
                return False
            tail = (self.out / f"{name}.log").read_text(errors="replace")[-3000:]
            raise LearnBenchError(f"the {name} exited with {p.returncode} "
                                  f"(log {self.out / f'{name}.log'}):\n{tail}")
        return True

    def stop(self, timeout_s: float = 600.0) -> None:
        """SIGTERM both (the daemon drains, the trainer finishes its step and checkpoints)."""
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in self.procs.values():
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _current(data_dir: Path) -> tuple[int, str | None]:
    try:
        c = json.loads((data_dir / "weights" / "current.json").read_text())
        return int(c["version"]), c.get("model")
    except (OSError, ValueError, KeyError):
        return 0, None


def run_learn_bench(cfg_path: Path, *, family: str = "arithmetic", minutes: float = 30.0,
                    probe_seeds: int = 200, name: str | None = None,
                    overrides: Sequence[str] = (), bin_minutes: float = 5.0,
                    base_url: str | None = None,
                    progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """The bench (see the module's docstring). `base_url`: a running vLLM to use instead of
    starting one (it must serve the config's model with the backend the config names; its
    state is the bench's to change)."""
    from spade_async.bench.ladder import rung_params
    from spade_async.core.trainer_metrics import events, step_stats
    from spade_async.envs.seed_checks import load_checked_config
    from spade_async.inference.chat_tokens import ChatTokens
    from spade_async.inference.launch import start_inference
    from spade_async.inference.pool import EndpointPool
    from spade_async.sandbox.runtime import Sandbox

    base_cfg = load_checked_config(cfg_path)
    params = rung_params(family, "easiest")
    out = (base_cfg.paths.data_dir / "bench" / "learn"
           / (name or time.strftime("%Y%m%d-%H%M%S"))).resolve()
    if (out / "run").exists():
        raise LearnBenchError(f"{out} holds a run already; pick another --name")
    sets = [parse_override(o) for o in overrides]
    if base_url is not None:
        sets.append(("endpoints.0.base_url", base_url))
    config = write_bench_config(base_cfg, cfg_path, out, family=family, params=params,
                                probe_seeds=probe_seeds, overrides=sets)
    cfg = load_checked_config(config)
    data = cfg.paths.data_dir
    code = (SEEDS_DIR / f"{family}.py").read_text()
    seeds = [PROBE_SEED_BASE + i for i in range(probe_seeds)]
    t_sample = cfg.rollout.temperature
    report: dict[str, Any] = {"dir": str(out), "config": str(config), "family": family,
                              "params": params, "minutes": minutes, "overrides": dict(sets),
                              "probe_seeds": probe_seeds, "temperature": t_sample}
    server = None
    if base_url is None:
        port = int(cfg.endpoints[0].base_url.rsplit(":", 1)[1].split("/")[0])
        progress(f"{out}: starting vLLM on :{port} ({cfg.endpoints[0].weight_swap.type})")
        server = start_inference(port, checkpoint_dir(cfg), out / "inference.log",
                                 max_model_len=max(cfg.rollout.max_seq_len,
                                                   cfg.eval.max_seq_len),
                                 extra_env={"SPADE_CONFIG": str(out / "learn.toml")},
                                 progress=progress)
        report["vllm_start_s"] = round(server.start_seconds, 1)
    try:
        chat = ChatTokens.from_pretrained(cfg.model.tokenizer or checkpoint_dir(cfg))

        async def probe(version: int, model: str) -> dict[str, list[Any]]:
            async with EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb:
                await pool.check()
                got = {}
                for label, temp in (("sampled", t_sample), ("greedy", 0.0)):
                    t0 = time.perf_counter()
                    got[label] = await play_probe(cfg, pool, chat, sb, code=code,
                                                  params=params, seeds=seeds, model=model,
                                                  version=version, temperature=temp)
                    ok = [s for s in _solved(got[label]) if s is not None]
                    progress(f"probe v{version} {label} (T={temp}): {sum(ok)}/{len(ok)} "
                             f"solved, {time.perf_counter() - t0:.0f} s")
                return got

        before = anyio.run(probe, 0, cfg.model.served_name)
        stack = Stack(config, out)
        start = time.time()
        ended_by = "minutes"
        stack.start()
        progress(f"loop started: daemon and trainer for {minutes:g} minutes")
        try:
            end = time.monotonic() + minutes * 60
            next_note = time.monotonic() + 60
            while time.monotonic() < end and stack.running():
                time.sleep(2)
                if time.monotonic() >= next_note:
                    next_note += 60
                    curve = solve_rate_over_time(data / "run" / "plays.jsonl", start,
                                                 bin_minutes * 60)
                    last = curve[-1] if curve else None
                    steps = [e for e in events(data / "trainer" / "metrics.jsonl")
                             if e.get("event") == "step"]
                    progress(f"minute {(time.time() - start) / 60:.0f}/{minutes:g}: "
                             f"v{_current(data)[0]}, {len(steps)} steps; unhinted solve rate "
                             + (f"{last['rate']} (n={last['n']}, minutes "
                                f"{last['minutes'][0]:g}-{last['minutes'][1]:g})"
                                if last else "-"))
            if time.monotonic() < end:
                ended_by = "daemon"  # a bounded loop (daemon.stop_after_versions) ended first
        finally:
            stack.stop()
        loop_s = time.time() - start
        version, model = _current(data)
        progress(f"loop stopped after {loop_s / 60:.1f} minutes at v{version}")
        after = anyio.run(probe, version, model or cfg.model.served_name) if version else before
    finally:
        if server is not None:
            server.stop()

    from spade_async.core.policy import version_dir

    base_dir = checkpoint_dir(cfg).resolve()
    tf_before = teacher_forced(base_dir, None, cfg.trainer, before["sampled"])
    tf_after = teacher_forced(base_dir, version_dir(data, version) if version else None,
                              cfg.trainer, before["sampled"])
    steps = [e for e in events(data / "trainer" / "metrics.jsonl") if e.get("event") == "step"]
    report.update({
        "loop_s": round(loop_s, 1), "loop_ended_by": ended_by, "version": version,
        "probe": {}, "teacher_forced": {
            "episodes": "the base model's sampled probe replies (their own ids)",
            "before": tf_before, "after": tf_after,
            "solved_change": _diff(tf_after["solved"], tf_before["solved"]),
            "unsolved_change": _diff(tf_after["unsolved"], tf_before["unsolved"])},
        "solve_rate_over_time": solve_rate_over_time(data / "run" / "plays.jsonl", start,
                                                     bin_minutes * 60),
        "trainer": step_stats(steps),
    })
    for label in ("sampled", "greedy"):
        b, a = _solved(before[label]), _solved(after[label])
        pairs = [(x, y) for x, y in zip(b, a, strict=True) if x is not None and y is not None]
        report["probe"][label] = {
            "temperature": t_sample if label == "sampled" else 0.0,
            "before": rate([x for x in b if x is not None]),
            "after": rate([y for y in a if y is not None]),
            "paired": paired_difference([x for x, _ in pairs], [y for _, y in pairs])
            if pairs else None}
    atomic_write_text(out / "learn.json", json.dumps(report, indent=2) + "\n")
    return report


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 4)
