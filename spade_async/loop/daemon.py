"""The self-play daemon: one anyio task group, stages joined by bounded streams (DESIGN §2).

    corpus ─► designer (G designs per document) ─► sandbox validation ─► memory (novelty)
                                                                            │ accepted
    replay sampler (memory) ──────────────────────────────────────────────► env stream
                                                                            ▼
          K_u unhinted + K_h hinted episodes per env ─► regret ─► memory stats
                   └─► agent samples ─┐           designer samples (once all G of a doc are in)
                                      ▼                   ▼
                             one batch per document ─► spool (atomic, sequenced)

An "iteration" is one document taken through every stage and written to the spool. That document
alone is committed as used after the write (not the others still in flight), so a crash
re-designs exactly the documents that were in flight;
environments already stored stay stored, and a batch is on disk whole or not at all.
The components (designer, episode runner, regret math, spool, memory) know nothing of this loop.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
from anyio.abc import TaskStatus

from memory_db.schema import variant_id
from spade_async.core.config import SpadeConfig
from spade_async.core.io import append_jsonl, atomic_write_text
from spade_async.core.logs import get_logger
from spade_async.core.policy import current_path
from spade_async.core.spool import BatchSpool, Sample
from spade_async.corpus import Chunk, CorpusSampler
from spade_async.design.designer import Design, design
from spade_async.design.edit import VariantView, candidate_params, propose_edit
from spade_async.envs.contract import ContractError, EnvMeta, easiest_point, resolve_params
from spade_async.envs.validate import ValidationReport, validate
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.constrained import TokenBytes
from spade_async.inference.pool import EndpointError, EndpointPool
from spade_async.inference.roles import ROLES, RoleRoute, group_has, role_route
from spade_async.loop.admission import Admission, Reservation, Stream, StreamPool
from spade_async.loop.failures import Failures, GaveUp, failure_kind
from spade_async.loop.metrics import Metrics
from spade_async.reward.regret import (
    DesignStatus,
    EnvRegret,
    design_reward,
    env_regret,
    group_advantages,
)
from spade_async.rollout.episode import Episode, play_in_sandbox
from spade_async.sandbox.runtime import Sandbox, SandboxError

log = get_logger("daemon")

# Failures that mean "the endpoint is not there" rather than "it failed this request": the
# work is waited out (with back-off) instead of using up its retry budget.
OUTAGE = frozenset({"no_endpoint", "connection", "model_not_served"})
# Episode failures worth another try: the endpoint's, or a sandbox worker that never started.
# The environment's own failures (sandbox_exception, sandbox_timeout, ...) would repeat.
RETRY_EPISODE = frozenset({"timeout", "deadline", "http_5xx", "http_429", "malformed",
                           "unavailable", "token_mismatch", "endpoint", "sandbox_start"})


# ---- what the daemon needs from the memory (memory_db implements it; tests may fake it) ----


@dataclass(frozen=True)
class StoredEnv:
    """An environment to play: `env_id` is the environment (family, whose code this is),
    `params` the difficulty knobs to play it at ({}: its defaults) and `variant_id` that
    variant's stats key (memory_db.schema.variant_id; defaults to env_id when there are no
    params)."""

    env_id: str
    code: str
    name: str
    params: dict[str, Any] = field(default_factory=dict, hash=False)
    variant_id: str = ""

    def __post_init__(self) -> None:
        if not self.variant_id:
            if self.params:  # only the memory knows how params hash; never guess an id here
                raise ValueError(f"StoredEnv {self.env_id} with params needs its variant_id")
            object.__setattr__(self, "variant_id", self.env_id)


class MemoryPort(Protocol):
    async def examples(self, query: str, k: int) -> list[str]: ...

    async def add_design(self, code: str | None, report: ValidationReport | None, *,
                         doc_id: str, chunk_id: str, excerpt: str, policy_version: int,
                         ) -> tuple[DesignStatus, str | None, str]:
        """Store a design (accepted or rejected, with its reason); (status, env_id, reason)."""
        ...

    async def record_play(self, env_id: str, unhinted: list[float], hinted: list[float],
                          regret: EnvRegret, replayed: bool,
                          params: dict[str, Any] | None = None,
                          hint_copies: list[float] | None = None,
                          sandbox_failures: int = 0) -> None:
        """Episodes of environment `env_id` played at `params` (resolved; None: defaults);
        `hint_copies`, one per hinted episode: how far it won by copying the hint;
        `sandbox_failures`: episodes its code failed (counted, not scored)."""
        ...

    async def record_failures(self, env_id: str, n: int,
                              params: dict[str, Any] | None = None) -> None:
        """A play with no score on one side: its `n` episodes the environment's code failed."""
        ...

    async def sample_replay(self) -> StoredEnv | None: ...

    async def sample_played(self) -> StoredEnv | None:
        """A played variant by the replay sampler's priorities (None before any play)."""
        ...

    async def variants(self, env_id: str) -> list[Any]:
        """memory_db.records.VariantStats of `env_id`, most played first."""
        ...

    async def accepted_count(self) -> int: ...

    async def fixed_pool(self) -> list[StoredEnv]:
        """Every accepted environment (the fixed-environment baseline's pool)."""
        ...


def regret_distribution(regrets: list[float]) -> dict[str, Any]:
    """n, mean, quantiles and a 5-bin histogram over [0, 1] of sorted per-env regrets."""
    if not regrets:
        return {"n": 0, "mean": None, "p10": None, "p50": None, "p90": None, "max": None,
                "histogram": [0] * 5}

    def q(p: float) -> float:
        return round(regrets[min(len(regrets) - 1, int(p * len(regrets)))], 4)

    hist = [0] * 5
    for r in regrets:
        hist[min(4, max(0, int(r * 5)))] += 1
    return {"n": len(regrets), "mean": round(sum(regrets) / len(regrets), 4), "p10": q(0.1),
            "p50": q(0.5), "p90": q(0.9), "max": round(regrets[-1], 4), "histogram": hist}


class PolicyVersion:
    """The newest published policy: `{"version": N, "model": "<name requests use>"}` written by
    the trainer into `<data_dir>/weights/current.json`. Absent: version 0, the base model."""

    def __init__(self, path: Path, base_model: str) -> None:
        self.path, self.base_model = path, base_model
        self.version, self.model = 0, base_model

    def refresh(self) -> bool:
        try:
            data = json.loads(self.path.read_text())
            version, model = int(data["version"]), str(data.get("model") or self.base_model)
        except (OSError, ValueError, KeyError, TypeError):
            return False
        if version > self.version:
            self.version, self.model = version, model
            log.info("policy_version", version=version, model=model)
            return True
        return False


