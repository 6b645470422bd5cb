"""The memory across processes and storage backends: a reader process sees a writer process's
appends as they commit; kill -9 of the writer in the middle of a batch loses nothing that was
acknowledged; and the whole API runs against object storage (moto's S3 server on loopback)."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from memory_db import MemoryConfig, NewEnv, open_memory

REPO = Path(__file__).resolve().parents[1]
CFG = MemoryConfig(embedding_model="hash-64", read_consistency_s=0.0,
                   writer={"flush_interval_s": 0.005})

# The writer process: batches of 40 environments, forever. "begin N" before a batch is handed to
# the memory, "committed N <ids>" once insert_many returned (i.e. the batch was acknowledged).
WRITER = textwrap.dedent('''
    import sys, anyio, structlog
    from memory_db import MemoryConfig, NewEnv, open_memory

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))

    async def main(uri):
        cfg = MemoryConfig(embedding_model="hash-64", writer={"flush_interval_s": 0.005})
        async with open_memory(cfg, uri) as mem:
            n = 0
            while True:
                envs = [NewEnv(code=f"class Environment:\\n    i = {n * 40 + j}\\n",
                               name=f"w{n}-{j}", description=f"writer batch {n} item {j} " * 20,
                               check_novelty=False) for j in range(40)]
                print("begin", n, flush=True)
                res = await mem.insert_many(envs)
                print("committed", n, *[r.id for r in res], flush=True)
                n += 1

    anyio.run(main, sys.argv[1])
''')


async def _read_line(out: BufferedByteReceiveStream, proc: Process, log: Path) -> str:
    try:
        return (await out.receive_until(b"\n", 1 << 20)).decode().strip()
    except (anyio.EndOfStream, anyio.IncompleteRead):
        raise AssertionError(f"writer exited {await proc.wait()}: "
                             f"{log.read_text()[-2000:]}") from None


async def test_reader_sees_appends_and_kill_9_mid_batch_loses_no_committed_env(tmp_path):
    uri = str(tmp_path / "memory")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    committed: set[str] = set()
    seen_counts: list[int] = []
    log = tmp_path / "writer.log"
    with log.open("wb") as err:
        proc = await anyio.open_process([sys.executable, "-c", WRITER, uri], env=env, cwd=REPO,
                                        stderr=err)
    async with proc:
        out = BufferedByteReceiveStream(proc.stdout)
        try:
            with anyio.fail_after(60):
                line = ""
                while not line.startswith("committed"):  # the database exists after batch 0
                    line = await _read_line(out, proc, log)
                committed.update(line.split()[2:])
                async with open_memory(CFG, uri, writable=False) as reader:
                    batch = 0
                    while batch < 6:
                        kind, n, *ids = (await _read_line(out, proc, log)).split()
                        if kind == "committed":
                            committed.update(ids)
                            # everything acknowledged so far is visible to this other process
                            count = await reader.count()
                            assert count >= len(committed), (count, len(committed))
                            seen_counts.append(count)
                        batch = int(n)
                    # "begin 6" was printed: the writer is inside that batch now
                    os.kill(proc.pid, signal.SIGKILL)
                    await proc.wait()
                    after = await reader.count()
        finally:
            if proc.returncode is None:
                proc.kill()
                with anyio.move_on_after(10, shield=True):
                    await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert len(set(seen_counts)) >= 3 and seen_counts == sorted(seen_counts)
    assert after >= len(committed)
    # a new writer opens the killed one's database, finds every acknowledged env, and goes on
    async with open_memory(CFG, uri) as mem:
        stored = {rec.id for rec in await mem.list(limit=None)}
        assert committed <= stored
        assert len(stored) % 40 == 0  # whole batches or nothing: never half of one
        res = await mem.insert(NewEnv(code="class Environment:\n    after = 1\n", name="after",
                                      description="written after the crash"))
        assert res.status == "accepted" and await mem.count() == len(stored) + 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3_server():
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


async def test_object_storage_uri_against_a_local_s3_server(s3_server):
    import boto3

    keys = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1", **keys).create_bucket(
        Bucket="spade")
    cfg = CFG.model_copy(update={"storage_options": {
        "aws_endpoint": s3_server, "allow_http": "true", "aws_region": "us-east-1", **keys}})
    uri = "s3://spade/memory"
    async with open_memory(cfg, uri) as mem:
        results = await mem.insert_many([
            NewEnv(code=f"class Environment:\n    k = {i}\n", name=f"s3-{i}",
                   description=f"object storage task about {word}")
            for i, word in enumerate(["mazes", "calendars", "ledgers"])])
        assert [r.status for r in results] == ["accepted"] * 3
        await mem.record_episodes(results[0].id, hinted=[1.0], unhinted=[0.0])
        assert (await mem.sample_replay(random.Random(0)))[0] == results[0].id
        report = await mem.maintain(optimize=True, index="skip")
        assert report["optimized"] == ["envs", "stats", "meta"]
    async with open_memory(cfg, uri, writable=False) as reader:
        hits = await reader.search("object storage task about calendars", k=1)
        assert hits[0].record.name == "s3-1"
        listed = await reader.list(sort="regret")
        assert listed[0].id == results[0].id and listed[0].stats.regret_ema == 1.0
        summary = await reader.summary()
        assert summary.counts["accepted"] == 3 and summary.storage["uri"] == uri
        rows = [row async for row in reader.export()]
        assert len(rows) == 3 and json.dumps(rows)
