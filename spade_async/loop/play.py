"""The play stages: an environment off the env stream, once admitted → K_u unhinted and K_h hinted
episodes (each: model turn ⇄ sandbox step) → its regret → the memory's stats → agent samples
(into its document's group, or straight into a batch for a replay)."""

from __future__ import annotations

import time
import uuid
from collections import Counter

import anyio

from memory_db.schema import variant_id
from spade_async.core.logs import get_logger
from spade_async.core.spool.batch import Sample
from spade_async.envs.contract import ContractError
from spade_async.envs.knobs import resolve_params
from spade_async.inference.errors import EndpointError
from spade_async.loop.admission import Reservation, Stream
from spade_async.loop.batches import Batches
from spade_async.loop.context import OUTAGE, LoopContext
from spade_async.loop.failures import HOST_SANDBOX_FAILURES, GaveUp, failure_kind
from spade_async.loop.jobs import PlayJob
from spade_async.loop.sources import TrainerPace
from spade_async.reward.regret import env_regret, group_advantages, unreached_wins
from spade_async.rollout.episode import Episode, play_in_sandbox
from spade_async.sandbox.errors import SandboxError

log = get_logger("daemon")

# Episode failures worth another try: the endpoint's, a sandbox worker that never started, or
# a lost sandbox node (the try goes to another node). The environment's own failures
# (sandbox_exception, sandbox_timeout, ...) would repeat.
RETRY_EPISODE = frozenset({"timeout", "deadline", "http_5xx", "http_429", "malformed",
                           "unavailable", "token_mismatch", "endpoint", "sandbox_start",
                           "sandbox_node_lost"})


