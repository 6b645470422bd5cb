"""The last stage: a finished group's designer samples (rewards normalised within the group)
beside its agent samples, as one regret batch into the spool; stale samples are dropped first.
A document is committed as used only after its batch is written."""

from __future__ import annotations

from collections import Counter

import anyio

from spade_async.core.logs import get_logger
from spade_async.core.spool.batch import Sample
from spade_async.corpus.sampler import CorpusSampler
from spade_async.loop.context import LoopContext
from spade_async.loop.failures import GaveUp
from spade_async.loop.jobs import DocGroup
from spade_async.reward.regret import design_reward, group_advantages

log = get_logger("daemon")


class Batches:
    def __init__(self, ctx: LoopContext, corpus: CorpusSampler) -> None:
        self.ctx, self.corpus = ctx, corpus

    async def finish_group(self, group: DocGroup) -> None:
        """Every design of the group has its reward: the batch, then the document is used."""
        ctx = self.ctx
        rcfg, ledger = ctx.cfg.regret, ctx.ledger
        # Answered designs whose validation or memory write was given up have no reward.
        ledger.drop("designer", "failed", group.answered - len(group.designs))
        # A design whose environment could not be scored (its play was given up) has no
        # reward: it is left out of the group rather than paid for our failures.
        designs = []
        for d in group.designs:
            if group.env_of.get(d.design_id) in group.unscored:
                ledger.drop("designer", "unscored")
            elif d.design_id in group.untrainable:
                ledger.drop("designer", "untrainable")
            else:
                designs.append(d)
        if not ctx.routes["designer"].trained:
            # A frozen designer (another model): its designs are rewarded in the logs and the
            # memory, but never trained on; the agent's samples go as usual.
            ctx.counters["designer_samples_frozen"] += len(designs)
            ledger.drop("designer", "frozen", len(designs))
            designs = []
        rewards = [design_reward(group.status[d.design_id],
                                 group.regrets.get(group.env_of.get(d.design_id, "")), rcfg,
                                 group.checks_passed.get(d.design_id, 0)) for d in designs]
        samples = list(group.agent_samples)
        adv = group_advantages(rewards, rcfg.advantage_eps) if designs else None
        if adv is None and designs:
            ctx.counters["designer_groups_zero_variance"] += 1
            ledger.drop("designer", "zero_variance", len(designs))
        elif adv is not None:
            for d, a, r in zip(designs, adv, rewards, strict=True):
                samples.append(Sample(
                    sample_id=d.design_id, role="designer",
                    env_id=group.env_of.get(d.design_id, ""), policy_version=d.policy_version,
                    token_ids=d.token_ids, loss_mask=d.loss_mask, behaviour_logprobs=d.logprobs,
                    advantage=a, reward=r, move=d.move, allowed_tokens=d.allowed,
                ))
        if samples:
            await self.write(samples)
        if group.chunk is not None:
            await anyio.to_thread.run_sync(self.corpus.commit, group.chunk)
        ctx.iterations += 1
        log.info("iteration", n=ctx.iterations, chunk=group.label, move=group.move,
                 designs=len(group.designs), samples=len(samples))

    async def write(self, samples: list[Sample]) -> None:
        """One batch of the samples still fresh enough for the trainer (`max_staleness`)."""
        ctx = self.ctx
        ctx.policy.refresh()
        floor = ctx.policy.version - ctx.cfg.daemon.max_staleness
        fresh = [s for s in samples if s.policy_version >= floor]
        ctx.counters["samples_stale_dropped"] += len(samples) - len(fresh)
        for role, n in Counter(s.role for s in samples if s.policy_version < floor).items():
            ctx.ledger.drop(role, "stale", n)
        if not fresh:
            return
        try:  # a failed write leaves no batch behind (temp file, then rename): safe to redo
            seq = await ctx.failures.retrying(
                "spool", lambda: anyio.to_thread.run_sync(ctx.spool.write, fresh),
                attempts=ctx.cfg.daemon.item_attempts, samples=len(fresh))
        except GaveUp as exc:
            await ctx.failures.give_up("batch", str(exc), samples=len(fresh))
            for role, n in Counter(s.role for s in fresh).items():
                ctx.ledger.drop(role, "write_failed", n)
            return
        for role, n in Counter(s.role for s in fresh).items():
            ctx.ledger.write(role, n)
        ctx.counters["batches"] += 1
        ctx.counters["samples"] += len(fresh)
        m = ctx.metrics
        m.batches.inc()
        m.stale.inc(len(samples) - len(fresh))
        for s in fresh:
            m.samples.labels(s.role).inc()
        versions = [s.policy_version for s in fresh]
        m.staleness.set(max(versions) - min(versions))
        log.info("batch_written", seq=seq, samples=len(fresh),
                 agent=sum(s.role == "agent" for s in fresh),
                 designer=sum(s.role == "designer" for s in fresh))
