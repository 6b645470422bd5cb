"""Held-out evaluation: suites of tasks nobody here wrote, run against a served policy version.

A suite turns its package's tasks into `EvalTask`s and scores one task with that package's own
checker; this module runs a suite against the endpoint pool (greedy decoding, bounded
concurrency) and stores the results per policy version under `<data_dir>/eval/`:
  results.jsonl                 one line per (suite, version) run: score, passed, n, seconds,
                                their lenient twins and a 95% interval of each of the four
  v<N>/<suite>.jsonl            one line per task: id, score, passed, lenient ones, the answer,
                                any error
`spade report` plots results.jsonl; `spade eval` prints it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio

from spade_async.core.io import append_jsonl, atomic_write_text, read_jsonl
from spade_async.core.logs import get_logger
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.errors import EndpointError
from spade_async.inference.pool import EndpointPool

log = get_logger("eval")


@dataclass(frozen=True)
class EvalTask:
    task_id: str
    payload: dict[str, Any]  # whatever the suite needs to pose and score it


@dataclass
class TaskResult:
    task_id: str
    score: float            # 0..1 by the suite's own checker
    passed: bool            # the checker's verdict (score >= the suite's pass mark)
    answer: str = ""        # what the model said (cut), for inspection
    turns: int = 0
    completion_tokens: int = 0
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    failed: bool = False  # the endpoint failed it on every try: not a score, left out of means
    # The checker's verdict on a lenient reading of the answer (the reasoning-gym suites read an
    # untagged reply by its shape). None: the same as score / passed, as for a checker that
    # reads no answer tags (probe, bfcl).
    lenient: float | None = None
    lenient_passed: bool | None = None

    def __post_init__(self) -> None:
        if self.lenient is None:
            self.lenient = self.score
        if self.lenient_passed is None:
            self.lenient_passed = self.passed


class EvalPolicy:
    """One policy version (or, with roles.eval.model, another model) as the endpoints serve
    it, decoding greedily. On the tokens path every call renders the whole conversation with
    our chat template and sends the ids (evaluation needs no token-exact sequences); on the
    chat path (`path="chat"`, any OpenAI-compatible server) the messages go as text and the
    server applies its own template. `group` restricts the endpoints used; `tools`: the chat
    path may use the server's native tool calls (it has them)."""

    def __init__(self, pool: EndpointPool, chat: ChatTokens | None, *, model: str,
                 version: int, max_tokens: int = 512, max_seq_len: int = 4096,
                 deadline_s: float | None = None, path: str = "tokens",
                 group: str | None = None, tools: bool = False) -> None:
        if path == "tokens" and chat is None:
            raise ValueError("the tokens path needs the policy's tokenizer")
        self.pool, self.chat, self.model, self.version = pool, chat, model, version
        self.max_tokens, self.max_seq_len, self.deadline_s = max_tokens, max_seq_len, deadline_s
        self.path, self.group, self.tools = path, group, tools

    async def reply(self, messages: Sequence[dict[str, Any]],
                    max_tokens: int | None = None, *, temperature: float = 0.0,
                    seed: int | None = None) -> tuple[str, int]:
        """(text, completion tokens) of the next assistant turn: greedy, or sampled at
        `temperature` with request `seed` (a suite that estimates pass@k)."""
        if self.path == "chat":
            c = await self.pool.chat(messages, model=self.model,
                                     max_tokens=max_tokens or self.max_tokens,
                                     temperature=temperature, seed=seed,
                                     deadline_s=self.deadline_s, token_level=False,
                                     group=self.group)
            return c.text, c.completion_tokens
        assert self.chat is not None
        ids = self.chat.prompt_ids(messages)
        budget = min(max_tokens or self.max_tokens, self.max_seq_len - len(ids))
        if budget < 1:
            raise EndpointError(f"the conversation ({len(ids)} tokens) fills max_seq_len "
                                f"{self.max_seq_len}")
        c = await self.pool.complete(ids, model=self.model, max_tokens=budget,
                                     temperature=temperature, seed=seed,
                                     deadline_s=self.deadline_s, group=self.group)
        return self.chat.decode(c.token_ids), len(c.token_ids)


    async def play(self, env: Any, *, env_id: str, seed: int, cfg: Any,
                   params: dict[str, Any] | None = None,
                   request_seed: int | None = None) -> Any:
        """One unhinted episode of `env` (an EnvSession) by this policy, on its path."""
        from spade_async.rollout.episode import run_episode, run_episode_chat

        if self.path == "chat":
            return await run_episode_chat(env, self.pool, env_id=env_id, seed=seed, hint=None,
                                          model=self.model, policy_version=self.version,
                                          cfg=cfg, params=params, group=self.group,
                                          native_tools=self.tools)
        return await run_episode(env, self.pool, self.chat, env_id=env_id, seed=seed,
                                 hint=None, model=self.model, policy_version=self.version,
                                 cfg=cfg, params=params, request_seed=request_seed,
                                 group=self.group)


