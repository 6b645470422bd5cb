"""An in-process fake of vLLM's OpenAI-compatible server, for deterministic tests and benchmarks.

It speaks the subset SPADE-async uses (token-id completions with `logprobs` and
`return_token_ids`, chat completions with tools and structured outputs, `/v1/models`, runtime
LoRA load/unload, `/update_weight_version`, `/weight_info`, `/collective_rpc`, vLLM's NCCL
weight-transfer routes, `/reset_prefix_cache`, `/version`, `/openapi.json`, `/health`) and lets a
test inject failures, latency, rate limits and outages. It stands beside the real vLLM tests,
never instead of them. The modules: `state` (FakeState), `generate`, `admin` and `nccl` (the
route families), `app` (composed, behind the request log), `server` (FakeOpenAIServer, in a
thread), `__main__` (in its own process).
"""
