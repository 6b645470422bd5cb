"""What every stage of the loop shares: the config and the components it was given (endpoint
pool, sandbox, memory, chat tokens), the policy version, the counters and the failure ledger,
the admission, the run's logs, and the stop signal. Stages hold one `LoopContext` and nothing
of each other's state."""

from __future__ import annotations

import random
import time
from collections import Counter, OrderedDict, deque
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from spade_async.core.config import SpadeConfig
from spade_async.core.logs import get_logger
from spade_async.core.policy import PolicyVersion, current_path
from spade_async.core.rolling import Retention, RollingFile, rolling
from spade_async.core.spool.base import BatchSpool
from spade_async.core.timings import RecentTimes
from spade_async.envs.contract import EnvMeta, ParamSpec
from spade_async.envs.hint_reader import HintReader
from spade_async.envs.validate import validate
from spade_async.envs.validation_report import ValidationReport
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.pool import EndpointPool
from spade_async.inference.roles import ROLES, role_route
from spade_async.loop.admission import Admission, Stream, StreamPool
from spade_async.loop.failures import Failures, GaveUp
from spade_async.loop.ledger import SampleLedger
from spade_async.loop.metrics import Metrics
from spade_async.loop.ports import MemoryPort, StoredEnv
from spade_async.loop.usage import CountingPool, TokenUsage
from spade_async.sandbox.runtime import Sandbox

log = get_logger("daemon")

# Failures that mean "the endpoint is not there" rather than "it failed this request": the
# work is waited out (with back-off) instead of using up its retry budget.
OUTAGE = frozenset({"no_endpoint", "connection", "model_not_served"})
REGRET_WINDOW = 10000  # plays whose regret the status distribution is over
META_CACHE = 4096  # environments' EnvMeta kept loaded (a week's run stores many more)