def transcript(ep: Any, limit: int = 800) -> str:
    """A played episode's (rollout.episode.Episode) actions and observations, cut to `limit`
    characters: a multi-turn task's answer, for inspection."""
    lines = []
    for t in ep.turns:
        lines.append(f"> {t.action[:200]}")
        if t.observation:
            lines.append(f"< {t.observation[:160]}")
    text = "\n".join(lines)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Suite(Protocol):
    name: str
    pass_mark: float

    def tasks(self, limit: int | None = None) -> list[EvalTask]:
        """The suite's fixed task list (the same every run), first `limit` of them."""
        ...

    def texts(self) -> list[str]:
        """Every task's prompt text: the held-out check compares them with the corpus."""
        ...

    async def run_task(self, task: EvalTask, policy: EvalPolicy) -> TaskResult: ...


@dataclass
class SuiteResult:
    suite: str
    version: int
    model: str
    n: int
    scored: int  # tasks with a score: n minus those the endpoint failed on every try
    score: float
    passed: float
    errors: int
    seconds: float
    time: float
    tasks: list[TaskResult]
    path: str = "tokens"        # how the requests went: tokens or chat
    external: bool = False      # a named model (roles.eval.model), not a policy version
    completion_tokens: int = 0  # sampled over all tasks (throughput = this / seconds)
    lenient_score: float = 0.0  # score and passed of the lenient readings (TaskResult.lenient)
    lenient_passed: float = 0.0
    # 95% intervals [low, high] of the four means above, over the scored tasks (interval95).
    score_ci95: list[float] = field(default_factory=lambda: [0.0, 1.0])
    passed_ci95: list[float] = field(default_factory=lambda: [0.0, 1.0])
    lenient_score_ci95: list[float] = field(default_factory=lambda: [0.0, 1.0])
    lenient_passed_ci95: list[float] = field(default_factory=lambda: [0.0, 1.0])

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("tasks")
        return d