class Player:
    def __init__(self, ctx: LoopContext, batches: Batches, pace: TrainerPace | None = None,
                 ) -> None:
        self.ctx, self.batches, self.pace = ctx, batches, pace

    async def run(self, recv_env) -> None:
        """Takes accepted environments off the stream in order and starts each play once
        there is room for its K_u + K_h episodes (spade_async.loop.admission): how many plays
        run at once follows the agent endpoints' capacity and the sandbox slots."""
        ctx, adm = self.ctx, self.ctx.admission
        width = ctx.cfg.rollout.k_unhinted + ctx.cfg.rollout.k_hinted
        async with recv_env, anyio.create_task_group() as tg:
            async for job in recv_env:
                direct = job.group is None and self.pace is not None
                if direct:  # its batch counts against the trainer's pace from its start: a
                    # queue of replays or fixed plays must not run ahead of the trainer
                    await self.pace.wait()
                    self.pace.direct_plays += 1
                adm.holding_play = True
                await adm.wait(lambda: adm.can_play(width))
                adm.holding_play = False
                adm.plays += 1
                tg.start_soon(self._admitted, job,
                              adm.reserve(ctx.routes["agent"].group, width, episodes=True))

    async def _admitted(self, job: PlayJob, streams: Reservation) -> None:
        try:
            await self.play(job, streams)
        finally:
            if job.group is None and self.pace is not None:
                self.pace.direct_plays -= 1
            streams.close()
            self.ctx.admission.plays -= 1
            self.ctx.admission.notify()
            if job.group is not None:
                job.group.pending -= 1
                if job.group.pending <= 0:
                    job.group.done.set()

    async def play(self, job: PlayJob, streams: Reservation | None = None) -> None:
        """K_u unhinted and K_h hinted episodes of one environment, its regret, its memory
        stats and its agent samples. Only episodes that ran to their end are scores: one that
        failed (endpoint, sandbox, deadline) after its tries never enters R_u, R_h or the
        memory, and when a side has no score left the play is given up (recorded). A
        variant is played at its params with every knob's value filled in, so its statistics
        land under one variant id whoever asked for it."""
        ctx = self.ctx
        rcfg = ctx.cfg.rollout
        try:
            meta = await ctx.meta(job.env_id, job.code)
            job.params = resolve_params(meta.params, job.params) or None
        except (GaveUp, ContractError) as exc:
            await ctx.failures.give_up("play", f"cannot play at {job.params}: {exc}",
                                       env_id=job.env_id)
            if job.group is not None:
                job.group.unscored.add(job.group_key())
            return
        ctx.policy.refresh()
        version = ctx.policy.version
        results: dict[bool, list[Episode]] = {False: [], True: []}

        async def one(hinted: bool, seed: int) -> None:
            stream = streams.take() if streams is not None else None
            try:
                ep = await self.episode(job, hinted, seed, stream)
            finally:
                if stream is not None:
                    stream.end()
            results[hinted].append(ep)
            await self._record_episode(ep)

        seeds = [ctx.rng.randrange(2**31) for _ in range(rcfg.k_unhinted)]
        async with anyio.create_task_group() as tg:
            for s in seeds:
                tg.start_soon(one, False, s)
            for s in seeds[: rcfg.k_hinted] + [ctx.rng.randrange(2**31)
                                               for _ in range(rcfg.k_hinted - len(seeds))]:
                tg.start_soon(one, True, s)
        samples = self._agent_samples(results)
        scored = {h: [e.score for e in eps if e.error is None] for h, eps in results.items()}
        hinted_eps = [e for e in results[True] if e.error is None]
        copies = [e.hint_copy or 0.0 for e in hinted_eps]
        reason = f"copied: {sum(c > 0 for c in copies)} hinted wins copied the hint, " \
            "verbatim or decoded" if any(copies) else ""
        if scored[False] and hinted_eps:
            beyond, why = unreached_wins(scored[False], [(e.score, [t.action for t in e.turns])
                                                         for e in hinted_eps], ctx.cfg.regret)
            if why:
                copies = [max(c, b) for c, b in zip(copies, beyond, strict=True)]
                reason = "; ".join(r for r in (reason, why) if r)
        # episodes the environment's own code failed (not the host's: sandbox_start,
        # sandbox_node_lost) are counted against it in the memory, never scored
        env_failed = sum(1 for eps in results.values() for e in eps
                         if e.error and (e.error_kind or "").startswith("sandbox_")
                         and e.error_kind not in HOST_SANDBOX_FAILURES)
        if scored[False] and scored[True]:
            await self._score(job, scored[False], scored[True], version, copies, env_failed,
                              reason)
        else:
            await self._unscored(job, results, scored, env_failed)
        if job.group is not None:
            job.group.agent_samples += samples
        elif samples:
            await self.batches.write(samples)
        if ctx.cfg.daemon.mode == "fixed":
            ctx.iterations += 1

    async def _unscored(self, job: PlayJob, results: dict[bool, list[Episode]],
                        scored: dict[bool, list[float]], env_failed: int) -> None:
        """A side has no score: the play is given up (its code's failures still counted)."""
        ctx = self.ctx
        if env_failed:
            try:
                await ctx.memory_op(lambda: ctx.memory.record_failures(
                    job.env_id, env_failed, params=job.params or None), env_id=job.env_id)
            except GaveUp as exc:
                await ctx.failures.give_up("play_stats", str(exc), env_id=job.env_id)
        failed = Counter(e.error_kind for eps in results.values() for e in eps if e.error)
        await ctx.failures.give_up(
            "play", f"no score on one side: {len(scored[False])}/{len(results[False])} "
            f"unhinted and {len(scored[True])}/{len(results[True])} hinted episodes "
            "finished (failed: " + ", ".join(f"{k} {v}" for k, v in sorted(failed.items()))
            + ")", env_id=job.env_id, replayed=job.group is None)
        if job.group is not None:
            job.group.unscored.add(job.group_key())

    async def _score(self, job: PlayJob, unhinted: list[float], hinted: list[float],
                     version: int, hint_copies: list[float] | None = None,
                     sandbox_failures: int = 0, leak_reason: str = "") -> None:
        """The play's regret and both signals; hinted wins copied from the hint discount the
        designer's reward and, past regret.leak_threshold, flag the environment (counted,
        logged, and kept per variant in the memory as hint_leak)."""
        ctx = self.ctx
        regret = env_regret(unhinted, hinted, ctx.cfg.regret, hint_copies, leak_reason)
        if regret.leak_flagged:
            ctx.counters["plays_leak_flagged"] += 1
            log.warning("hint_leak_in_play", env_id=job.env_id,
                        hint_leak=round(regret.hint_leak, 3), move=job.move,
                        reason=regret.leak_reason)
        ctx.regrets.append(regret.regret)
        ctx.metrics.regret.observe(regret.regret)
        if job.group is not None:
            job.group.regrets[job.group_key()] = regret
            ctx.counters[f"moves_{job.group.move}_played"] += 1
        params = job.params or {}
        vid = variant_id(job.env_id, params)
        # A drain cut lands before this pair or after it, never between: the memory's episode
        # counts and plays.jsonl agree (the memory's own deadlines bound the wait).
        with anyio.CancelScope(shield=True):
            try:
                await ctx.memory_op(lambda: ctx.memory.record_play(
                    job.env_id, unhinted, hinted, params=params or None,
                    hint_copies=hint_copies or None, sandbox_failures=sandbox_failures),
                    env_id=job.env_id)
            except GaveUp as exc:  # the regret still counts; the memory's stats miss this play
                await ctx.failures.give_up("play_stats", str(exc), env_id=job.env_id)
            meta = ctx.known_meta(job.env_id)
            log.info("env_played", env_id=job.env_id, variant_id=vid, params=params or None,
                     move=job.move, replayed=job.group is None,
                     **{k: round(v, 4) if isinstance(v, float) else v
                        for k, v in regret.as_dict().items()})
            await ctx.append("plays", {"time": time.time(), "env_id": job.env_id,
                                       "variant_id": vid, "params": params,
                                       "name": meta.name if meta else job.name,
                                       "move": job.move, "replayed": job.group is None,
                                       "policy_version": version,
                                       "unhinted": unhinted, "hinted": hinted,
                                       **regret.as_dict()})

    async def episode(self, job: PlayJob, hinted: bool, seed: int,
                      stream: Stream | None = None) -> Episode:
        """One episode, tried again when the endpoint failed it or no sandbox worker started
        (`rollout.episode_attempts`; an outage is waited out without using them). The last
        try is returned, failed or not. Every try samples with the newest published policy:
        a server restarted meanwhile holds only that one, so an older adapter would never
        come back."""
        ctx = self.ctx
        tries, delay, spent = 0, 1.0, 0.0
        while True:
            ctx.policy.refresh()
            ep = await self.episode_once(job, hinted, seed, ctx.policy.model,
                                         ctx.policy.version, stream)
            spent += ep.seconds
            ep.seconds = round(spent, 3)  # every try's time is the play's cost
            if ep.error is None:
                return ep
            kind = ep.error_kind or "unknown"
            where = {"sandbox_node": ep.sandbox_node} if ep.sandbox_node else {}
            ctx.failures.count("episode", kind, None, env_id=job.env_id,
                               episode_id=ep.episode_id, hinted=hinted, error=ep.error[:600],
                               **where)
            tries += 0 if kind in OUTAGE else 1
            retry = kind in OUTAGE or kind in RETRY_EPISODE
            if not retry or tries >= ctx.cfg.rollout.episode_attempts or ctx.stopping:
                return ep
            await ctx.pause(delay)
            delay = min(30.0, delay * 2)

    async def episode_once(self, job: PlayJob, hinted: bool, seed: int, model: str,
                           version: int, stream: Stream | None = None) -> Episode:
        """One try of an episode; a failure comes back as the episode's error."""
        ctx = self.ctx
        ctx.in_flight["episodes"] += 1
        t0 = time.monotonic()
        try:
            ep = await play_in_sandbox(ctx.sandbox, job.code, ctx.pool_for(stream, "agent"),
                                       ctx.chat, env_id=job.env_id, seed=seed, hinted=hinted,
                                       model=model, policy_version=version,
                                       cfg=ctx.cfg.rollout, params=job.params,
                                       group=ctx.routes["agent"].group)
        except (SandboxError, EndpointError) as exc:
            ep = Episode(f"ep-{uuid.uuid4().hex[:12]}", job.env_id, seed, hinted, version,
                         model, error=f"{type(exc).__name__}: {exc}",
                         error_kind=failure_kind(exc), sandbox_node=getattr(exc, "node", None))
        finally:
            ctx.in_flight["episodes"] -= 1
        ep.seconds = round(time.monotonic() - t0, 3)
        return ep

    async def _record_episode(self, ep: Episode) -> None:
        ctx = self.ctx
        ctx.counters["episodes"] += 1
        ctx.counters["episodes_hinted" if ep.hinted else "episodes_unhinted"] += 1
        if ep.error:
            ctx.counters["episode_errors"] += 1
        ctx.counters["tokens_sampled"] += ep.sampled_tokens
        ctx.ledger.play("agent")
        ctx.metrics.episodes.labels(str(ep.hinted).lower(), "error" if ep.error else "ok").inc()
        ctx.metrics.tokens.labels("agent").inc(ep.sampled_tokens)
        await ctx.append("episodes", {"time": time.time(), **ep.as_record()})
        if ep.error is None and ep.sampled_tokens:
            ctx.sampled_with(ep.policy_version, episode=True)

    def _agent_samples(self, results: dict[bool, list[Episode]]) -> list[Sample]:
        """Group-normalised advantages of the finished episodes, per side (hinted ones only
        with regret.train_on_hinted); a side with no variance gives none. Every episode not
        made a sample is dropped in the ledger with its reason."""
        ctx = self.ctx
        eps, on_hinted = ctx.cfg.regret.advantage_eps, ctx.cfg.regret.train_on_hinted
        out: list[Sample] = []
        for hinted, episodes in sorted(results.items()):
            usable = []
            for e in episodes:
                if e.error is not None:
                    ctx.ledger.drop("agent", "failed")
                elif not e.sampled_tokens:
                    ctx.ledger.drop("agent", "no_tokens")
                elif hinted and not on_hinted:
                    ctx.ledger.drop("agent", "hinted")
                else:
                    usable.append(e)
            if hinted and not on_hinted:
                continue
            adv = group_advantages([e.score for e in usable], eps)
            if adv is None:
                ctx.counters["agent_groups_zero_variance"] += 1
                ctx.ledger.drop("agent", "zero_variance", len(usable))
                continue
            for e, a in zip(usable, adv, strict=True):
                out.append(Sample(
                    sample_id=e.episode_id, role="agent", env_id=e.env_id,
                    policy_version=e.policy_version, token_ids=e.token_ids,
                    loss_mask=e.loss_mask, behaviour_logprobs=e.logprobs, advantage=a,
                    reward=e.score, episode_id=e.episode_id, hinted=e.hinted,
                ))
        return out
