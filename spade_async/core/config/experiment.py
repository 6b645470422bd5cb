"""The experiment section: which arms `spade experiment run` compares, on what budget, and where
and how often each is evaluated (DESIGN §11)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

from pydantic import Field, ValidationInfo, field_validator, model_validator

from spade_async.core.config.eval import GROUPS, SuiteName
from spade_async.core.strict import Strict

# Arms every experiment knows: the self-play loop and the fixed-environment baseline. Each is a
# set of config tables laid over the experiment's config; [experiment.arm_overrides] adds more.
BUILTIN_ARMS: dict[str, dict[str, Any]] = {
    "spade": {"daemon": {"mode": "spade"}},
    "fixed": {"daemon": {"mode": "fixed"}},
}
ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a directory and an adapter prefix
BUDGET = re.compile(r"^(versions|minutes|tokens)=(\d+(?:\.\d+)?)$")


class ExperimentConfig(Strict):
    name: str = Field("default", pattern=r"^[A-Za-z0-9_.-]+$",
                      description="the experiment's directory name under dir")
    dir: Path | None = Field(None, description="where experiments live; default "
                             "<paths.data_dir>/experiments (each arm gets its own data dir there)")
    arms: list[str] = Field(["spade", "fixed"], min_length=1, description="arms run one after "
                            "another, each from the same base checkpoint, seed environments and "
                            "eval seed: spade, fixed, or a name in arm_overrides")
    budget: str = Field("versions=2", description="each arm's budget: versions=N (published "
                        "policy versions), minutes=M (wall time of its loop) or tokens=T "
                        "(tokens sampled by the designer and the agent)")
    eval_every_versions: int = Field(1, ge=1, description="held-out evaluation of version 0 and "
                                     "every N-th version, and of the version an arm stops on")
    suites: list[str] = Field(["reasoning-gym-easy", "probe"], min_length=1,
                              description="the held-out suites evaluated (see [eval]); a group "
                              "(`paper`, `held-out`) stands for its suites")
    bookend_suites: list[str] = Field([], description="suites evaluated only at v0 and at the "
                                      "version an arm stops on, beside `suites` (code, games "
                                      "and tool use on a small host); groups as in `suites`")
    procfile: Path = Field(Path("Procfile"), description="the Procfile each arm's stack runs "
                           "(relative to the repo): its processes are started and stopped with "
                           "the arm, so every arm's servers start from the base weights")
    processes: list[str] | None = Field(None, min_length=1, description="which of its "
                                        "processes to start (None: all). Leave out inference "
                                        "when the endpoints are served elsewhere: arms can "
                                        "share a vllm-lora server, as each publishes its "
                                        "adapters as <served_name>-<arm>-vN, but a full-weight "
                                        "backend would start the next arm from the last one's "
                                        "weights")
    final_eval_timeout_s: float = Field(1800.0, gt=0, description="how long an arm that has "
                                        "spent its budget may take to evaluate its last version")
    arm_overrides: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="more arms (or changes to spade/fixed): name -> "
        "config tables laid over this config, e.g. {daemon = {moves = {write = 1.0}}}")

    @field_validator("budget")
    @classmethod
    def _budget(cls, v: str) -> str:
        if not BUDGET.match(v.strip()):
            raise ValueError(f"budget {v!r}: versions=N, minutes=M or tokens=T")
        return v.strip()

    @field_validator("suites", "bookend_suites")
    @classmethod
    def _suites_known(cls, v: list[str], info: ValidationInfo) -> list[str]:
        known = (*get_args(SuiteName), *GROUPS)
        if bad := [s for s in v if s not in known]:
            raise ValueError(f"experiment.{info.field_name}: unknown "
                             f"{', '.join(map(repr, bad))}: one of {', '.join(known)}")
        return v

    @model_validator(mode="after")
    def _arms_known(self) -> ExperimentConfig:
        unknown = [a for a in self.arms if a not in BUILTIN_ARMS and a not in self.arm_overrides]
        if unknown:
            raise ValueError(f"experiment.arms: unknown arm {', '.join(map(repr, unknown))} "
                             f"(known: {', '.join([*BUILTIN_ARMS, *self.arm_overrides])})")
        bad = [a for a in [*self.arms, *self.arm_overrides] if not ARM_NAME.match(a)]
        if bad:
            raise ValueError(f"experiment arm name {bad[0]!r}: letters, digits, '_', '.' and "
                             "'-' (it names the arm's directory and its adapters)")
        if len(set(self.arms)) != len(self.arms):
            raise ValueError("experiment.arms: an arm is named twice")
        return self

    def arm_tables(self, arm: str) -> dict[str, Any]:
        """The config tables an arm lays over the experiment's config."""
        out = dict(BUILTIN_ARMS.get(arm, {}))
        for section, table in self.arm_overrides.get(arm, {}).items():
            out[section] = {**out.get(section, {}), **table} if isinstance(table, dict) else table
        return out

    def parsed_budget(self) -> tuple[str, float]:
        kind, amount = BUDGET.match(self.budget).groups()
        return kind, float(amount)
