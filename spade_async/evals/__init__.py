"""Held-out evaluation suites (`spade eval`): tasks from packages nobody here wrote, scored by
their own checkers (see base.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spade_async.config import EvalConfig
    from spade_async.evals.base import Suite

SUITES = ("reasoning-gym", "bfcl-multi-turn")


def make_suite(name: str, ecfg: EvalConfig) -> Suite:
    """A suite by name, sized by the config's [eval] section."""
    if name == "reasoning-gym":
        from spade_async.evals.reasoning_gym_suite import ReasoningGymSuite

        return ReasoningGymSuite(per_generator=ecfg.reasoning_gym_per_generator,
                                 max_tokens=ecfg.max_tokens)
    if name == "bfcl-multi-turn":
        from spade_async.evals.bfcl import BfclMultiTurnSuite

        return BfclMultiTurnSuite(n_tasks=ecfg.bfcl_tasks)
    raise ValueError(f"unknown suite {name!r}: one of {', '.join(SUITES)}")