@dataclass
class PlayJob:
    env_id: str
    code: str
    name: str
    group: DocGroup | None  # None: a replayed environment
    params: dict[str, Any] | None = None  # a variant's knobs (None: the environment's defaults)
    move: str = "write"  # how it came to be played: write, edit, replay or fixed


@dataclass
class DocGroup:
    """The G designs of one document (move "write"), or the G edits of one stored variant
    (move "edit", `chunk` None), until all their rewards are known. `env_of` maps a design to
    what it is scored by: its environment id (write) or its variant id (edit)."""

    chunk: Chunk | None
    designs: list[Design] = field(default_factory=list)
    status: dict[str, DesignStatus] = field(default_factory=dict)
    env_of: dict[str, str] = field(default_factory=dict)
    regrets: dict[str, EnvRegret] = field(default_factory=dict)
    checks_passed: dict[str, float] = field(default_factory=dict)
    agent_samples: list[Sample] = field(default_factory=list)
    request_failures: list[str] = field(default_factory=list)  # kinds, this attempt
    unscored: set[str] = field(default_factory=set)  # env ids whose play was given up
    move: str = "write"
    label: str = ""  # the chunk id, or "edit:<variant id>"
    untrainable: set[str] = field(default_factory=set)  # designs with no trustworthy sample
    streams: Reservation | None = None  # its design requests' admission (one per request)
    pending: int = 0
    done: anyio.Event = field(default_factory=anyio.Event)


