"""The trainer's config: one frozen pydantic model, the main tree's `[trainer]` section.

`python -m trainer --trainer-config FILE` can also read this section from a TOML file of its
own. Nothing here touches torch, the network or the disk (the main config imports it).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from spade_async.core.strict import Strict


class TrainerConfigError(ValueError):
    """A trainer config that cannot be used; names the key."""


class TrainerConfig(Strict):
    """How the trainer learns from regret batches and when it publishes weights (DESIGN §8)."""

    # -- what is trained ----------------------------------------------------------------------
    mode: Literal["lora", "full"] = Field(
        "lora", description="train a peft LoRA adapter (served by vllm-lora, or merged for "
        "vllm-reload / vllm-nccl) or every weight (vllm-reload / vllm-nccl only)")
    base_model: Path | None = Field(
        None, description="HF checkpoint to start from; default: the prepared checkpoint "
        "(data_dir/models/<model.checkpoint_name>)")
    lora_rank: int = Field(16, ge=1, le=256, description="LoRA r (the vLLM server's "
                           "--max-lora-rank must be >= this; 16 for the embedded server)")
    lora_alpha: float = Field(32.0, gt=0, description="LoRA alpha; the update is scaled by "
                              "alpha / r")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the LoRA input")
    lora_targets: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1,
        description="module names that get adapters (vLLM must support them for LoRA)")

    # -- optimisation ---------------------------------------------------------------------------
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate after warm-up")
    warmup_steps: int = Field(0, ge=0, description="linear LR warm-up from 0 over these steps")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="after warm-up: constant, or cosine from lr down to "
        "lr * min_lr_ratio over lr_decay_steps, then constant there (a daemon runs open-ended)")
    lr_decay_steps: int = Field(1000, ge=1, description="cosine: steps from the end of warm-up "
                                "to the floor")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine: the floor, as a share "
                                "of lr")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    adam_eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, ge=0, description="max global grad norm (0: no clipping)")
    seed: int = Field(0, description="torch seed (LoRA init, dropout)")

    # -- the loss -------------------------------------------------------------------------------
    clip_eps_low: float = Field(0.2, ge=0, lt=1, description="importance ratio clipped below "
                                "at 1 - clip_eps_low")
    clip_eps_high: float = Field(0.28, ge=0, description="importance ratio clipped above at "
                                 "1 + clip_eps_high (asymmetric, DAPO-style 'clip higher')")
    kl_coef: float = Field(0.0, ge=0, description="weight of the k3 KL estimate to the base "
                           "(reference) model; 0 skips the reference forward entirely")
    agent_weight: float = Field(1.0, ge=0, description="loss weight of agent samples: each "
                                "role's loss is its own token mean, and the step's loss their "
                                "weighted mean, so a role's share does not grow with how many "
                                "tokens it has (a 768-token design against a 30-token answer)")
    designer_weight: float = Field(1.0, ge=0, description="loss weight of designer samples "
                                   "(relative to agent_weight)")
    max_staleness: int = Field(2, ge=0, description="samples drawn with a policy more than this "
                               "many published versions old are dropped (keep it equal to "
                               "daemon.max_staleness)")
    logprob_temperature: float = Field(
        1.0, gt=0, description="logits are divided by this before the log-softmax, to score "
        "tokens under the distribution they were sampled from. In a SPADE config it follows "
        "rollout.temperature unless set (a set value that differs is an error), and servers "
        "started by scripts/inference.sh report matching log-probs: vLLM's default "
        "raw_logprobs (temperature 1) at temperature 1, --logprobs-mode processed_logprobs "
        "otherwise (spade_async.core.config.logprobs_mode)")

    # -- steps ----------------------------------------------------------------------------------
    samples_per_step: int = Field(
        32, ge=1, description="an optimizer step trains this many agent samples, gathered "
        "across spool batches (a batch is acknowledged once a checkpoint covers every sample "
        "in it), plus designer samples up to designer_max_share of it")
    designer_max_share: float = Field(
        0.25, ge=0, le=1, description="designer samples per step: at most this share of "
        "samples_per_step (rounded up); more wait for the next step, and beyond two steps' "
        "worth the oldest are dropped (counted as designer_cap)")
    designer_steps: Literal["shared", "separate"] = Field(
        "shared", description="shared: designer samples ride in the agent's steps (up to "
        "designer_max_share); separate: they make steps of their own (one designer step of "
        "that many samples after every agent step at most)")
    phases: Literal["concurrent", "alternate"] = Field(
        "concurrent", description="how the trainer shares a host with the inference servers: "
        "concurrent (both run at once; a CPU server at nice 10 on one core, the trainer "
        "first), or alternate (the servers are paused, in-flight requests kept, while a step "
        "trains and publishes, and the CPU server binds every core: generate, then train)")
    step_wait_s: float = Field(
        120.0, gt=0, description="train what the buffer holds when its oldest sample has "
        "waited this long without samples_per_step agent samples coming (a slow daemon or a "
        "designer-only phase, whose samples never fill an agent step, still gets trained)")

    # -- batching -------------------------------------------------------------------------------
    pack: bool = Field(True, description="pack samples into rows (several sequences per row "
                       "under a tree attention mask, a prefix several samples share computed "
                       "once) instead of one padded row per sample")
    row_tokens: int = Field(512, ge=16, description="packing: positions per row (a longer "
                            "sample or group runs in a row of its own); on 2 CPU cores 4 rows "
                            "of 512 ran 1.2x faster than 2 of 1024")
    shared_prefix_min: int = Field(16, ge=1, description="packing: samples share a prefix "
                                   "only when it is at least this many tokens")
    micro_batch_tokens: int = Field(4096, ge=16, description="padded tokens (rows x longest "
                                    "row) per forward/backward; a longer row runs alone")
    kl_base_every_steps: int = Field(
        1, ge=0, description="every this many steps, score the step's first micro-batch with "
        "the base model too (the adapter switched off, or the KL reference) and log the "
        "policy's KL and mean |dlogp| to it (kl_base, logprob_abs_diff_base); 0: never")

    # -- parallelism ----------------------------------------------------------------------------
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend; auto: nccl with CUDA, else gloo")
    parallel: Literal["ddp", "fsdp2"] = Field("ddp", description="DDP replicas or FSDP2 "
                                              "(fully_shard per decoder layer + root)")
    autocast_bf16: Literal["auto"] | bool = Field(
        "auto", description="bf16 compute with fp32 master weights (autocast for DDP, "
        "MixedPrecisionPolicy for FSDP2). auto: exactly when the inference servers compute in "
        "bf16 (model.dtype resolved as they resolve it: on a CPU trainer from this CPU's "
        "features, on a GPU trainer vLLM's auto), so the trainer's log-probs come from the "
        "same arithmetic as the behaviour log-probs")

    # -- checkpoints and publishing ----------------------------------------------------------------
    checkpoint_dir: Path | None = Field(None, description="checkpoints, metrics log; default "
                                        "data_dir/trainer")
    checkpoint_every_steps: int = Field(10, ge=1, description="optimizer steps between "
                                        "checkpoints (publishes do not force one: a restart "
                                        "trains the steps after its checkpoint again and does "
                                        "not publish the versions it had published)")
    checkpoint_every_minutes: float = Field(10.0, ge=0, description="a checkpoint also once "
                                            "this long has passed since the last one (0: by "
                                            "steps only)")
    keep_checkpoints: int = Field(2, ge=1, description="committed checkpoints kept on disk "
                                  "(the newest)")
    keep_checkpoint_every_hours: float = Field(0.0, ge=0, description="besides the newest, "
                                               "keep the first checkpoint of every this many "
                                               "hours (0: none)")
    publish_every_steps: int = Field(1, ge=0, description="publish version N = step / this "
                                     "every this many steps (0: never publish)")
    keep_versions: int = Field(6, ge=1, description="published weight directories kept; vLLM "
                               "re-reads an unloaded adapter's files for requests still using "
                               "it, so keep more than the servers' max_loaded_adapters")
    publish_timeout_s: float = Field(300.0, gt=0, description="deadline of one endpoint's "
                                     "swap attempt (its HTTP calls have their own deadlines)")
    publish_attempts: int = Field(3, ge=1, description="swap attempts per endpoint per publish")
    publish_retry_s: float = Field(30.0, gt=0, description="wait before retrying a failed "
                                   "publish; training goes on, current.json stays behind")

    # -- the loop -------------------------------------------------------------------------------
    poll_interval_s: float = Field(0.5, gt=0, description="spool poll period while idle")
    serve_check_s: float = Field(10.0, ge=0, description="how often (while waiting for "
                                 "batches) the trainer checks that every endpoint still serves "
                                 "the published version, and pushes it again into one that "
                                 "lost it (a restarted vLLM comes back with the base weights "
                                 "and no adapters). 0: never")

    @model_validator(mode="after")
    def _checks(self) -> TrainerConfig:
        if self.adam_betas[0] >= 1 or self.adam_betas[1] >= 1 or min(self.adam_betas) < 0:
            raise ValueError(f"adam_betas must lie in [0, 1), got {self.adam_betas}")
        return self


def trainer_root(cfg: Any, tcfg: TrainerConfig) -> Path:
    """Checkpoints and metrics.jsonl: `trainer.checkpoint_dir`, default data_dir/trainer."""
    return tcfg.checkpoint_dir or cfg.paths.data_dir / "trainer"


def load_trainer_config(path: str | Path) -> TrainerConfig:
    """A TOML file holding a `[trainer]` table (or the trainer keys at top level)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise TrainerConfigError(f"{path}: trainer config file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise TrainerConfigError(f"{path}: not valid TOML: {exc}") from None
    data = data.get("trainer", data)
    try:
        return TrainerConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            raise TrainerConfigError(f"{path}: unknown key 'trainer.{key}'") from None
        raise TrainerConfigError(f"{path}: bad value for 'trainer.{key}': {err['msg']}") from None
