"""Evaluation suites (`spade eval`): held-out tasks from packages nobody here wrote, scored by
their own checkers (see base.py), and the `probe`, a fixed set of training variants (probe.py),
sampled (`probe`) and greedy (`probe-greedy`); two versions' results compare task by task
(paired.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, get_args

from spade_async.core.config.eval import GROUPS, SuiteName

if TYPE_CHECKING:
    from spade_async.core.config import SpadeConfig
    from spade_async.evals.base import Suite
    from spade_async.sandbox.runtime import Sandbox

SUITES: tuple[str, ...] = get_args(SuiteName)  # the names eval.suites accepts
__all__ = ["CATEGORIES", "GROUPS", "SUITES", "expand_suites", "make_suite"]

# The paper's categories of held-out evaluation, and the suite of ours in each (the probe is a
# training measure, not held out). `--suite paper` is every held-out suite of the table
# (GROUPS, in the config's module: experiment.suites is checked against it at load).
# games: TextArena's single-player text games (evals/games.py), none of them a training family.
CATEGORIES: dict[str, str] = {
    "reasoning-gym": "reasoning", "reasoning-gym-easy": "reasoning", "humaneval": "code",
    "textarena": "games", "bfcl-multi-turn": "tool use", "probe": "training probe",
    "probe-greedy": "training probe"}


def expand_suites(names: list[str]) -> list[str]:
    """Suite names with the groups (GROUPS) replaced by their suites, each once, in order;
    ValueError naming an unknown one."""
    out: list[str] = []
    for n in names:
        for s in GROUPS.get(n, (n,)):
            if s not in SUITES:
                raise ValueError(f"unknown suite {s!r}: one of {', '.join(SUITES)}, or a "
                                 f"group: {', '.join(GROUPS)}")
            if s not in out:
                out.append(s)
    return out


def make_suite(name: str, cfg: SpadeConfig, sandbox: Sandbox | None = None) -> Suite:
    """A suite by name, sized by the config's [eval] section. `sandbox`: where the probe
    plays and HumanEval's tests run (None: each opens its own for the run)."""
    ecfg = cfg.eval
    if name in ("reasoning-gym", "reasoning-gym-easy"):
        from spade_async.evals.reasoning_gym_suite import ReasoningGymSuite

        return ReasoningGymSuite(per_generator=ecfg.reasoning_gym_per_generator,
                                 max_tokens=ecfg.max_tokens, name=name)
    if name == "bfcl-multi-turn":
        from spade_async.evals.bfcl import BfclMultiTurnSuite

        return BfclMultiTurnSuite(n_tasks=ecfg.bfcl_tasks)
    if name == "humaneval":
        from spade_async.evals.humaneval import HumanEvalSuite

        return HumanEvalSuite(n_tasks=ecfg.humaneval_tasks, samples=ecfg.humaneval_samples,
                              temperature=ecfg.humaneval_temperature,
                              max_tokens=ecfg.max_tokens, sandbox=sandbox,
                              sandbox_cfg=cfg.sandbox)
    if name == "textarena":
        from spade_async.evals.games import TextArenaSuite

        return TextArenaSuite(per_game=ecfg.textarena_per_game)
    if name in ("probe", "probe-greedy"):
        from spade_async.evals.probe import ProbeSuite

        return ProbeSuite.from_config(cfg, sandbox, greedy=name == "probe-greedy")
    raise ValueError(f"unknown suite {name!r}: one of {', '.join(SUITES)}")
