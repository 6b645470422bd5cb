"""The edit move's stages (DESIGN §12): a stored environment with knobs → G proposals of new
knob values (choice-constrained) → each variant validated at its params → the distinct accepted
variants into the env stream; the group waits for their plays, then goes to the batch stage."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from memory_db.schema import variant_id
from spade_async.core.logs import get_logger
from spade_async.design.edit import (
    VariantView,
    frontier_options,
    propose_edit,
    wanted_direction,
)
from spade_async.envs.contract import ContractError, EnvMeta
from spade_async.envs.knob_steps import edit_steps
from spade_async.envs.knobs import easiest_point, resolve_params
from spade_async.envs.validation_report import ValidationReport
from spade_async.inference.constrained import TokenBytes
from spade_async.inference.roles import group_has
from spade_async.loop.admission import Reservation
from spade_async.loop.batches import Batches
from spade_async.loop.context import LoopContext
from spade_async.loop.design import design_rounds, designer_request, group_ended
from spade_async.loop.failures import GaveUp
from spade_async.loop.jobs import DocGroup, PlayJob
from spade_async.loop.ports import StoredEnv
from spade_async.reward.regret import DesignStatus

log = get_logger("daemon")

# A family whose easiest point has this many unhinted episodes at a mean score this low is out
# of the policy's reach for now (run60e: linear_system's easiest point took 19 edits, every
# one solved 0 of 8); its edits go to another family but for this share of the draws.
OUT_OF_REACH_EPISODES = 16
OUT_OF_REACH_SOLVE = 1 / 16
OUT_OF_REACH_RETRY = 0.2


# Families weighed for the next edit at most (each costs a memory read); an unplayed family
# weighs as much as the most learnable one can (p(1-p) at p = 1/2), a hopeless one this little.
PARENT_FAMILIES = 32
UNPLAYED_PROMISE = 0.25
PROMISE_FLOOR = 0.02


def family_promise(played: list[Any]) -> float:
    """How much an edit of this family can teach: the highest learnability p(1-p) among its
    played variants (the unhinted solve rate near 1/2 is the frontier), UNPLAYED_PROMISE when
    none was played, never below PROMISE_FLOOR, so that no family is dropped for good."""
    scores = [v.stats.learnability for v in played if v.stats.learnability is not None]
    return max(PROMISE_FLOOR, max(scores) if scores else UNPLAYED_PROMISE)


def frontier_order(families: list[StoredEnv], played_of: dict[str, list[Any]],
                   rng: Any) -> list[StoredEnv]:
    """The families in a random order weighted by `family_promise` (a weighted shuffle: key
    u^(1/w), highest first), as ACCEL and PLR prefer the levels of highest learnability. With
    uniform draws, run60e's edits went 37 to number_guess (solve rate 0.16), 22 to
    linear_system (0.02) and 13 to arithmetic (0.63): the median play sat at 0.125."""
    keyed = [(rng.random() ** (1.0 / family_promise(played_of[env.env_id])), i, env)
             for i, env in enumerate(families)]
    return [env for _, _, env in sorted(keyed, key=lambda k: (-k[0], k[1]))]


@dataclass(frozen=True)
class EditOffer:
    """What one edit group is offered: the parent's setting, the settings to choose from, how
    they were drawn ("easier", "harder", "either" or "fallback") and the parent's unhinted
    solve rate they were drawn by (None: not played)."""

    current: dict[str, Any]
    candidates: list[dict[str, Any]]
    direction: str
    parent_solve: float | None


class Edits:
    def __init__(self, ctx: LoopContext, batches: Batches) -> None:
        self.ctx, self.batches = ctx, batches
        self._knob_families: tuple[float, list[StoredEnv]] = (-1e9, [])
        self._vocab: TokenBytes | None = None

    def next_move(self) -> str:
        """write or edit, by `daemon.moves`' weights."""
        moves = {k: w for k, w in self.ctx.cfg.daemon.moves.items() if w > 0}
        if len(moves) == 1:
            return next(iter(moves))
        x = self.ctx.rng.random() * sum(moves.values())
        for move, w in sorted(moves.items()):
            x -= w
            if x < 0:
                return move
        return "write"

    async def parent(self) -> StoredEnv | None:
        """What the next edit starts from. An environment with knobs, drawn by its family's
        promise (`frontier_order`; drawing variants by the replay sampler's priorities let
        the family with the most variants take every edit: 12 of 16 plays in a 13-minute
        embedded run, so each family is one draw whatever its count), then, as ACCEL edits
        the most promising levels of its buffer, its played variant with the highest
        learnability (the most recently played among equals); an environment never played
        starts at its easiest point (ACCEL starts from simple levels). A family out of the
        policy's reach (`_out_of_reach`) is passed over for the next in a shuffled order, but
        for OUT_OF_REACH_RETRY of the draws. None (the move falls back to write) when no
        stored environment has knobs."""
        ctx = self.ctx
        try:
            stamp, families = self._knob_families
            if time.monotonic() - stamp > 60 or not families:
                families = []
                for env in await ctx.memory_op(ctx.memory.fixed_pool, what="edit_parent"):
                    if await ctx.knobs(env):
                        families.append(env)
                self._knob_families = (time.monotonic(), families)
            if not families:
                ctx.counters["edit_without_parent"] += 1
                return None
            pool = ctx.rng.sample(families, min(len(families), PARENT_FAMILIES))
            played_of = {}
            for env in pool:
                played_of[env.env_id] = await ctx.memory_op(
                    lambda e=env: ctx.memory.variants(e.env_id), what="edit_parent")
            order = frontier_order(pool, played_of, ctx.rng)
            for env in order:
                played = played_of[env.env_id]
                if env is order[-1] or not self._out_of_reach(env, played) \
                        or ctx.rng.random() < OUT_OF_REACH_RETRY:
                    break
                ctx.counters["edit_parent_out_of_reach"] += 1
        except GaveUp as exc:
            await ctx.failures.give_up("edit_parent", str(exc))
            return None
        specs = ctx.known_meta(env.env_id).params
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
        return env.at(params)

    def _out_of_reach(self, env: StoredEnv, played: list[Any]) -> bool:
        """The family's easiest point has been played twice over and (almost) never solved:
        every edit offered from there is that point again or harder, so an edit of it is a
        play at 0. Another family is edited instead, but for `OUT_OF_REACH_RETRY` of the
        draws, which look again as the policy improves."""
        specs = self.ctx.known_meta(env.env_id).params
        if not specs:
            return False
        try:
            floor = easiest_point(specs)
            at_floor = [v for v in played if resolve_params(specs, v.params) == floor]
        except ContractError:
            return False
        return any((v.stats.episodes_unhinted or 0) >= OUT_OF_REACH_EPISODES
                   and (v.stats.mean_unhinted or 0.0) <= OUT_OF_REACH_SOLVE for v in at_floor)

    def _vocabulary(self) -> TokenBytes:
        if self._vocab is None:
            self._vocab = TokenBytes(self.ctx.chat.tok, self.ctx.chat.eos_ids)
        return self._vocab

    async def run(self, parent: StoredEnv, send_env, streams: Reservation) -> None:
        """G edits of one stored variant, validated at their params, the accepted ones played
        (each distinct variant once), then one batch with their rewards normalised together."""
        ctx = self.ctx
        group = DocGroup(None, move="edit", label=f"edit:{parent.variant_id}", streams=streams)
        try:
            async with send_env:
                try:
                    meta = await ctx.meta(parent.env_id, parent.code)
                    current = resolve_params(meta.params, parent.params)
                    variants = await ctx.memory_op(lambda: ctx.memory.variants(parent.env_id),
                                                   what="variants")
                except (GaveUp, ContractError) as exc:
                    await ctx.failures.give_up("edit", str(exc), env_id=parent.env_id)
                    return
                played = [VariantView(v.params, v.episodes, v.stats.mean_unhinted,
                                      v.stats.mean_hinted) for v in variants[:8]]
                offer = self._offer(meta, current, parent.variant_id, variants)
                if len(offer.candidates) < 2:
                    ctx.counters["edit_without_options"] += 1
                    return
                await design_rounds(
                    ctx, group, lambda: self._one(group, parent, meta, played, offer),
                    ctx.cfg.daemon.edits_per_variant)
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
            await self.batches.finish_group(group)
        finally:
            group_ended(ctx, streams)

    def _offer(self, meta: EnvMeta, current: dict[str, Any], parent_id: str,
               variants: list[Any]) -> EditOffer:
        """The settings offered for an edit of the parent variant `parent_id`: its neighbours
        toward the frontier, by its unhinted solve rate against `daemon.edit_band`
        (design/edit.py `frontier_options`).
        A parent counts as played once it has half of one play's unhinted episodes (the
        others may have failed and do not score). The rate is the mean unhinted score, the
        memory's statistic: for the binary rewards of the seeds it is the solve rate; with
        partial credit a mean of 0 or 1 still means a solve rate of 0 or 1, but a parent
        never solved whose mean is above 0 is offered both directions."""
        ctx = self.ctx
        own = next((v for v in variants if v.id == parent_id), None)
        rate = own.stats.mean_unhinted if own is not None else None
        episodes = own.stats.episodes_unhinted if own is not None else 0
        direction = wanted_direction(rate, episodes, (ctx.cfg.rollout.k_unhinted + 1) // 2,
                                     ctx.cfg.daemon.edit_band)
        candidates, drawn = frontier_options(meta.params, current, ctx.rng,
                                             ctx.cfg.daemon.edit_options, direction)
        if drawn == "fallback":
            ctx.counters["edit_direction_fallback"] += 1
        return EditOffer(current, candidates, drawn, rate)

    async def _one(self, group: DocGroup, parent: StoredEnv, meta: EnvMeta,
                   played: list[VariantView], offer: EditOffer) -> None:
        """One edit request and the validation of the variant it proposes."""
        ctx = self.ctx
        current, candidates = offer.current, offer.candidates
        route = ctx.routes["designer"]
        got = await designer_request(ctx, group, "edit", lambda pool: propose_edit(
            pool, ctx.chat, self._vocabulary(), env_id=parent.env_id,
            name=meta.name, description=meta.description, specs=meta.params,
            current=current, played=played, candidates=candidates,
            signal=ctx.cfg.regret.signal, model=route.model or ctx.policy.model,
            policy_version=ctx.policy.version,
            temperature=ctx.cfg.daemon.designer_temperature,
            deadline_s=ctx.cfg.rollout.request_deadline_s, path=route.path,
            group=route.group,
            structured=route.path == "chat" and group_has(ctx.pool, route.group, "structured")),
            env_id=parent.env_id)
        if got is None:
            return
        d, design_s = got
        t0 = time.monotonic()
        d.code = parent.code
        report: ValidationReport | None = None
        vid = None
        if d.params is None:
            status, reason = DesignStatus.INVALID, f"edit.answer: {d.error}"
            if d.allowed is None and d.trainable:  # the server's constraint is not ours
                group.untrainable.add(d.design_id)
                ctx.counters["edit_constraint_mismatch"] += 1
        else:
            vid = variant_id(parent.env_id, d.params)
            try:
                report = await ctx.validate(parent.code, params=d.params,
                                            env_id=parent.env_id, design_id=d.design_id)
            except GaveUp as exc:
                await ctx.failures.give_up("edit", str(exc), env_id=parent.env_id,
                                           design_id=d.design_id, failed_in=exc.stage)
                return
            status = DesignStatus.ACCEPTED if report.accepted else DesignStatus.INVALID
            reason = report.reason
            group.checks_passed[d.design_id] = report.progress
        validation_s = time.monotonic() - t0
        group.designs.append(d)
        group.status[d.design_id] = status
        if status is DesignStatus.ACCEPTED:
            group.env_of[d.design_id] = vid or ""
            ctx.counters["moves_edit_accepted"] += 1
        else:
            ctx.rejected(reason)
        ctx.counters[f"designs_{status.value}"] += 1
        ctx.metrics.designs.labels(status.value).inc()
        ctx.metrics.tokens.labels("designer").inc(d.completion_tokens)
        log.info("edit", env_id=parent.env_id, parent=parent.variant_id, params=d.params,
                 status=status.value, reason=reason or None)
        await ctx.append("designs", {
            "time": time.time(), "design_id": d.design_id, "doc_id": d.doc_id,
            "chunk_id": group.label, "policy_version": d.policy_version,
            "status": status.value, "reason": reason.split(":")[0] if reason else "",
            "env_id": parent.env_id, "completion_tokens": d.completion_tokens,
            "progress": report.progress if report is not None else 0.0, "move": "edit",
            "parent": parent.variant_id, "params": d.params, "variant_id": vid,
            "parent_params": current, "direction": offer.direction,
            "parent_solve": offer.parent_solve,
            # the steps each knob moved (envs/knob_steps.py): what the report checks
            "knob_steps": None if d.params is None else edit_steps(meta.params, current,
                                                                   d.params),
            "family": meta.name, "path": d.path, "model": d.model, "prompt_tokens": d.prompt_len,
            "design_s": round(design_s, 3), "validation_s": round(validation_s, 3)})