class LoopContext:
    def __init__(self, cfg: SpadeConfig, *, pool: EndpointPool, sandbox: Sandbox,
                 memory: MemoryPort, spool: BatchSpool, chat: ChatTokens,
                 run_dir: Path) -> None:
        self.cfg, self.pool, self.sandbox, self.memory = cfg, pool, sandbox, memory
        self.spool, self.chat, self.run_dir = spool, chat, run_dir
        self.policy = PolicyVersion(current_path(cfg.paths.data_dir), cfg.model.served_name)
        self.counters: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()  # rejection reasons of designs
        self.in_flight: Counter[str] = Counter()  # designs, validations, episodes, evals
        # the regret of the last REGRET_WINDOW plays (the status line's distribution)
        self.regrets: deque[float] = deque(maxlen=REGRET_WINDOW)
        self.iterations = 0  # documents (or edit groups; fixed mode: plays) through every stage
        self.rng = random.Random(cfg.corpus.seed)
        self.metrics = Metrics()
        self.retention = Retention.of(cfg.retention)
        self._logs: dict[str, RollingFile] = {}  # designs, episodes, plays: opened once
        self.failures = Failures(run_dir, self.metrics, self.retention)
        self.ledger = SampleLedger(self.metrics)  # every played sample: written or dropped
        self.usage = TokenUsage(self.metrics)  # prompt and sampled tokens per role
        self.memory_times = RecentTimes()  # each memory operation's wait (status.json)
        # who designs, plays and evaluates where, and by which path (DESIGN §5)
        self.routes = {r: role_route(cfg, r) for r in ROLES}
        self.stop_requested = anyio.Event()  # the CLI starts its drain deadline on it
        self.stop_reason: str | None = None
        self.final_eval = False  # evaluate the version it stopped on before exiting
        self.start_version = 0
        self.waiting_for_trainer = False
        self.queue_depth = lambda: 0  # plays waiting in the env stream (set by the daemon)
        # env id -> what it says about itself (knobs), the META_CACHE most recently used
        self._metas: OrderedDict[str, EnvMeta] = OrderedDict()
        # how much is in flight: sized to the endpoints' capacity (spade_async.loop.admission)
        dcfg = cfg.daemon
        self.admission = Admission(
            pool, agent_group=self.routes["agent"].group,
            designer_group=self.routes["designer"].group, sandbox_slots=sandbox.capacity,
            max_documents=dcfg.documents_in_flight, max_plays=dcfg.envs_in_flight,
            queue_size=dcfg.env_queue, plays_queued=lambda: self.queue_depth())

    # ---- stopping --------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self.stop_requested.is_set()

    def stop(self, reason: str = "signal") -> None:
        """Finish the documents in flight, then return (SIGTERM/SIGINT, or a bounded run)."""
        if not self.stopping:
            self.stop_reason = reason
            self.stop_requested.set()

    def sampled_with(self, version: int, *, episode: bool) -> None:
        """An agent episode (or, while there has been nothing to play, a design) finished on
        `version`: a bounded run may be done."""
        n = self.cfg.daemon.stop_after_versions
        nothing_to_play = not (self.counters["replays"] or self.counters["designs_accepted"])
        if (n and not self.stopping and version >= self.start_version + n
                and (episode or nothing_to_play)):
            log.info("stop_after_versions_reached", version=version,
                     start_version=self.start_version, stop_after_versions=n)
            self.stop("stop_after_versions")

    async def pause(self, seconds: float) -> None:
        """A back-off that a stop cuts short."""
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            await anyio.sleep(min(0.2, end - time.monotonic()))

    # ---- shared operations -----------------------------------------------------------------

    def pool_for(self, stream: Stream | None, role: str) -> Any:
        """The pool for one admitted stream's requests (its first marks it started), whose
        completions' tokens count under `role` (agent or designer)."""
        return CountingPool(self.pool if stream is None else StreamPool(self.pool, stream),
                            self.usage, role)

    async def validate(self, code: str, params: dict[str, Any] | None = None,
                       read_hint: bool = False, **context: Any) -> ValidationReport:
        """The validation pipeline (at `params` only, for an edit's variant); a sandbox
        worker that did not start is the host's fault, not the design's, and is tried again
        (`daemon.item_attempts`). `read_hint`: a new design's hint is also read by the policy
        model (hint_reader.py); an edit's variant shares the code its environment was
        accepted with, and the built-in seeds are trusted."""
        self.in_flight["validations"] += 1
        # validation's cost, not a rollout's: its few tokens are not counted as sampled
        reader = HintReader(self.pool, self.policy.model,
                            self.routes["agent"].group,
                            deadline_s=self.cfg.rollout.request_deadline_s) if read_hint else None
        why = "an edit's variant: its environment's hint was read when it was accepted" \
            if params is not None else "a built-in seed environment"
        try:
            return await self.failures.retrying(
                "validation", lambda: validate(code, self.sandbox, self.cfg.validation,
                                               params=params, reader=reader, no_reader=why),
                attempts=self.cfg.daemon.item_attempts, **context)
        finally:
            self.in_flight["validations"] -= 1

    async def memory_op(self, call: Any, **context: Any) -> Any:
        """A memory operation, tried again on I/O failure (each is idempotent: inserts are
        keyed by the code's hash)."""
        with self.memory_times.timed():  # its retries included: the wait the loop sees
            return await self.failures.retrying("memory", call,
                                                attempts=self.cfg.daemon.item_attempts,
                                                **context)

    async def meta(self, env_id: str, code: str) -> EnvMeta:
        """What a stored environment says about itself (its knobs), loaded in the sandbox
        once per daemon."""
        meta = self._metas.get(env_id)
        if meta is not None:
            self._metas.move_to_end(env_id)
        else:
            async def load() -> EnvMeta:
                async with self.sandbox.open(code) as env:
                    return env.meta

            meta = await self.failures.retrying("load", load,
                                                attempts=self.cfg.daemon.item_attempts,
                                                env_id=env_id)
            self._metas[env_id] = meta
            while len(self._metas) > META_CACHE:
                self._metas.popitem(last=False)
        return meta

    async def knobs(self, env: StoredEnv) -> tuple[ParamSpec, ...]:
        """A stored environment's knobs; none when it has none or they cannot be read."""
        try:
            return (await self.meta(env.env_id, env.code)).params
        except GaveUp:
            return ()

    def known_meta(self, env_id: str) -> EnvMeta | None:
        return self._metas.get(env_id)

    async def append(self, log_name: str, record: dict[str, Any]) -> None:
        """One line of <run_dir>/{designs,episodes,plays}.jsonl: what `spade report` plots.
        Its "time" is the write's (concurrent appends run on worker threads in any order)."""
        log = self._logs.get(log_name)
        if log is None:
            log = self._logs[log_name] = rolling(self.run_dir / f"{log_name}.jsonl",
                                                 self.retention)
        await anyio.to_thread.run_sync(partial(log.append, record, time_field="time"))

    def rejected(self, reason: str) -> None:
        """A design refused: counted by the first part of its reason."""
        key = reason.split(":")[0] if reason else "unknown"
        self.reasons[key] += 1
        self.metrics.rejections.labels(key).inc()