async def run_suite(suite: Suite, policy: EvalPolicy, *, limit: int | None = None,
                    concurrency: int = 4, attempts: int = 2,
                    progress: Callable[[str], None] = lambda _: None) -> SuiteResult:
    """Every task of the suite, `concurrency` at a time. A task the endpoint failed is tried
    `attempts` times (a refused request, 4xx, only once); if it still fails it is recorded
    with `failed` set and is left out of the score and the pass rate (`scored` counts the
    rest), so an endpoint outage never reads as a weaker model."""
    tasks = await anyio.to_thread.run_sync(suite.tasks, limit)  # generators may be slow
    results: dict[str, TaskResult] = {}
    limiter = anyio.Semaphore(concurrency)
    t0 = time.perf_counter()

    async def one(task: EvalTask) -> None:
        async with limiter:
            for attempt in range(1, attempts + 1):
                try:
                    r = await suite.run_task(task, policy)
                    break
                except EndpointError as exc:
                    r = TaskResult(task.task_id, 0.0, False, error=f"endpoint {exc.kind}: {exc}",
                                   failed=True)
                    log.warning("eval_task_failed", suite=suite.name, task=task.task_id,
                                kind=exc.kind, attempt=attempt, of=attempts, error=str(exc))
                    if exc.kind in ("rejected", "capability"):
                        break
                    await anyio.sleep(min(30.0, 2.0 ** attempt))
            results[task.task_id] = r
            done = len(results)
            if done == len(tasks) or done % max(1, len(tasks) // 10) == 0:
                got = [x.score for x in results.values() if not x.failed]
                mean = sum(got) / len(got) if got else 0.0
                progress(f"{suite.name}: {done}/{len(tasks)} tasks, mean score {mean:.3f}")

    async with anyio.create_task_group() as tg:
        for task in tasks:
            tg.start_soon(one, task)
    ordered = [results[t.task_id] for t in tasks]
    scored = [r for r in ordered if not r.failed]
    means: dict[str, Any] = {}
    for name, values in (
            ("score", [r.score for r in scored]),
            ("passed", [float(r.passed) for r in scored]),
            ("lenient_score", [float(r.lenient or 0.0) for r in scored]),
            ("lenient_passed", [float(bool(r.lenient_passed)) for r in scored])):
        means[name] = round(math.fsum(values) / len(values), 4) if values else 0.0
        means[f"{name}_ci95"] = [round(x, 4) for x in interval95(values)]
    return SuiteResult(
        suite=suite.name, version=policy.version, model=policy.model, n=len(ordered),
        scored=len(scored), errors=sum(r.error is not None for r in ordered),
        seconds=round(time.perf_counter() - t0, 2), time=time.time(), tasks=ordered,
        path=policy.path, completion_tokens=sum(r.completion_tokens for r in ordered), **means)


class EvalFailed(EndpointError):
    """A suite run in which no task got a score: nothing is stored."""

    kind = "eval_failed"


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a success rate (95% with the default z): unlike the
    normal approximation it stays inside [0, 1] and is not empty at 0 or n successes, which
    is where small probe sets sit. (0, 1) when n is 0: nothing is known."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes out of {n}")
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def interval95(values: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """The 95% interval (with the default z) of the mean of `values`, scores in [0, 1]: the
    Wilson interval when every value is 0 or 1 (a pass rate), else the normal approximation,
    mean +- z * sd / sqrt(n) with the sample sd, clipped to [0, 1]. (0, 1) when nothing is
    known: no values, or a single fractional one."""
    n = len(values)
    if all(v in (0.0, 1.0) for v in values):
        return wilson_interval(round(math.fsum(values)), n, z)
    if n < 2:
        return 0.0, 1.0
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = z * sd / math.sqrt(n)
    return max(0.0, mean - half), min(1.0, mean + half)


def eval_dir(data_dir: Path) -> Path:
    return data_dir / "eval"


def store_result(data_dir: Path, result: SuiteResult) -> Path:
    """Append the summary to results.jsonl and write the per-task file; returns the latter."""
    root = eval_dir(data_dir)
    per_version = root / f"v{result.version}"
    per_version.mkdir(parents=True, exist_ok=True)
    tasks_file = per_version / f"{result.suite}.jsonl"
    atomic_write_text(tasks_file, "".join(json.dumps(asdict(t), ensure_ascii=False) + "\n"
                                          for t in result.tasks))
    append_jsonl(root / "results.jsonl", result.summary())
    return tasks_file


def load_results(data_dir: Path) -> list[dict[str, Any]]:
    return read_jsonl(eval_dir(data_dir) / "results.jsonl")


def model_for_version(cfg: Any, version: int, current: tuple[int, str]) -> str:
    """The model name requests use for `version`, given the published (version, model): with
    vllm-lora every loaded version has its adapter `model.adapter_name(N)`; the full-weight backends
    hold only the version they reloaded, under the base name."""
    cur_version, cur_model = current
    if version == cur_version:
        return cur_model
    swaps = {e.weight_swap.type for e in cfg.endpoints} - {"none"}
    if version == 0 and cur_version == 0:
        return cfg.model.served_name
    if version > cur_version:
        raise ValueError(f"version {version} is not published yet (newest: {cur_version})")
    if swaps == {"vllm-lora"}:
        return cfg.model.adapter_name(version) if version else cfg.model.served_name
    raise ValueError(f"the servers hold only version {cur_version} ({', '.join(sorted(swaps))} "
                     "replaces the weights); evaluate a version while it is the newest, e.g. "
                     "with eval.every_versions")
