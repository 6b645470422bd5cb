"""`spade run` as a real process with the real LanceDB memory, the real sandbox and a scripted
endpoint in its own process: kill -9 mid-run, restart, and the memory and the spool agree (no
torn or duplicated batch, no accepted environment lost, the corpus cursor moves on)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from memory_db.config import MemoryConfig
from memory_db.store import open_memory
from spade_async.endpoints.launch import wait_healthy
from spade_async.spool import FileSpool
from spade_async.testing.fake_openai import _free_port

REPO = Path(__file__).resolve().parents[1]
SPADE = [sys.executable, "-m", "spade_async.cli"]


def _write_config(tmp: Path, port: int, tokenizer: Path) -> Path:
    docs = tmp / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"doc{i}", "text": f"Topic {i}: " + "words " * 80})
                            + "\n" for i in range(12)))
    cfg = tmp / "spade.toml"
    cfg.write_text(f"""
[paths]
data_dir = "{tmp / 'data'}"

[model]
tokenizer = "{tokenizer}"

[[endpoints]]
name = "scripted"
base_url = "http://127.0.0.1:{port}"

[pool]
wait_for_endpoint_s = 30

[sandbox]
slots = 12
warm_workers = 4

[rollout]
k_unhinted = 3
k_hinted = 2
max_tokens_per_turn = 16

[daemon]
designs_per_document = 2
documents_in_flight = 2
examples_k = 1
replay_probability = 0.3
status_interval_s = 0.2

[corpus]
min_chars = 10
[corpus.source]
type = "jsonl"
path = "{docs}"
id_field = "id"

[memory]
embedding_model = "hash-384"
""")
    return cfg


def _batch_seqs(spool_dir: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in spool_dir.glob("batch-*.arrow"))


async def _memory_ids(tmp: Path) -> dict[str, str]:
    async with open_memory(MemoryConfig(embedding_model="hash-384"), str(tmp / "data" / "memory"),
                           writable=False) as mem:
        rows = await mem.list(limit=10_000)
    return {r.id: r.status for r in rows}


@pytest.fixture
def scripted_endpoint(checkpoint):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "spade_async.testing.scripted", str(port),
                             str(checkpoint), "0.005"], cwd=REPO)
    wait_healthy(f"http://127.0.0.1:{port}", proc, 60, what="scripted endpoint")
    yield port
    proc.terminate()
    proc.wait(10)


def test_kill_9_mid_run_then_restart_is_consistent(scripted_endpoint, checkpoint, tmp_path):
    cfg = _write_config(tmp_path, scripted_endpoint, checkpoint)
    spool_dir = tmp_path / "data" / "spool"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    with open(tmp_path / "run1.log", "wb") as log:
        daemon = subprocess.Popen([*SPADE, "run", "-c", str(cfg)], cwd=REPO, env=env,
                                  stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while len(_batch_seqs(spool_dir)) < 2:
            assert daemon.poll() is None, (tmp_path / "run1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "run1.log").read_text()[-3000:]
            time.sleep(0.05)
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)  # mid-run: documents and episodes in flight
        daemon.wait()
    before = _batch_seqs(spool_dir)
    ids_before = anyio.run(_memory_ids, tmp_path)
    assert before == list(range(1, len(before) + 1))
    assert "accepted" in ids_before.values() and "rejected" in ids_before.values()
    cursor_before = json.loads((tmp_path / "data" / "corpus-state.json").read_text())["consumed"]

    res = subprocess.run([*SPADE, "run", "-c", str(cfg), "--max-iterations", "2"], cwd=REPO,
                         env=env, capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    after = _batch_seqs(spool_dir)
    assert after == list(range(1, len(after) + 1)) and len(after) > len(before)
    # Every batch is whole and readable, in order; sample ids never repeat across batches.
    reader = FileSpool(spool_dir)
    seen: set[str] = set()
    for seq in after:
        batch = reader.claim_next(seq - 1)
        assert batch is not None and batch.seq == seq
        ids = [s.sample_id for s in batch.samples()]
        assert not seen & set(ids)
        seen |= set(ids)
    ids_after = anyio.run(_memory_ids, tmp_path)
    assert {i for i, s in ids_before.items() if s == "accepted"} <= set(ids_after)
    cursor_after = json.loads((tmp_path / "data" / "corpus-state.json").read_text())["consumed"]
    assert cursor_after == cursor_before + 2
    status = json.loads((tmp_path / "data" / "run" / "status.json").read_text())
    assert status["iterations"] == 2
