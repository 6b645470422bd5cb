"""Where the loop's work comes from: the seed environments an empty memory starts with; the
designer source (documents from the corpus and edits of stored variants, admitted while the
endpoints have room, paced by the trainer, with replays beside them); and, for the
fixed-environment baseline, the memory's accepted environments in a shuffled round robin."""

from __future__ import annotations

from pathlib import Path

import anyio

from spade_async.core.logs import get_logger
from spade_async.corpus.sampler import CorpusSampler
from spade_async.envs.knobs import easiest_point
from spade_async.loop.context import LoopContext
from spade_async.loop.design import Documents
from spade_async.loop.edit import Edits
from spade_async.loop.failures import GaveUp
from spade_async.loop.jobs import PlayJob
from spade_async.loop.ports import StoredEnv
from spade_async.reward.regret import DesignStatus

log = get_logger("daemon")


async def bootstrap_seeds(ctx: LoopContext) -> None:
    """An empty memory gets the built-in seed environments (validated like any design)."""
    if await ctx.memory.accepted_count():
        return
    from spade_async.envs import seeds

    wanted = ctx.cfg.daemon.bootstrap_families
    files = sorted(p for p in Path(seeds.__file__).parent.glob("*.py")
                   if p.name != "__init__.py" and (wanted is None or p.stem in wanted))
    stored = 0

    async def one(f: Path) -> None:  # validations run side by side in the sandbox slots
        nonlocal stored
        code = f.read_text()
        try:
            report = await ctx.validate(code, seed=f.stem)
            status, _, reason = await ctx.memory_op(
                lambda: ctx.memory.add_design(
                    code, report, doc_id=f"seed:{f.stem}", chunk_id="seed", excerpt="",
                    policy_version=0), seed=f.stem)
        except GaveUp as exc:
            await ctx.failures.give_up("seed", str(exc), seed=f.stem)
            return
        stored += status is DesignStatus.ACCEPTED
        if status is not DesignStatus.ACCEPTED:
            log.warning("seed_rejected", seed=f.stem, reason=reason)

    async with anyio.create_task_group() as tg:
        for f in files:
            tg.start_soon(one, f)
    ctx.counters["seeds_stored"] += stored
    log.info("memory_bootstrapped", seeds=stored, of=len(files))


class TrainerPace:
    """Back-pressure from the trainer: while `max_batches_ahead` batches wait in the spool,
    sampling more would only make samples it drops as stale."""

    def __init__(self, ctx: LoopContext) -> None:
        self.ctx = ctx
        # plays under way whose samples go straight into a batch of their own (replays and the
        # fixed pool's plays): batches on their way, counted as ahead already
        self.direct_plays = 0

    async def wait(self) -> None:
        ctx = self.ctx
        ahead_max = ctx.cfg.daemon.max_batches_ahead
        if not ahead_max:
            return
        while not ctx.stopping:
            ahead = ctx.spool.last_seq() - ctx.spool.taken_seq() + self.direct_plays
            if ahead < ahead_max:
                break
            if not ctx.waiting_for_trainer:
                ctx.waiting_for_trainer = True
                ctx.counters["trainer_waits"] += 1
                log.info("waiting_for_trainer", batches_ahead=ahead, max_batches_ahead=ahead_max)
            await anyio.sleep(0.25)
        ctx.waiting_for_trainer = False

    def hungry(self) -> bool:
        """The trainer has taken every batch written (only where one paces the daemon)."""
        ctx = self.ctx
        return bool(ctx.cfg.daemon.max_batches_ahead) and (
            ctx.spool.last_seq() <= ctx.spool.taken_seq())


async def _at_easiest(ctx: LoopContext, env: StoredEnv) -> StoredEnv:
    """An environment never played, at its easiest point when it has knobs (as it is when its
    knobs cannot be read)."""
    specs = await ctx.knobs(env)
    return env.at(easiest_point(specs)) if specs else env


async def replay_one(ctx: LoopContext, send_env, *, played: bool = False) -> bool:
    """A stored environment into the env stream, by the replay sampler; False when the
    memory has none to give. `played`: only a variant played before, by the sampler's
    priorities (what a hungry trainer gets: a variant known to vary pays a batch, where
    one never played often pays nothing). An environment never played is played at its
    easiest point (`daemon.unseen_rung`)."""
    async with send_env:
        try:
            env = await ctx.memory_op(
                ctx.memory.sample_played if played else ctx.memory.sample_replay,
                what="replay")
        except GaveUp as exc:
            await ctx.failures.give_up("replay", str(exc))
            return False
        if env is None:
            return False
        if not env.params and ctx.cfg.daemon.unseen_rung == "easiest":
            env = await _at_easiest(ctx, env)
        ctx.counters["replays"] += 1
        await send_env.send(PlayJob(env.env_id, env.code, env.name, None,
                                    params=env.params or None, move="replay"))
        return True


