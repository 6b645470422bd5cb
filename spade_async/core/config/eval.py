"""Held-out evaluation and the probe suite's section."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from spade_async.core.config.seeds import seed_catalog
from spade_async.core.strict import Strict

SuiteName = Literal["reasoning-gym", "reasoning-gym-easy", "bfcl-multi-turn", "humaneval",
                    "textarena", "probe", "probe-greedy"]
# The suites of fixed training variants (not held out): sampled at the rollout's temperature,
# and greedy. Both play the same tasks (variants, episode seeds, request seeds).
PROBE_SUITES: tuple[str, ...] = ("probe", "probe-greedy")
# Names that stand for several suites (`spade eval --suite paper`, experiment.suites): the
# paper's table of held-out evaluation, and every held-out suite.
GROUPS: dict[str, tuple[str, ...]] = {
    "paper": ("reasoning-gym", "humaneval", "textarena", "bfcl-multi-turn"),
    "held-out": ("reasoning-gym", "reasoning-gym-easy", "humaneval", "textarena",
                 "bfcl-multi-turn"),
}


class ProbeVariantConfig(Strict):
    """One variant of the probe suite: a seed environment at chosen knob values."""

    family: str = Field(min_length=1, description="a seed environment's file stem "
                        "(spade_async/envs/seeds/<family>.py)")
    params: dict[str, Any] = Field(default_factory=dict, description="its knob values; "
                                   "the others keep their defaults")


class EvalConfig(Strict):
    """Held-out evaluation (`spade eval`, and the daemon's periodic one), and the probe."""

    suites: list[SuiteName] = Field(
        ["reasoning-gym", "bfcl-multi-turn"], description="suites run by default "
        "(reasoning-gym-easy: the same generators at their smallest sizes; probe: a fixed set "
        "of training variants, not held out, sampled at the rollout's temperature; "
        "probe-greedy: the same at temperature 0; run them with --suite or list them here)")
    probe_variants: list[ProbeVariantConfig] | None = Field(
        None, min_length=1, description="the probe suite's variants. None: every seed "
        "environment at the points probe_rungs names")
    probe_rungs: list[Literal["easiest", "default"]] = Field(
        ["easiest", "default"], min_length=1, description="with probe_variants None, which "
        "points of every seed family the probe plays: its easiest point (each knob's `easy` "
        "value, else min / first choice / false), its defaults, or both")
    probe_seeds: int = Field(8, ge=1, le=1000, description="episodes per probe variant, with "
                             "the same fixed seeds on every version")

    @field_validator("probe_variants")
    @classmethod
    def _probe_variants_resolve(cls, v: list[ProbeVariantConfig] | None,
                                info: ValidationInfo) -> list[ProbeVariantConfig] | None:
        """Each family must be a seed file and its params must fit the knobs it declares."""
        catalog = seed_catalog(info)
        if v is not None and catalog is not None:
            catalog.check_probe_variants([x.model_dump() for x in v])
        return v

    every_versions: int = Field(0, ge=0, description="the daemon evaluates every N-th published "
                                "version in the background (0: never; `spade eval` any time)")
    bookend_suites: list[SuiteName] = Field(
        [], description="with every_versions, suites the daemon evaluates only at version 0 and "
        "at the version a bounded run stops on (`spade experiment`'s arms): the costly ones, "
        "whose every-N-th point beside the loop would cost more than the loop's learning")
    reasoning_gym_per_generator: int = Field(8, ge=1, description="tasks per reasoning-gym "
                                             "generator (6 generators; reasoning-gym-easy: 5)")
    bfcl_tasks: int = Field(10, ge=1, description="BFCL-v4 multi-turn base entries, the first N")
    humaneval_tasks: int | None = Field(None, ge=1, description="HumanEval problems, the "
                                        "first N (None: all 164)")
    humaneval_samples: int = Field(1, ge=1, le=200, description="completions per HumanEval "
                                   "problem: 1 is greedy pass@1; n > 1 samples at "
                                   "humaneval_temperature for the unbiased pass@k, k <= n")
    humaneval_temperature: float = Field(0.8, gt=0, le=2, description="sampling temperature "
                                         "when humaneval_samples > 1")
    textarena_per_game: int = Field(8, ge=1, le=1000, description="TextArena games: tasks "
                                    "(fixed seeds) per seeded game (LightsOut, Minesweeper, "
                                    "Sudoku), beside one per Tower of Hanoi size")
    max_tokens: int = Field(384, ge=16, description="completion budget of one answer / turn")
    max_seq_len: int = Field(8192, ge=512, description="prompt + turns of one task: BFCL's tool "
                             "docs alone take 2.2k-5.2k tokens (inference.sh serves at least "
                             "this context)")
    concurrency: int = Field(4, ge=1, description="tasks evaluated at once")
