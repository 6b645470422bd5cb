"""Config sections for the Procfile's daemon and trainer against the scripted fake endpoint
(tests that run the real processes: the trainer trains the real checkpoint, the real sandbox,
spool and LanceDB memory run), with a small JSONL corpus."""

from __future__ import annotations

import json
from pathlib import Path


def scripted_stack_toml(tmp: Path, base_url: str, *, daemon_extra: str = "") -> str:
    """Every section but [paths]: the checkpoint named `smollm2` under the models dir, one
    scripted vllm-lora endpoint, small rollouts, a corpus of 40 documents written to
    `tmp/docs.jsonl`, hashed embeddings, a trainer that publishes every step."""
    docs = tmp / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"doc{i}", "text": f"Topic {i}: " + "words " * 60})
                            + "\n" for i in range(40)))
    return f"""
[model]
checkpoint_name = "smollm2"
[[endpoints]]
name = "scripted"
base_url = "{base_url}"
[endpoints.weight_swap]
type = "vllm-lora"
max_loaded_adapters = 2
[pool]
wait_for_endpoint_s = 30
[sandbox]
slots = 8
warm_workers = 2
[rollout]
k_unhinted = 2
k_hinted = 2
max_tokens_per_turn = 16
[daemon]
designs_per_document = 2
documents_in_flight = 1
max_batches_ahead = 1
examples_k = 0
replay_probability = 0.0
status_interval_s = 0.2
{daemon_extra}
[corpus]
min_chars = 10
[corpus.source]
type = "jsonl"
path = "{docs}"
id_field = "id"
[memory]
embedding_model = "hash-384"
[trainer]
lr = 1e-4
samples_per_step = 2           # the scripted daemon writes designer-only batches (2 a document):
designer_max_share = 1.0       # each is trained within step_wait_s of its claim, a step or two
step_wait_s = 1.0              # per batch
micro_batch_tokens = 2048
publish_every_steps = 1
checkpoint_every_steps = 1
publish_retry_s = 1.0
"""


def one_endpoint_toml(data_dir: Path, tokenizer: Path, name: str, base_url: str) -> str:
    """The head of a test config: its data dir, the tokenizer, one endpoint (more sections
    go after it)."""
    return f"""
[paths]
data_dir = "{data_dir}"
[model]
tokenizer = "{tokenizer}"
[[endpoints]]
name = "{name}"
base_url = "{base_url}"
"""
