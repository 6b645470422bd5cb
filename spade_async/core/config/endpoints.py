"""Where model requests go: the inference endpoints with their weight-swap backends, the roles
that route to them, and how the endpoint pool retries and health-checks them."""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from spade_async.core.config.errors import ConfigError
from spade_async.core.strict import Strict


class VllmLoraSwap(Strict):
    type: Literal["vllm-lora"] = "vllm-lora"
    max_loaded_adapters: int = Field(4, ge=1, description="adapters kept loaded at once")


class VllmReloadSwap(Strict):
    type: Literal["vllm-reload"] = "vllm-reload"


class VllmNcclSwap(Strict):
    """vLLM's NCCL weight transfer: the trainer's rank 0 and the workers of EVERY vllm-nccl
    endpoint form one NCCL group (the trainer at rank 0, each server's workers after the
    servers listed before it), and each version goes out as packed broadcasts of
    `bucket_bytes`, each reaching every server at once. The group's settings (all but
    timeout_s) must be the same on every vllm-nccl endpoint. The server is started with
    `--weight-transfer-config '{"backend": "nccl"}'` in dev mode (scripts/inference.sh does it
    for such an endpoint)."""

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
    bucket_bytes: int = Field(
        1024 * 1024 * 1024, ge=1, description="bytes per packed broadcast (vLLM's "
        "packed_buffer_size_bytes, sent to the workers at the handshake): a bucket closes after "
        "the tensor that takes it past this size. The workers hold up to bucket_buffers of them "
        "on their GPUs, the trainer one")
    bucket_buffers: int = Field(2, ge=1, description="the workers' receive buffers (vLLM's "
                                "packed_num_buffers: double buffering at 2)")

    @model_validator(mode="after")
    def _ports(self) -> VllmNcclSwap:
        if self.port_range is not None:
            lo, hi = self.port_range
            if not 1024 <= lo <= hi <= 65535:
                raise ValueError(f"weight_swap.port_range {list(self.port_range)}: need "
                                 "1024 <= first <= last <= 65535")
        return self


class NoSwap(Strict):
    type: Literal["none"] = "none"


WeightSwap = Annotated[
    VllmLoraSwap | VllmReloadSwap | VllmNcclSwap | NoSwap, Field(discriminator="type")
]


class EndpointConfig(Strict):
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


class RoleConfig(Strict):
    """Which endpoints one role sends its requests to, under which model name, by which path."""

    group: str = Field("default", min_length=1, description="endpoint group (endpoints.group)")
    model: str | None = Field(None, description="model name to request. None: the trained "
                              "policy (its newest version, or the version under evaluation)")
    path: RolePath = Field(
        "auto", description="tokens: /v1/completions with token-id prompts, returned ids and "
        "log-probs (vLLM; what training needs). chat: /v1/chat/completions with text (any "
        "OpenAI-compatible server). auto: tokens where the group's endpoints have it, else chat")


class RolesConfig(Strict):
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


class PoolConfig(Strict):
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