class Daemon:
    def __init__(self, cfg: SpadeConfig, *, pool: EndpointPool, sandbox: Sandbox,
                 memory: MemoryPort, spool: BatchSpool, corpus: CorpusSampler, chat: ChatTokens,
                 run_dir: Path) -> None:
        self.cfg, self.pool, self.sandbox, self.memory = cfg, pool, sandbox, memory
        self.spool, self.corpus, self.chat, self.run_dir = spool, corpus, chat, run_dir
        self.policy = PolicyVersion(current_path(cfg.paths.data_dir), cfg.model.served_name)
        self.counters: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self.regrets: list[float] = []
        self.iterations = 0
        self.started = time.time()
        self.in_flight: Counter[str] = Counter()
        self._load_samples: dict[str, deque[float]] = {}  # endpoint saturation, last minute
        # Saturation over the run, per endpoint and phase ("running", or "trainer_wait" while
        # back-pressure holds new work): [saturation-seconds, seconds] (DESIGN §10).
        self._sat: dict[str, dict[str, list[float]]] = {}
        self._sat_prev: dict[str, tuple[float, float]] = {}
        self._rng = random.Random(cfg.corpus.seed)
        self.stop_requested = anyio.Event()  # the CLI starts its drain deadline on it
        self.stop_reason: str | None = None
        self._stopped = False
        self.start_version = 0
        self.waiting_for_trainer = False
        self.metrics = Metrics()
        self.failures = Failures(run_dir, self.metrics)
        self._metas: dict[str, EnvMeta] = {}  # env id -> what it says about itself (knobs)
        self._knob_families: tuple[float, list[StoredEnv]] = (-1e9, [])
        self._vocab: TokenBytes | None = None
        # who designs, plays and evaluates where, and by which path (DESIGN §5)
        self.routes = {r: role_route(cfg, r) for r in ROLES}
        # how much is in flight: sized to the endpoints' capacity (spade_async.loop.admission)
        dcfg = cfg.daemon
        self.admission = Admission(
            pool, agent_group=self.routes["agent"].group,
            designer_group=self.routes["designer"].group, sandbox_slots=cfg.sandbox.slots,
            max_documents=dcfg.documents_in_flight, max_plays=dcfg.envs_in_flight,
            queue_size=dcfg.env_queue, plays_queued=self._queue_depth)

    # ---- the loop --------------------------------------------------------------------------

    async def run(self, max_iterations: int | None = None, *,
                  task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until `max_iterations` documents are through every stage, or `stop()`."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.policy.refresh()
        self.start_version = self.policy.version
        dcfg = self.cfg.daemon
        self._limit_iterations = max_iterations
        send_env, recv_env = anyio.create_memory_object_stream[PlayJob](dcfg.env_queue)
        self._send_env = send_env
        if dcfg.metrics_port:
            self.metrics.serve(dcfg.metrics_port)
        try:
            async with anyio.create_task_group() as outer:
                outer.start_soon(self._status_loop)
                if self.cfg.eval.every_versions:
                    outer.start_soon(self._eval_loop)
                task_status.started()
                if dcfg.bootstrap_seeds:
                    await self._bootstrap_seeds()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._fixed_loop if dcfg.mode == "fixed"
                                  else self._designer_loop, send_env)
                    tg.start_soon(self._player, recv_env)
                outer.cancel_scope.cancel()
        finally:  # also when the drain deadline cancels us: status says it stopped
            self._stopped = True
            self._write_status()
            log.info("daemon_stopped", iterations=self.iterations, reason=self.stop_reason,
                     **dict(self.counters))

    @property
    def _stopping(self) -> bool:
        return self.stop_requested.is_set()

    def stop(self, reason: str = "signal") -> None:
        """Finish the documents in flight, then return (SIGTERM/SIGINT, or a bounded run)."""
        if not self._stopping:
            self.stop_reason = reason
            self.stop_requested.set()

    def _sampled_with(self, version: int, *, episode: bool) -> None:
        """An agent episode (or, while there has been nothing to play, a design) finished on
        `version`: a bounded run may be done."""
        n = self.cfg.daemon.stop_after_versions
        nothing_to_play = not (self.counters["replays"] or self.counters["designs_accepted"])
        if (n and not self._stopping and version >= self.start_version + n
                and (episode or nothing_to_play)):
            log.info("stop_after_versions_reached", version=version,
                     start_version=self.start_version, stop_after_versions=n)
            self.stop("stop_after_versions")

    async def _bootstrap_seeds(self) -> None:
        """An empty memory gets the built-in seed environments (validated like any design)."""
        if await self.memory.accepted_count():
            return
        from spade_async.envs import seeds

        wanted = self.cfg.daemon.bootstrap_families
        files = sorted(p for p in Path(seeds.__file__).parent.glob("*.py")
                       if p.name != "__init__.py" and (wanted is None or p.stem in wanted))
        stored = 0

        async def one(f: Path) -> None:  # validations run side by side in the sandbox slots
            nonlocal stored
            code = f.read_text()
            try:
                report = await self._validate(code, seed=f.stem)
                status, _, reason = await self._memory_op(
                    lambda: self.memory.add_design(
                        code, report, doc_id=f"seed:{f.stem}", chunk_id="seed", excerpt="",
                        policy_version=0), seed=f.stem)
            except GaveUp as exc:
                await self.failures.give_up("seed", str(exc), seed=f.stem)
                return
            stored += status is DesignStatus.ACCEPTED
            if status is not DesignStatus.ACCEPTED:
                log.warning("seed_rejected", seed=f.stem, reason=reason)

        async with anyio.create_task_group() as tg:
            for f in files:
                tg.start_soon(one, f)
        self.counters["seeds_stored"] += stored
        log.info("memory_bootstrapped", seeds=stored, of=len(files))

    async def _designer_loop(self, send_env) -> None:
        """New work, admitted while the endpoints have room (spade_async.loop.admission): a
        document or an edit group, now and then a replay beside it; while the trainer has
        taken every batch, a replay of a played variant first (a batch after one play, not
        after a document's designs, validations and plays)."""
        dcfg, adm = self.cfg.daemon, self.admission
        designer_group = self.routes["designer"].group
        started = 0
        async with send_env, anyio.create_task_group() as tg:
            while not self._stopping and (self._limit_iterations is None
                                          or started < self._limit_iterations):
                await adm.wait(lambda: self._stopping or adm.can_design())
                await self._wait_for_trainer()  # the trainer's pace, once there is room
                if self._stopping:
                    break
                if not adm.can_design():  # the room went while the trainer was waited for
                    continue
                if adm.documents and self._spool_hungry() and await self._replay_one(
                        send_env.clone(), played=True):
                    self.counters["replays_for_hungry_trainer"] += 1
                    continue
                started += 1
                parent = await self._edit_parent() if self._next_move() == "edit" else None
                adm.documents += 1
                if parent is not None:
                    streams = adm.reserve(designer_group, dcfg.edits_per_variant)
                    tg.start_soon(self._edit_variant, parent, send_env.clone(), streams)
                else:
                    streams = adm.reserve(designer_group, dcfg.designs_per_document)
                    chunk = await anyio.to_thread.run_sync(next, self.corpus)
                    tg.start_soon(self._document, chunk, send_env.clone(), streams)
                if self._rng.random() < dcfg.replay_probability:
                    tg.start_soon(self._replay_one, send_env.clone())

    def _spool_hungry(self) -> bool:
        """The trainer has taken every batch written (only where one paces the daemon)."""
        return bool(self.cfg.daemon.max_batches_ahead) and (
            self.spool.last_seq() <= self.spool.taken_seq())

    def _pool_for(self, stream: Stream | None) -> Any:
        """The pool for one admitted stream's requests (its first marks it started)."""
        return self.pool if stream is None else StreamPool(self.pool, stream)

    def _document_ended(self, streams: Reservation) -> None:
        streams.close()
        self.admission.documents -= 1
        self.admission.notify()

    async def _fixed_loop(self, send_env) -> None:
        """mode = "fixed", the baseline: the memory's accepted environments at start, played
        in a shuffled round robin (reshuffled every pass). Everything after the env stream is
        the SPADE loop's own code, so the two runs differ only in where environments come
        from. One iteration is one environment played."""
        pool = await self.memory.fixed_pool()
        if not pool:
            log.error("fixed_pool_empty", hint="set daemon.bootstrap_seeds = true, or add "
                      "environments with `spade memory add`")
            self.stop("fixed pool empty")
            return
        log.info("fixed_pool", environments=len(pool))
        order = list(pool)
        started = 0
        async with send_env:
            while not self._stopping and (self._limit_iterations is None
                                          or started < self._limit_iterations):
                await self._wait_for_trainer()
                if self._stopping:
                    break
                if started % len(order) == 0:
                    self._rng.shuffle(order)
                env = order[started % len(order)]
                started += 1
                self.counters["fixed_plays"] += 1
                await send_env.send(PlayJob(env.env_id, env.code, env.name, None,
                                            params=env.params or None, move="fixed"))

    async def _eval_loop(self) -> None:
        """Held-out evaluation of every `eval.every_versions`-th published version (version 0,
        the base model, included), in the background: its requests share the pool with the
        loop's, at `eval.concurrency`, and a failure is logged, never raised into the loop.
        Versions already in <data_dir>/eval/results.jsonl are not evaluated again."""
        from spade_async.evals.base import load_results
        from spade_async.evals.bfcl import BfclSetupError
        from spade_async.evals.run import evaluate_version

        every = self.cfg.eval.every_versions
        done = {int(r.get("version", -1)) for r in load_results(self.cfg.paths.data_dir)
                if not r.get("external")}
        # The periodic evaluation is of the policy: roles.eval's route, unless that names
        # another model (`spade eval --model`'s business), then the agent's endpoints.
        route = self.routes["eval"]
        if route.model is not None:
            route = RoleRoute("eval", self.routes["agent"].group, None, "tokens")
        while True:
            self.policy.refresh()
            version, model = self.policy.version, self.policy.model
            if version % every == 0 and version not in done:
                done.add(version)
                self.in_flight["evals"] += 1
                try:
                    results = await evaluate_version(
                        self.cfg, self.pool, self.chat, version=version, model=model,
                        suites=self.cfg.eval.suites, sandbox=self.sandbox, route=route,
                        progress=lambda m: log.info("eval_progress", detail=m))
                    self.counters["evals"] += 1
                    for r in results:
                        log.info("evaluated", **r.summary())
                except Exception as exc:  # an evaluation never stops the self-play loop...
                    kind = "setup" if isinstance(exc, BfclSetupError) else failure_kind(exc)
                    if kind is None:
                        raise  # ...but a bug in it does: fail fast, with its traceback
                    self.counters["eval_failures"] += 1
                    self.failures.count("eval", kind, exc, version=version)
                finally:
                    self.in_flight["evals"] -= 1
            await anyio.sleep(self.cfg.daemon.status_interval_s)

    async def _wait_for_trainer(self) -> None:
        """Back-pressure: while `max_batches_ahead` batches wait in the spool for the trainer,
        sampling more would only make samples it drops as stale."""
        ahead_max = self.cfg.daemon.max_batches_ahead
        if not ahead_max:
            return
        while not self._stopping:
            ahead = self.spool.last_seq() - self.spool.taken_seq()
            if ahead < ahead_max:
                break
            if not self.waiting_for_trainer:
                self.waiting_for_trainer = True
                self.counters["trainer_waits"] += 1
                log.info("waiting_for_trainer", batches_ahead=ahead, max_batches_ahead=ahead_max)
            await anyio.sleep(0.25)
        self.waiting_for_trainer = False

    async def _replay_one(self, send_env, *, played: bool = False) -> bool:
        """A stored environment into the env stream, by the replay sampler; False when the
        memory has none to give. `played`: only a variant played before, by the sampler's
        priorities (what a hungry trainer gets: a variant known to vary pays a batch, where
        one never played, at its defaults, often pays nothing)."""
        async with send_env:
            try:
                env = await self._memory_op(
                    self.memory.sample_played if played else self.memory.sample_replay,
                    what="replay")
            except GaveUp as exc:
                await self.failures.give_up("replay", str(exc))
                return False
            if env is None:
                return False
            self.counters["replays"] += 1
            await send_env.send(PlayJob(env.env_id, env.code, env.name, None,
                                        params=env.params or None, move="replay"))
            return True

    # ---- the edit move (DESIGN §12) ---------------------------------------------------------

    def _next_move(self) -> str:
        moves = {k: w for k, w in self.cfg.daemon.moves.items() if w > 0}
        if len(moves) == 1:
            return next(iter(moves))
        x = self._rng.random() * sum(moves.values())
        for move, w in sorted(moves.items()):
            x -= w
            if x < 0:
                return move
        return "write"

    async def _meta(self, env_id: str, code: str) -> EnvMeta:
        """What a stored environment says about itself (its knobs), loaded in the sandbox
        once per daemon."""
        meta = self._metas.get(env_id)
        if meta is None:
            async def load() -> EnvMeta:
                async with self.sandbox.open(code) as env:
                    return env.meta

            meta = await self.failures.retrying("load", load,
                                                attempts=self.cfg.daemon.item_attempts,
                                                env_id=env_id)
            self._metas[env_id] = meta
        return meta

    async def _edit_parent(self) -> StoredEnv | None:
        """What the next edit starts from. An environment with knobs, uniformly (drawing
        variants by the replay sampler's priorities let the family with the most variants
        take every edit: 12 of 16 plays in a 13-minute embedded run), then, as ACCEL edits
        the most promising levels of its buffer, its played variant with the highest
        learnability (the most recently played among equals); an environment never played
        starts at its easiest point (ACCEL starts from simple levels). None (the move falls
        back to write) when no stored environment has knobs."""
        try:
            stamp, families = self._knob_families
            if time.monotonic() - stamp > 60 or not families:
                families = []
                for env in await self._memory_op(self.memory.fixed_pool, what="edit_parent"):
                    try:
                        if (await self._meta(env.env_id, env.code)).params:
                            families.append(env)
                    except GaveUp:
                        continue
                self._knob_families = (time.monotonic(), families)
            if not families:
                self.counters["edit_without_parent"] += 1
                return None
            env = self._rng.choice(families)
            played = await self._memory_op(lambda: self.memory.variants(env.env_id),
                                           what="edit_parent")
        except GaveUp as exc:
            await self.failures.give_up("edit_parent", str(exc))
            return None
        specs = self._metas[env.env_id].params
        if played:
            def promise(v: Any) -> tuple[float, float]:
                last = v.stats.last_played.timestamp() if v.stats.last_played else 0.0
                return (v.stats.learnability or 0.0, last)

            best = max(played, key=promise)
            try:
                params = resolve_params(specs, best.params)
            except ContractError:  # a variant stored before the knobs changed: start over
                params = easiest_point(specs)
        else:
            params = easiest_point(specs)
        return StoredEnv(env.env_id, env.code, env.name, params=params,
                         variant_id=variant_id(env.env_id, params))

    def _vocabulary(self) -> TokenBytes:
        if self._vocab is None:
            self._vocab = TokenBytes(self.chat.tok, self.chat.eos_ids)
        return self._vocab

    async def _edit_variant(self, parent: StoredEnv, send_env, streams: Reservation) -> None:
        """G edits of one stored variant, validated at their params, the accepted ones played
        (each distinct variant once), then one batch with their rewards normalised together."""
        group = DocGroup(None, move="edit", label=f"edit:{parent.variant_id}", streams=streams)
        try:
            async with send_env:
                try:
                    meta = await self._meta(parent.env_id, parent.code)
                    current = resolve_params(meta.params, parent.params)
                    played = [VariantView(v.params, v.episodes, v.stats.mean_unhinted,
                                          v.stats.mean_hinted)
                              for v in (await self._memory_op(
                                  lambda: self.memory.variants(parent.env_id),
                                  what="variants"))[:8]]
                except (GaveUp, ContractError) as exc:
                    await self.failures.give_up("edit", str(exc), env_id=parent.env_id)
                    return
                candidates = candidate_params(meta.params, current, self._rng,
                                              self.cfg.daemon.edit_options)
                if len(candidates) < 2:
                    self.counters["edit_without_options"] += 1
                    return
                await self._design_all(
                    group, lambda: self._one_edit(group, parent, meta, current, played,
                                                  candidates),
                    self.cfg.daemon.edits_per_variant)
                queued: set[str] = set()
                jobs = []
                for d in group.designs:
                    key = group.env_of.get(d.design_id)
                    if group.status[d.design_id] is DesignStatus.ACCEPTED and key not in queued:
                        queued.add(key)
                        jobs.append(PlayJob(parent.env_id, parent.code, parent.name, group,
                                            params=d.params, move="edit"))
                group.pending = len(jobs)
                if not jobs:
                    group.done.set()
                for job in jobs:
                    await send_env.send(job)
            await group.done.wait()
            await self._finish_document(group)
        finally:
            self._document_ended(streams)

    async def _one_edit(self, group: DocGroup, parent: StoredEnv, meta: EnvMeta,
                        current: dict[str, Any], played: list[VariantView],
                        candidates: list[dict[str, Any]]) -> None:
        dcfg = self.cfg.daemon
        self.in_flight["designs"] += 1
        self.policy.refresh()
        route = self.routes["designer"]
        stream = group.streams.take() if group.streams is not None else None
        try:
            d = await propose_edit(
                self._pool_for(stream), self.chat, self._vocabulary(), env_id=parent.env_id,
                name=meta.name, description=meta.description, specs=meta.params,
                current=current, played=played, candidates=candidates,
                signal=self.cfg.regret.signal, model=route.model or self.policy.model,
                policy_version=self.policy.version, temperature=dcfg.designer_temperature,
                deadline_s=self.cfg.rollout.request_deadline_s, path=route.path,
                group=route.group,
                structured=route.path == "chat" and group_has(self.pool, route.group,
                                                               "structured"))
        except EndpointError as exc:
            self.failures.count("edit", exc.kind, exc, env_id=parent.env_id)
            group.request_failures.append(exc.kind)
            return
        finally:
            self.in_flight["designs"] -= 1
            if stream is not None:
                stream.end()
        self.counters["designs"] += 1
        self.counters["moves_edit_proposed"] += 1
        self._sampled_with(d.policy_version, episode=False)
        d.code = parent.code
        report: ValidationReport | None = None
        vid = None
        if d.params is None:
            status, reason = DesignStatus.INVALID, f"edit.answer: {d.error}"
            if d.allowed is None and d.trainable:  # the server's constraint is not ours
                group.untrainable.add(d.design_id)
                self.counters["edit_constraint_mismatch"] += 1
        else:
            vid = variant_id(parent.env_id, d.params)
            try:
                report = await self._validate(parent.code, params=d.params,
                                              env_id=parent.env_id, design_id=d.design_id)
            except GaveUp as exc:
                await self.failures.give_up("edit", str(exc), env_id=parent.env_id,
                                            design_id=d.design_id, failed_in=exc.stage)
                return
            status = DesignStatus.ACCEPTED if report.accepted else DesignStatus.INVALID
            reason = report.reason
            group.checks_passed[d.design_id] = report.progress
        group.designs.append(d)
        group.status[d.design_id] = status
        if status is DesignStatus.ACCEPTED:
            group.env_of[d.design_id] = vid or ""
            self.counters["moves_edit_accepted"] += 1
        else:
            key = reason.split(":")[0] if reason else "unknown"
            self.reasons[key] += 1
            self.metrics.rejections.labels(key).inc()
        self.counters[f"designs_{status.value}"] += 1
        self.metrics.designs.labels(status.value).inc()
        self.metrics.tokens.labels("designer").inc(d.completion_tokens)
        log.info("edit", env_id=parent.env_id, parent=parent.variant_id, params=d.params,
                 status=status.value, reason=reason or None)
        await self._append("designs", {
            "time": time.time(), "design_id": d.design_id, "doc_id": d.doc_id,
            "chunk_id": group.label, "policy_version": d.policy_version,
            "status": status.value, "reason": reason.split(":")[0] if reason else "",
            "env_id": parent.env_id, "completion_tokens": d.completion_tokens,
            "progress": report.progress if report is not None else 0.0, "move": "edit",
            "parent": parent.variant_id, "params": d.params, "variant_id": vid,
            "family": meta.name, "path": d.path, "model": d.model})

    async def _document(self, chunk: Chunk, send_env, streams: Reservation) -> None:
        group = DocGroup(chunk, label=chunk.chunk_id, streams=streams)
        log.info("document_start", chunk=chunk.chunk_id, seq=chunk.seq)
        try:
            async with send_env:
                examples = await self._examples(chunk)
                await self._design_all(group, lambda: self._one_design(group, examples),
                                       self.cfg.daemon.designs_per_document)
                accepted = [d for d in group.designs
                            if group.status[d.design_id] is DesignStatus.ACCEPTED]
                group.pending = len(accepted)
                if not accepted:
                    group.done.set()
                for d in accepted:
                    env_id = group.env_of[d.design_id]
                    await send_env.send(PlayJob(env_id, d.code or "", env_id, group,
                                                move="write"))
            await group.done.wait()
            await self._finish_document(group)
        finally:
            self._document_ended(streams)

    async def _examples(self, chunk: Chunk) -> list[str]:
        """Memory examples for the designer prompt; a failed search designs without them."""
        if not self.cfg.daemon.examples_k:
            return []
        try:
            return await self.memory.examples(chunk.text, self.cfg.daemon.examples_k)
        except Exception as exc:
            kind = failure_kind(exc)
            if kind is None:
                raise
            self.failures.count("examples", kind, exc, chunk=chunk.chunk_id)
            return []

    async def _design_all(self, group: DocGroup, one: Any, n: int) -> None:
        """The group's G designs (`one()` makes one). When the endpoints failed every one of
        them, the group is designed again after a back-off (1 s, doubling to 30 s): an outage
        (no endpoint up, connection refused, the model not served yet) is waited out, so a
        dead endpoint neither spins through the corpus nor loses documents; other failures
        (timeouts, deadlines, 5xx, malformed answers) get `daemon.document_attempts` tries,
        then the document (or edited variant) is given up and recorded."""
        dcfg = self.cfg.daemon
        delay, tries = 1.0, 0
        while True:
            group.request_failures = []
            if group.streams is None or not group.streams.left:  # a second round
                group.streams = self.admission.reserve(self.routes["designer"].group, n)
            try:
                async with anyio.create_task_group() as tg:
                    for _ in range(n):
                        tg.start_soon(one)
            finally:
                group.streams.close()
            failed = group.request_failures
            if group.designs or len(failed) < n or self._stopping:
                return
            outage = all(kind in OUTAGE for kind in failed)
            tries += 0 if outage else 1
            if tries >= dcfg.document_attempts:
                await self.failures.give_up(
                    "document" if group.move == "write" else "edit",
                    f"all {n} design requests failed on {tries} tries (last: "
                    + ", ".join(f"{k} {v}" for k, v in sorted(Counter(failed).items())) + ")",
                    chunk=group.label)
                return
            self.counters["documents_retried"] += 1
            log.warning("document_designs_all_failed", chunk=group.label,
                        kinds=sorted(set(failed)), outage=outage, retry_in_s=delay,
                        tries=tries, of=dcfg.document_attempts)
            end = time.monotonic() + delay
            while not self._stopping and time.monotonic() < end:
                await anyio.sleep(min(0.2, end - time.monotonic()))
            delay = min(30.0, delay * 2)

    async def _validate(self, code: str, params: dict[str, Any] | None = None,
                        **context: Any) -> ValidationReport:
        """The validation pipeline (at `params` only, for an edit's variant); a sandbox
        worker that did not start is the host's fault, not the design's, and is tried again
        (`daemon.item_attempts`)."""
        self.in_flight["validations"] += 1
        try:
            return await self.failures.retrying(
                "validation", lambda: validate(code, self.sandbox, self.cfg.validation,
                                               params=params),
                attempts=self.cfg.daemon.item_attempts, **context)
        finally:
            self.in_flight["validations"] -= 1

    async def _memory_op(self, call: Any, **context: Any) -> Any:
        """A memory operation, tried again on I/O failure (each is idempotent: inserts are
        keyed by the code's hash)."""
        return await self.failures.retrying("memory", call,
                                            attempts=self.cfg.daemon.item_attempts, **context)

    async def _one_design(self, group: DocGroup, examples: list[str]) -> None:
        dcfg, chunk = self.cfg.daemon, group.chunk
        self.in_flight["designs"] += 1
        self.policy.refresh()  # a retried document designs with the newest policy
        route = self.routes["designer"]
        stream = group.streams.take() if group.streams is not None else None
        try:
            d = await design(
                self._pool_for(stream), self.chat, doc_id=chunk.doc_id, chunk_id=chunk.chunk_id,
                excerpt=chunk.text, examples=examples, model=route.model or self.policy.model,
                policy_version=self.policy.version, max_tokens=dcfg.designer_max_tokens,
                temperature=dcfg.designer_temperature, prefill=dcfg.designer_prefill,
                max_seq_len=self.cfg.rollout.max_seq_len,
                deadline_s=self.cfg.rollout.request_deadline_s, path=route.path,
                group=route.group,
            )
        except EndpointError as exc:
            self.failures.count("design", exc.kind, exc, chunk=chunk.chunk_id)
            group.request_failures.append(exc.kind)
            return
        finally:
            self.in_flight["designs"] -= 1
            if stream is not None:
                stream.end()
        self.counters["designs"] += 1
        self.counters["moves_write_proposed"] += 1
        self._sampled_with(d.policy_version, episode=False)
        try:
            report = None if d.code is None else await self._validate(
                d.code, chunk=chunk.chunk_id, design_id=d.design_id)
            status, env_id, reason = await self._memory_op(
                lambda: self.memory.add_design(
                    d.code, report, doc_id=chunk.doc_id, chunk_id=chunk.chunk_id,
                    excerpt=chunk.text, policy_version=d.policy_version),
                chunk=chunk.chunk_id, design_id=d.design_id)
        except GaveUp as exc:
            # Not the designer's doing: the design gets no reward and no sample.
            await self.failures.give_up("design", str(exc), chunk=chunk.chunk_id,
                                        design_id=d.design_id, failed_in=exc.stage)
            return
        group.designs.append(d)
        group.status[d.design_id] = status
        if report is not None:
            group.checks_passed[d.design_id] = report.progress
        self.counters[f"designs_{status.value}"] += 1
        self.metrics.designs.labels(status.value).inc()
        self.metrics.tokens.labels("designer").inc(d.completion_tokens)
        if status is DesignStatus.ACCEPTED:
            group.env_of[d.design_id] = env_id or ""
            self.counters["moves_write_accepted"] += 1
        else:
            key = reason.split(":")[0] if reason else "unknown"
            self.reasons[key] += 1
            self.metrics.rejections.labels(key).inc()
        log.info("design", chunk=chunk.chunk_id, status=status.value, env_id=env_id,
                 reason=reason or None)
        await self._append("designs", {
            "time": time.time(), "design_id": d.design_id, "doc_id": chunk.doc_id,
            "chunk_id": chunk.chunk_id, "policy_version": d.policy_version,
            "status": status.value, "reason": reason.split(":")[0] if reason else "",
            "env_id": env_id, "completion_tokens": d.completion_tokens,
            "progress": report.progress if report is not None else 0.0, "move": "write",
            "parent": None, "params": None, "variant_id": None,
            "family": report.meta.name if report is not None and report.meta else None,
            "path": d.path, "model": d.model})

    # ---- playing ---------------------------------------------------------------------------

    async def _player(self, recv_env) -> None:
        """Takes accepted environments off the stream in order and starts each play once
        there is room for its K_u + K_h episodes (spade_async.loop.admission): how many plays run
        at once follows the agent endpoints' capacity and the sandbox slots."""
        adm = self.admission
        width = self.cfg.rollout.k_unhinted + self.cfg.rollout.k_hinted
        async with recv_env, anyio.create_task_group() as tg:
            async for job in recv_env:
                adm.holding_play = True
                await adm.wait(lambda: adm.can_play(width))
                adm.holding_play = False
                adm.plays += 1
                tg.start_soon(self._play_admitted, job,
                              adm.reserve(self.routes["agent"].group, width, episodes=True))

    async def _play_admitted(self, job: PlayJob, streams: Reservation) -> None:
        try:
            await self._play(job, streams)
        finally:
            streams.close()
            self.admission.plays -= 1
            self.admission.notify()
            if job.group is not None:
                job.group.pending -= 1
                if job.group.pending <= 0:
                    job.group.done.set()

    async def _play(self, job: PlayJob, streams: Reservation | None = None) -> None:
        """K_u unhinted and K_h hinted episodes of one environment, its regret, its memory
        stats and its agent samples. Only episodes that ran to their end are scores: one that
        failed (endpoint, sandbox, deadline) after its tries never enters R_u, R_h or the
        memory, and when a side has no score left the play is given up (recorded). A
        variant is played at its params with every knob's value filled in, so its statistics
        land under one variant id whoever asked for it."""
        rcfg = self.cfg.rollout
        try:
            meta = await self._meta(job.env_id, job.code)
            job.params = resolve_params(meta.params, job.params) or None
        except (GaveUp, ContractError) as exc:
            await self.failures.give_up("play", f"cannot play at {job.params}: {exc}",
                                        env_id=job.env_id)
            if job.group is not None:
                job.group.unscored.add(self._group_key(job))
            return
        self.policy.refresh()
        version = self.policy.version
        results: dict[bool, list[Episode]] = {False: [], True: []}

        async def one(hinted: bool, seed: int) -> None:
            stream = streams.take() if streams is not None else None
            try:
                ep = await self._episode(job, hinted, seed, stream)
            finally:
                if stream is not None:
                    stream.end()
            results[hinted].append(ep)
            await self._record_episode(ep)

        seeds = [self._rng.randrange(2**31) for _ in range(rcfg.k_unhinted)]
        async with anyio.create_task_group() as tg:
            for s in seeds:
                tg.start_soon(one, False, s)
            for s in seeds[: rcfg.k_hinted] + [self._rng.randrange(2**31)
                                               for _ in range(rcfg.k_hinted - len(seeds))]:
                tg.start_soon(one, True, s)
        samples = self._agent_samples(results, version)
        scored = {h: [e.score for e in eps if e.error is None] for h, eps in results.items()}
        copies = [e.hint_copy or 0.0 for e in results[True] if e.error is None]
        # episodes the environment's own code failed (not the host's: sandbox_start) are
        # counted against it in the memory, never scored
        env_failed = sum(1 for eps in results.values() for e in eps
                         if e.error and (e.error_kind or "").startswith("sandbox_")
                         and e.error_kind != "sandbox_start")
        if scored[False] and scored[True]:
            await self._score_play(job, scored[False], scored[True], version, copies,
                                   env_failed)
        else:
            if env_failed:
                try:
                    await self._memory_op(lambda: self.memory.record_failures(
                        job.env_id, env_failed, params=job.params or None), env_id=job.env_id)
                except GaveUp as exc:
                    await self.failures.give_up("play_stats", str(exc), env_id=job.env_id)
            failed = Counter(e.error_kind for eps in results.values() for e in eps if e.error)
            await self.failures.give_up(
                "play", f"no score on one side: {len(scored[False])}/{len(results[False])} "
                f"unhinted and {len(scored[True])}/{len(results[True])} hinted episodes "
                "finished (failed: " + ", ".join(f"{k} {v}" for k, v in sorted(failed.items()))
                + ")", env_id=job.env_id, replayed=job.group is None)
            if job.group is not None:
                job.group.unscored.add(self._group_key(job))
        if job.group is not None:
            job.group.agent_samples += samples
        elif samples:
            await self._write_batch(samples)
        if self.cfg.daemon.mode == "fixed":
            self.iterations += 1

    async def _score_play(self, job: PlayJob, unhinted: list[float], hinted: list[float],
                          version: int, hint_copies: list[float] | None = None,
                          sandbox_failures: int = 0) -> None:
        """The play's regret and both signals; hinted wins copied from the hint discount the
        designer's reward and, past regret.leak_threshold, flag the environment (counted,
        logged, and kept per variant in the memory as hint_leak)."""
        regret = env_regret(unhinted, hinted, self.cfg.regret, hint_copies)
        if regret.leak_flagged:
            self.counters["plays_leak_flagged"] += 1
            log.warning("hint_leak_in_play", env_id=job.env_id, hint_leak=round(regret.hint_leak, 3),
                        move=job.move)
        self.regrets.append(regret.regret)
        self.metrics.regret.observe(regret.regret)
        if job.group is not None:
            job.group.regrets[self._group_key(job)] = regret
            self.counters[f"moves_{job.group.move}_played"] += 1
        params = job.params or {}
        vid = variant_id(job.env_id, params)
        try:
            await self._memory_op(lambda: self.memory.record_play(
                job.env_id, unhinted, hinted, regret, replayed=job.group is None,
                params=params or None, hint_copies=hint_copies or None,
                sandbox_failures=sandbox_failures), env_id=job.env_id)
        except GaveUp as exc:  # the regret still counts; the memory's stats miss this play
            await self.failures.give_up("play_stats", str(exc), env_id=job.env_id)
        meta = self._metas.get(job.env_id)
        log.info("env_played", env_id=job.env_id, variant_id=vid, params=params or None,
                 move=job.move, replayed=job.group is None,
                 **{k: round(v, 4) if isinstance(v, float) else v
                    for k, v in regret.as_dict().items()})
        await self._append("plays", {"time": time.time(), "env_id": job.env_id,
                                     "variant_id": vid, "params": params,
                                     "name": meta.name if meta else job.name, "move": job.move,
                                     "replayed": job.group is None, "policy_version": version,
                                     "unhinted": unhinted, "hinted": hinted,
                                     **regret.as_dict()})

    @staticmethod
    def _group_key(job: PlayJob) -> str:
        """What a group scores a design by: the environment (write) or the variant (edit)."""
        if job.group is not None and job.group.move == "edit":
            return variant_id(job.env_id, job.params or {})
        return job.env_id

    async def _episode(self, job: PlayJob, hinted: bool, seed: int,
                       stream: Stream | None = None) -> Episode:
        """One episode, tried again when the endpoint failed it or no sandbox worker started
        (`rollout.episode_attempts`; an outage is waited out without using them). The last
        try is returned, failed or not. Every try samples with the newest published policy:
        a server restarted meanwhile holds only that one, so an older adapter would never
        come back."""
        tries, delay = 0, 1.0
        while True:
            self.policy.refresh()
            ep = await self._episode_once(job, hinted, seed, self.policy.model,
                                          self.policy.version, stream)
            if ep.error is None:
                return ep
            kind = ep.error_kind or "unknown"
            self.failures.count("episode", kind, None, env_id=job.env_id,
                                episode_id=ep.episode_id, hinted=hinted, error=ep.error[:600])
            tries += 0 if kind in OUTAGE else 1
            retry = kind in OUTAGE or kind in RETRY_EPISODE
            if not retry or tries >= self.cfg.rollout.episode_attempts or self._stopping:
                return ep
            end = time.monotonic() + delay
            while not self._stopping and time.monotonic() < end:
                await anyio.sleep(min(0.2, end - time.monotonic()))
            delay = min(30.0, delay * 2)

    async def _episode_once(self, job: PlayJob, hinted: bool, seed: int, model: str,
                            version: int, stream: Stream | None = None) -> Episode:
        self.in_flight["episodes"] += 1
        try:
            return await play_in_sandbox(self.sandbox, job.code, self._pool_for(stream),
                                         self.chat,
                                         env_id=job.env_id, seed=seed, hinted=hinted,
                                         model=model, policy_version=version,
                                         cfg=self.cfg.rollout, params=job.params,
                                         group=self.routes["agent"].group)
        except (SandboxError, EndpointError) as exc:
            return Episode(f"ep-{uuid.uuid4().hex[:12]}", job.env_id, seed, hinted, version,
                           model, error=f"{type(exc).__name__}: {exc}",
                           error_kind=failure_kind(exc))
        finally:
            self.in_flight["episodes"] -= 1

    async def _record_episode(self, ep: Episode) -> None:
        self.counters["episodes"] += 1
        self.counters["episodes_hinted" if ep.hinted else "episodes_unhinted"] += 1
        if ep.error:
            self.counters["episode_errors"] += 1
        self.counters["tokens_sampled"] += ep.sampled_tokens
        self.metrics.episodes.labels(str(ep.hinted).lower(), "error" if ep.error else "ok").inc()
        self.metrics.tokens.labels("agent").inc(ep.sampled_tokens)
        await self._append("episodes", {"time": time.time(), **ep.as_record()})
        if ep.error is None and ep.sampled_tokens:
            self._sampled_with(ep.policy_version, episode=True)

    def _agent_samples(self, results: dict[bool, list[Episode]], version: int) -> list[Sample]:
        eps = self.cfg.regret.advantage_eps
        groups = [results[False]] + ([results[True]] if self.cfg.regret.train_on_hinted else [])
        out: list[Sample] = []
        for episodes in groups:
            usable = [e for e in episodes if e.sampled_tokens and e.error is None]
            adv = group_advantages([e.score for e in usable], eps)
            if adv is None:
                self.counters["agent_groups_zero_variance"] += 1
                continue
            for e, a in zip(usable, adv, strict=True):
                out.append(Sample(
                    sample_id=e.episode_id, role="agent", env_id=e.env_id,
                    policy_version=e.policy_version, token_ids=e.token_ids,
                    loss_mask=e.loss_mask, behaviour_logprobs=e.logprobs, advantage=a,
                    reward=e.score, episode_id=e.episode_id, hinted=e.hinted,
                ))
        return out

    # ---- batches ---------------------------------------------------------------------------

    async def _finish_document(self, group: DocGroup) -> None:
        # A design whose environment could not be scored (its play was given up) has no
        # reward: it is left out of the group rather than paid for our failures.
        designs = [d for d in group.designs
                   if group.env_of.get(d.design_id) not in group.unscored
                   and d.design_id not in group.untrainable]
        if not self.routes["designer"].trained:
            # A frozen designer (another model): its designs are rewarded in the logs and the
            # memory, but never trained on; the agent's samples go as usual.
            self.counters["designer_samples_frozen"] += len(designs)
            designs = []
        rewards = []
        for d in designs:
            st = group.status[d.design_id]
            rewards.append(design_reward(st, group.regrets.get(group.env_of.get(d.design_id, "")),
                                         self.cfg.regret, group.checks_passed.get(d.design_id, 0)))
        samples = list(group.agent_samples)
        adv = group_advantages(rewards, self.cfg.regret.advantage_eps) if designs else None
        if adv is None and designs:
            self.counters["designer_groups_zero_variance"] += 1
        elif adv is not None:
            for d, a, r in zip(designs, adv, rewards, strict=True):
                samples.append(Sample(
                    sample_id=d.design_id, role="designer",
                    env_id=group.env_of.get(d.design_id, ""), policy_version=d.policy_version,
                    token_ids=d.token_ids, loss_mask=d.loss_mask, behaviour_logprobs=d.logprobs,
                    advantage=a, reward=r, move=d.move, allowed_tokens=d.allowed,
                ))
        if samples:
            await self._write_batch(samples)
        if group.chunk is not None:
            await anyio.to_thread.run_sync(self.corpus.commit, group.chunk)
        self.iterations += 1
        log.info("iteration", n=self.iterations, chunk=group.label, move=group.move,
                 designs=len(group.designs), samples=len(samples))

    async def _write_batch(self, samples: list[Sample]) -> None:
        self.policy.refresh()
        floor = self.policy.version - self.cfg.daemon.max_staleness
        fresh = [s for s in samples if s.policy_version >= floor]
        self.counters["samples_stale_dropped"] += len(samples) - len(fresh)
        if not fresh:
            return
        try:  # a failed write leaves no batch behind (temp file, then rename): safe to redo
            seq = await self.failures.retrying(
                "spool", lambda: anyio.to_thread.run_sync(self.spool.write, fresh),
                attempts=self.cfg.daemon.item_attempts, samples=len(fresh))
        except GaveUp as exc:
            await self.failures.give_up("batch", str(exc), samples=len(fresh))
            return
        self.counters["batches"] += 1
        self.counters["samples"] += len(fresh)
        self.metrics.batches.inc()
        self.metrics.stale.inc(len(samples) - len(fresh))
        for s in fresh:
            self.metrics.samples.labels(s.role).inc()
        versions = [s.policy_version for s in fresh]
        self.metrics.staleness.set(max(versions) - min(versions))
        log.info("batch_written", seq=seq, samples=len(fresh),
                 agent=sum(s.role == "agent" for s in fresh),
                 designer=sum(s.role == "designer" for s in fresh))

    # ---- inspection ------------------------------------------------------------------------

    async def _append(self, log_name: str, record: dict[str, Any]) -> None:
        """One line of <run_dir>/{designs,episodes,plays}.jsonl: what `spade report` plots."""
        await anyio.to_thread.run_sync(append_jsonl, self.run_dir / f"{log_name}.jsonl", record)

    def status(self) -> dict[str, Any]:
        regrets = sorted(self.regrets)
        endpoints = self.pool.snapshot()
        for ep in endpoints:
            samples = self._load_samples.get(ep["name"], ())
            ep["saturation"] = round(ep["in_flight"] / ep["max_concurrency"], 3)
            ep["saturation_mean_60s"] = (round(sum(samples) / len(samples), 3)
                                         if samples else None)
            ep["saturation_run"] = self.saturation_run(ep["name"])
        return {
            "pid": os.getpid(),
            "updated_at": time.time(),
            "uptime_s": round(time.time() - self.started, 1),
            "iterations": self.iterations,
            "policy_version": self.policy.version,
            "model": self.policy.model,
            "counters": dict(self.counters),
            "failures": self.failures.as_dict(),
            "rejection_reasons": dict(self.reasons),
            "in_flight": dict(self.in_flight),
            "admission": self.admission.as_dict(),
            "env_queue_depth": self._queue_depth(),
            "env_queue_size": self.cfg.daemon.env_queue,
            "endpoints": endpoints,
            "roles": {r: route.as_dict() for r, route in self.routes.items()},
            "regret": regret_distribution(regrets),
            "stopping": self._stopping,
            "stopped": self._stopped,
            "stop_reason": self.stop_reason,
            "start_version": self.start_version,
            "waiting_for_trainer": self.waiting_for_trainer,
        }

    def _write_status(self) -> None:
        # rewritten every few seconds: atomic (readers never see half), not fsynced
        atomic_write_text(self.run_dir / "status.json", json.dumps(self.status(), indent=1),
                          durable=False)

    async def _status_loop(self) -> None:
        while True:
            m = self.metrics
            m.policy_version.set(self.policy.version)
            for stage in ("designs", "validations", "episodes"):
                m.in_flight.labels(stage).set(self.in_flight[stage])
            for ep in self.pool.snapshot():
                m.endpoint_in_flight.labels(ep["name"]).set(ep["in_flight"])
                window = self._load_samples.setdefault(ep["name"], deque(maxlen=max(
                    1, round(60 / self.cfg.daemon.status_interval_s))))
                window.append(ep["in_flight"] / ep["max_concurrency"])
                self._account_saturation(ep["name"])
            m.queue_depth.set(self._queue_depth())
            await anyio.to_thread.run_sync(self._write_status)
            await anyio.sleep(self.cfg.daemon.status_interval_s)

    def _account_saturation(self, name: str) -> None:
        """Add the time since the last tick to the run's saturation of endpoint `name`, in the
        phase the daemon is in now (waiting for the trainer or not)."""
        area, now = self.pool.saturation_area(name), time.monotonic()
        prev = self._sat_prev.get(name)
        self._sat_prev[name] = (area, now)
        if prev is None:
            return
        phase = "trainer_wait" if self.waiting_for_trainer else "running"
        acc = self._sat.setdefault(name, {"running": [0.0, 0.0], "trainer_wait": [0.0, 0.0]})
        acc[phase][0] += area - prev[0]
        acc[phase][1] += now - prev[1]
        for ph, (a, t) in acc.items():
            if t > 0:
                self.metrics.endpoint_saturation.labels(name, ph).set(round(a / t, 4))

    def saturation_run(self, name: str) -> dict[str, Any] | None:
        """Mean saturation of endpoint `name` over the run: in all, while running, while
        waiting for the trainer, and the share of the time spent waiting."""
        acc = self._sat.get(name)
        if not acc:
            return None
        (ra, rt), (wa, wt) = acc["running"], acc["trainer_wait"]
        total = rt + wt
        return {"mean": round((ra + wa) / total, 4) if total else None,
                "running": round(ra / rt, 4) if rt else None,
                "trainer_wait": round(wa / wt, 4) if wt else None,
                "trainer_wait_share": round(wt / total, 4) if total else None,
                "seconds": round(total, 1)}

    def _queue_depth(self) -> int:
        stream = getattr(self, "_send_env", None)
        return stream.statistics().current_buffer_used if stream is not None else 0