class DesignerSource:
    """New work, admitted while the endpoints have room (spade_async.loop.admission): a
    document or an edit group, now and then a replay beside it; while the trainer has taken
    every batch, a replay of a played variant first (a batch after one play, not after a
    document's designs, validations and plays)."""

    def __init__(self, ctx: LoopContext, corpus: CorpusSampler, documents: Documents,
                 edits: Edits, pace: TrainerPace) -> None:
        self.ctx, self.corpus, self.documents, self.edits = ctx, corpus, documents, edits
        self.pace = pace

    async def run(self, send_env, limit: int | None) -> None:
        ctx, adm = self.ctx, self.ctx.admission
        dcfg = ctx.cfg.daemon
        designer_group = ctx.routes["designer"].group
        started = 0
        async with send_env, anyio.create_task_group() as tg:
            while not ctx.stopping and (limit is None or started < limit):
                await adm.wait(lambda: ctx.stopping or adm.can_design())
                await self.pace.wait()  # the trainer's pace, once there is room
                if ctx.stopping:
                    break
                if not adm.can_design():  # the room went while the trainer was waited for
                    continue
                if adm.documents and self.pace.hungry() and await replay_one(
                        ctx, send_env.clone(), played=True):
                    ctx.counters["replays_for_hungry_trainer"] += 1
                    continue
                started += 1
                parent = await self.edits.parent() if self.edits.next_move() == "edit" else None
                adm.documents += 1
                if parent is not None:
                    streams = adm.reserve(designer_group, dcfg.edits_per_variant)
                    tg.start_soon(self.edits.run, parent, send_env.clone(), streams)
                else:
                    streams = adm.reserve(designer_group, dcfg.designs_per_document)
                    chunk = await anyio.to_thread.run_sync(next, self.corpus)
                    tg.start_soon(self.documents.run, chunk, send_env.clone(), streams)
                if ctx.rng.random() < dcfg.replay_probability:
                    tg.start_soon(replay_one, ctx, send_env.clone())


class FixedSource:
    """mode = "fixed", the baseline: the memory's accepted environments at start, played
    in a shuffled round robin (reshuffled every pass). Everything after the env stream is
    the SPADE loop's own code, so the two runs differ only in where environments come
    from. One iteration is one environment played."""

    def __init__(self, ctx: LoopContext, pace: TrainerPace) -> None:
        self.ctx, self.pace = ctx, pace

    async def _variants(self, envs: list[StoredEnv]) -> list[StoredEnv]:
        """Each environment at every point `daemon.fixed_rungs` names (an environment without
        knobs, or one whose knobs cannot be read, once at its defaults)."""
        ctx, rungs = self.ctx, self.ctx.cfg.daemon.fixed_rungs
        out: list[StoredEnv] = []
        for env in envs:
            points: list[dict] = []
            if "easiest" in rungs and (specs := await ctx.knobs(env)):
                points.append(easiest_point(specs))
            if ("default" in rungs or not points) and env.params not in points:
                points.insert(0, dict(env.params))
            out.extend(env.at(params) for params in points)
        return out

    async def run(self, send_env, limit: int | None) -> None:
        ctx = self.ctx
        pool = await self._variants(await ctx.memory.fixed_pool())
        if not pool:
            log.error("fixed_pool_empty", hint="set daemon.bootstrap_seeds = true, or add "
                      "environments with `spade memory add`")
            ctx.stop("fixed pool empty")
            return
        log.info("fixed_pool", environments=len({e.env_id for e in pool}), variants=len(pool),
                 rungs=ctx.cfg.daemon.fixed_rungs)
        order = list(pool)
        started = 0
        async with send_env:
            while not ctx.stopping and (limit is None or started < limit):
                await self.pace.wait()
                if ctx.stopping:
                    break
                if started % len(order) == 0:
                    ctx.rng.shuffle(order)
                env = order[started % len(order)]
                started += 1
                ctx.counters["fixed_plays"] += 1
                await send_env.send(PlayJob(env.env_id, env.code, env.name, None,
                                            params=env.params or None, move="fixed"))
