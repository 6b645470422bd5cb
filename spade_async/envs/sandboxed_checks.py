"""The sandboxed checks of the validation pipeline at one knob setting: determinism, the hint,
the probe policies (types, ranges, exploitability), the hint leak and the solution replay, each
played through an open EnvSession.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spade_async.core.config import ValidationConfig
from spade_async.envs.contract import EnvMeta, episode_score
from spade_async.envs.hint_leak import leak_policies
from spade_async.envs.probe_policies import echo_policies, probe_policies, short_action
from spade_async.envs.validation_report import Check
from spade_async.sandbox.session import EnvSession


@dataclass(frozen=True)
class LeakResult:
    """How often policies read off the hint solve the episode: `own` (each seed's own hint),
    `control` (the hint of another episode at the same point, on the same seed: what the
    answer space alone gives away); `rate` is own - control."""

    own: float
    control: float
    example: str = ""  # the first policy that solved with the episode's own hint

    @property
    def rate(self) -> float:
        return max(0.0, self.own - self.control)

    def reason(self, threshold: float) -> str:
        return (f"the hint gives the answer away: {self.example} solves "
                f"{self.own:.0%} of the episodes (against {self.control:.0%} with another "
                f"episode's hint), {self.rate:.2f} >= {threshold}")


CONTROL_SEED_OFFSET = 7919  # the control episode's seed: another episode at the same point


async def _hint_leak(env: EnvSession, meta: EnvMeta, point: dict[str, Any],
                     seeds: list[int], decoded: bool = True) -> LeakResult:
    """DESIGN §3b: play the policies `leak_policies` reads off the hint (hint_leak.py)."""

    async def solved_by(seed: int, hint_seed: int) -> str | None:
        first = await env.reset(hint_seed, point)
        hint = await env.hint()
        sol = await env.solution() if meta.has_solution else None
        # the hint's own task's observation: arithmetic on its numbers is a method, not a leak
        for policy in leak_policies(hint, sol, observation=first.observation,
                                    decoded=decoded):
            score, _, _ = await _play(env, seed, point, policy.plan(meta.max_turns),
                                      meta.max_turns)
            if score >= 1.0 - 1e-9:
                return f"{policy.what} ({short_action(' | '.join(policy.actions))})"
        return None

    own = control = 0
    example = ""
    for seed in seeds:
        hit = await solved_by(seed, seed)
        if hit is not None:
            own += 1
            example = example or hit
            control += await solved_by(seed, seed + CONTROL_SEED_OFFSET) is not None
    return LeakResult(own / len(seeds), control / len(seeds), example)


Policy = list[str] | str | Callable[[str], str]


async def _play(env: EnvSession, seed: int, params: dict[str, Any], policy: Policy,
                max_turns: int) -> tuple[float, bool, int]:
    """Reset, then play `policy` until done: a list of actions in order, one action repeated,
    or a function of the observation the agent sees (the reset's, then the last step's), as
    the observation echoes are; (score, ended, turns)."""
    obs = (await env.reset(seed, params)).observation
    rewards: list[float] = []
    ended = False
    turns = 0
    if isinstance(policy, str):
        policy = [policy] * max_turns
    limit = max_turns if callable(policy) else len(policy)
    while turns < limit:
        res = await env.step(policy(obs) if callable(policy) else policy[turns])
        json.dumps(res.info)  # already checked, but a probe must see JSON-safe info
        rewards.append(res.reward)
        turns += 1
        obs = res.observation
        if res.done:
            ended = True
            break
    return episode_score(rewards), ended, turns


async def check_point(env: EnvSession, meta: EnvMeta, point: dict[str, Any], seeds: list[int],
                       vcfg: ValidationConfig, results: dict[str, Check],
                       probe_scores: dict[str, float], echo: bool = True) -> None:
    """The sandboxed checks at one knob setting, recorded into `results` as they finish; a
    SandboxError propagates with the earlier checks recorded (the caller fails the next one).
    `echo`: play the observation echoes too (at the defaults only: see below)."""

    def record(name: str, passed: bool, reason: str = "") -> None:
        results[name] = Check(name, passed, reason)

    # determinism. Hidden state counts too: the hint and the solution reveal it.
    async def episode_start(seed: int) -> tuple:
        first = await env.reset(seed, point)
        sol = await env.solution() if meta.has_solution else None
        return first.observation, first.info, await env.hint(), sol

    diffs = []
    for seed in seeds:
        a, b = await episode_start(seed), await episode_start(seed)
        if a != b:
            what = [w for w, x, y in zip(("observation", "info", "hint", "solution"),
                                         a, b, strict=True) if x != y]
            diffs.append(f"reset({seed}) twice gave a different {' and '.join(what)}")
            break
    record("determinism", not diffs, "" if not diffs else
           diffs[0] + " (seed the environment's random.Random(seed), not the global "
           "random module or the clock)")
    # hint
    empty = []
    for seed in seeds:
        await env.reset(seed, point)
        if not (await env.hint()).strip():
            empty.append(seed)
    record("hint", not empty, "" if not empty else f"hint() is empty after reset({empty[0]})")
    # probes: types/ranges, exploitability. An episode a probe does not end is truncated at
    # max_turns, as the runner does in play (the environment need not count turns).
    solution = None
    if meta.has_solution:
        await env.reset(seeds[0], point)
        solution = await env.solution()
    exploit: list[tuple[str, str, str]] = []  # (the probe, what it sends, what it scores)
    for label, probe in probe_policies(meta, solution):
        worst = 0.0
        for seed in seeds:
            score, _, _ = await _play(env, seed, point, probe, meta.max_turns)
            worst = max(worst, score)
        probe_scores[probe] = max(worst, probe_scores.get(probe, 0.0))
        if worst >= vcfg.exploit_threshold:
            exploit.append((label, f"action {short_action(probe)}, every turn", f"{worst:.2f}"))
    # Observation echoes (keyed by label: their action varies) score the least over the seeds:
    # a verifier that pays the echo pays it every time, while an honest task that shows its
    # choices pays an echo of choice #k on the seeds whose answer is #k. With 7 positions echoed
    # in a list of 10 choices, 3 seeds reject an honest task 97% of the time on the worst seed,
    # 20% on the mean (2 seeds hit at one position), 0.7% on the least; of 50 choices, 36%, 0.8%,
    # 0.006%. For the same reason they run only at the defaults (`echo`), never at a knob's
    # easy end or an edit's variant: there an echo of each word of a 2-word list simply solves
    # the task (an easy task, not a verifier that pays the echo, which is the code's and shows
    # at the defaults). An echo is not played on after a seed it fails (its recorded score, the
    # least over the seeds played, is then already below the threshold).
    if echo and vcfg.echo_probes:
        firsts = [(await env.reset(seed, point)).observation for seed in seeds]
        for echo in echo_policies(firsts, solution):
            least = 1.0
            for seed in seeds:
                score, _, _ = await _play(env, seed, point, echo.action, meta.max_turns)
                least = min(least, score)
                if least < vcfg.exploit_threshold:
                    break
            probe_scores[echo.label] = max(least, probe_scores.get(echo.label, 0.0))
            if least >= vcfg.exploit_threshold:
                exploit.append((echo.label, "action read off each turn's observation, "
                                f"{short_action(echo.action(firsts[0]))} on seed {seeds[0]}'s "
                                "first turn", f"{least:.2f} on every seed"))
    record("types", True)
    record("not_exploitable", not exploit, "" if not exploit else
           f"the probe {exploit[0][0]} ({exploit[0][1]}) scores {exploit[0][2]} >= "
           f"{vcfg.exploit_threshold} (the reward pays without solving)")
    # the hint does not give the answer away
    leak = await _hint_leak(env, meta, point, seeds, vcfg.decoded_hints)
    record("hint_leak", leak.rate < vcfg.exploit_threshold, "" if leak.rate <
           vcfg.exploit_threshold else leak.reason(vcfg.exploit_threshold))
    # solution replay
    if not meta.has_solution:
        record("solution", True, "no solution() to replay")
        return
    short = []
    for seed in seeds:
        await env.reset(seed, point)
        actions = await env.solution()
        score, _, _ = await _play(env, seed, point, actions, meta.max_turns)
        if score < vcfg.solution_score - 1e-9:
            short.append((seed, score, len(actions)))
    record("solution", not short, "" if not short else
           f"replaying solution() for seed {short[0][0]} ({short[0][2]} actions) "
           f"scores {short[0][1]:.2f}, not {vcfg.solution_score:g}: the verifier "
           "or the solution is broken")
