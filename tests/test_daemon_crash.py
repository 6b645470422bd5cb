"""`spade run` as a real process with the real LanceDB memory, the real sandbox and a scripted
endpoint in its own process: kill -9 mid-run, restart, and the memory and the spool agree (no
torn or duplicated batch, no accepted environment lost, exactly the documents in flight at the
kill designed again)."""

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
from spade_async.core.spool.files import FileSpool
from spade_async.inference.launch import free_port as _free_port
from spade_async.inference.launch import wait_healthy

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
documents_in_flight = 4
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


def _started(log: Path) -> list[tuple[int, str]]:
    """From a daemon's log: the corpus chunks it started designing (stream index, chunk id)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict) and ev.get("event") == "document_start":
            out.append((ev["seq"], ev["chunk"]))
    return out


def _used(state_path: Path) -> tuple[int, set[int]]:
    """What the corpus state says is used: every chunk before `consumed`, and `done_ahead`."""
    if not state_path.exists():  # killed before its first commit
        return 0, set()
    state = json.loads(state_path.read_text())
    return state["consumed"], set(state["done_ahead"])


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

    state_path = tmp_path / "data" / "corpus-state.json"
    upto, ahead = _used(state_path)
    started1 = _started(tmp_path / "run1.log")
    unfinished = sorted(c for c in started1 if c[0] >= upto and c[0] not in ahead)
    finished = {c for c in started1 if c[0] < upto or c[0] in ahead}
    res = subprocess.run([*SPADE, "run", "-c", str(cfg), "--max-iterations", str(len(unfinished) + 2)],
                         cwd=REPO, env=env, capture_output=True, timeout=300)
    (tmp_path / "run2.log").write_bytes(res.stderr)
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
    # No document lost, none designed twice: the restart designs exactly the documents that
    # were in flight at the kill (in stream order), then goes on past those already finished.
    started2 = _started(tmp_path / "run2.log")
    assert unfinished and started2[:len(unfinished)] == unfinished, (unfinished, started2)
    assert not set(started2) & finished
    upto2, ahead2 = _used(state_path)
    assert {seq for seq, _ in started2} <= set(range(upto2)) | ahead2  # all finished now
    status = json.loads((tmp_path / "data" / "run" / "status.json").read_text())
    assert status["iterations"] == len(started2) == len(unfinished) + 2
