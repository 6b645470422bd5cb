"""The self-play loop's section: its stages, their in-flight limits and its bounded runs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from spade_async.core.config.seeds import seed_catalog
from spade_async.core.strict import Strict


class DaemonConfig(Strict):
    """The self-play loop's stages and their limits (DESIGN §2); every in-flight limit is here."""

    mode: Literal["spade", "fixed"] = Field(
        "spade", description="spade: the designer writes environments from the corpus. fixed: "
        "the fixed-environment baseline: no designer and no corpus; the agent plays the "
        "environments the memory holds when the run starts (with bootstrap_seeds, the 18 seeds), "
        "in a shuffled round robin, through the same episodes, regret, batches and trainer")
    fixed_rungs: list[Literal["default", "easiest"]] = Field(
        ["default"], min_length=1, description="mode fixed: the points each environment with "
        "knobs is played at: its defaults, its easiest point (each knob's `easy` value), or "
        "both (a baseline a small model has a signal on: the seeds' defaults are out of its "
        "reach, so it would train on nothing)")
    unseen_rung: Literal["default", "easiest"] = Field(
        "easiest", description="mode spade: where an accepted environment never played (the "
        "bootstrap seeds) is first played when it has knobs: its easiest point (ACCEL starts "
        "from simple levels; the seeds' defaults are out of a small model's reach: a 60-minute "
        "embedded run spent its first 34 minutes on variants solved 0-17%) or its defaults")
    designs_per_document: int = Field(4, ge=1, description="G: designs drawn per document")
    designer_max_tokens: int = Field(1536, ge=64, description="completion budget of one design")
    designer_temperature: float = Field(1.0, ge=0)
    designer_prefill: str = Field(
        "```python\n", description="text the designer's reply starts with, sent as prompt "
        "tokens (loss mask 0): it opens the code block the contract asks for, so small models "
        "write code instead of prose. \"\" leaves the reply's start to the model")
    examples_k: int = Field(1, ge=0, description="memory examples (MMR) in each designer prompt")
    moves: dict[Literal["write", "edit"], float] = Field(
        default_factory=lambda: {"write": 1.0, "edit": 0.0},
        description="the designer's move mix (DESIGN §12), as relative weights: write a new "
        "module from a document, or edit the knobs of a stored environment (an edit needs a "
        "played environment that declares params; until there is one, the move is a write)")

    @field_validator("moves")
    @classmethod
    def _moves_mix(cls, v: dict[str, float]) -> dict[str, float]:
        if any(w < 0 for w in v.values()) or not sum(v.values()) > 0:
            raise ValueError(f"move weights must be >= 0 with a positive sum, got {v}")
        return v

    edits_per_variant: int = Field(4, ge=1, description="G of the edit move: edits drawn for one "
                                   "stored variant, their advantages normalised together")
    edit_options: int = Field(8, ge=2, le=32, description="neighbouring settings offered to "
                              "the model per edit (the choice constraint's options)")
    edit_band: tuple[float, float] = Field(
        (0.2, 0.8), description="the unhinted solve rates an edit aims its parent's variant "
        "at (ACCEL edits near the frontier): a parent solved less often than the low end is "
        "offered only easier settings, one solved more often than the high end only harder "
        "ones, one inside both ways. (0, 1): only a parent never or always solved is steered "
        "(in a 60-minute embedded run steered so, the median play was solved 0%: a parent at "
        "1/16 was offered harder settings as often as easier ones)")

    @field_validator("edit_band")
    @classmethod
    def _band(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not 0.0 <= v[0] <= v[1] <= 1.0:
            raise ValueError(f"edit_band {list(v)} must be [low, high] with 0 <= low <= high <= 1")
        return v

    documents_in_flight: int | None = Field(
        None, ge=1, description="at most this many documents (or edit groups) in flight at "
        "once; None: as many as the endpoints have room for (new work is admitted while the "
        "designer's and agent's endpoints have free slots, spade_async/loop/admission.py)")
    envs_in_flight: int | None = Field(
        None, ge=1, description="at most this many environments played at once; None: as many "
        "as the agent's endpoints and the sandbox slots have room for")
    env_queue: int = Field(8, ge=1, description="bounded stream: accepted envs awaiting play")
    replay_probability: float = Field(0.25, ge=0, le=1, description="chance that the next env "
                                      "played comes from the replay sampler instead")
    max_staleness: int = Field(2, ge=0, description="samples more policy versions old are "
                               "dropped when their batch is written (counted as stale); with "
                               "max_batches_ahead set it must be >= max_batches_ahead + 1, "
                               "as must trainer.max_staleness (checked)")
    max_batches_ahead: int = Field(
        0, ge=0, description="back-pressure from the trainer: start no new document while this "
        "many written batches wait for it (the spool's taken mark); documents in flight still "
        "finish. 0: never wait (a daemon run without a trainer)")
    bootstrap_seeds: bool = Field(False, description="when the memory holds no accepted "
                                  "environment, validate and store the built-in seed "
                                  "environments first: designer examples and replay material")
    bootstrap_families: list[str] | None = Field(
        None, min_length=1, description="with bootstrap_seeds, only these seed families (file "
        "stems in spade_async/envs/seeds/); None: all of them. A small model that solves "
        "nothing at most families' easiest points (`spade bench ladder`) spends its time on "
        "the ones it can learn from")

    @field_validator("bootstrap_families")
    @classmethod
    def _known_seed_families(cls, v: list[str] | None,
                             info: ValidationInfo) -> list[str] | None:
        """Each name must be a seed family's file stem."""
        catalog = seed_catalog(info)
        if v is not None and catalog is not None:
            catalog.check_families(v)
        return v

    stop_after_versions: int = Field(0, ge=0, description="bounded run: stop by itself (drain, "
                                     "exit 0) once it has sampled with a policy this many "
                                     "versions newer than the one it started on: an agent "
                                     "episode finished on it (a design, while nothing has been "
                                     "there to play). 0: run until stopped")
    document_attempts: int = Field(
        3, ge=1, description="tries of a document whose G design requests all failed on the "
        "endpoint (timeout, deadline, 5xx, malformed answer); then it is given up and recorded "
        "in run/given_up.jsonl. An outage is waited out instead, using none of them")
    item_attempts: int = Field(
        3, ge=1, description="tries of a validation whose sandbox worker did not start, and of "
        "a memory or spool write that failed on I/O, before the item is given up (recorded)")
    status_interval_s: float = Field(2.0, gt=0, description="how often status.json is written")
    drain_timeout_s: float = Field(60.0, gt=0, description="on SIGTERM/SIGINT, time to finish "
                                   "in-flight work before cancelling it")
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus /metrics on 127.0.0.1 "
                              "(0: off)")
