"""Retention under the real daemon (the soak's smallest size): with tiny segments the run's
record files roll into gzip segments while it runs, the oldest go past `keep_mb`, and the
report and the status read what is kept, in order, through the rolls."""

from __future__ import annotations

import json

from spade_async.core.config import (
    DaemonConfig,
    EndpointConfig,
    PathsConfig,
    PoolConfig,
    RetentionConfig,
    RolloutConfig,
    SandboxConfig,
    SpadeConfig,
)
from spade_async.core.config.corpus import CorpusConfig, JsonlSourceConfig
from spade_async.core.rolling import iter_jsonl, rolled_bytes, rolled_segments
from spade_async.report.data import slim_episodes
from spade_async.testing.daemon import run_daemon
from spade_async.testing.memory import DictMemory
from spade_async.testing.scripted import Script


async def test_the_daemons_records_roll_and_stay_within_their_retention(fake, tmp_path):
    server, chat = fake
    server.state.script = Script(chat, per_document=True)
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"Topic {i}: tides. " * 20})
                              + "\n" for i in range(8)))
    keep_kb = 1  # two or so gzip segments of ~2 KB of JSON lines
    cfg = SpadeConfig(
        paths=PathsConfig(data_dir=tmp_path / "data"),
        retention=RetentionConfig(segment_mb=2 / 1024, keep_mb=keep_kb / 1024),  # 2 KB, 1 KB
        endpoints=[EndpointConfig(name="fake", base_url=server.base_url)],
        pool=PoolConfig(wait_for_endpoint_s=5),
        sandbox=SandboxConfig(slots=4, warm_workers=2),
        rollout=RolloutConfig(k_unhinted=3, k_hinted=2, max_tokens_per_turn=16),
        daemon=DaemonConfig(designs_per_document=2, examples_k=0, replay_probability=0.0),
        corpus=CorpusConfig(source=JsonlSourceConfig(path=corpus, id_field="id"), min_chars=10),
    )
    daemon, _ = await run_daemon(cfg, chat, DictMemory(), tmp_path, iterations=6)
    episodes = tmp_path / "run" / "episodes.jsonl"
    segs = rolled_segments(episodes)
    assert segs and all(s.name.endswith(".jsonl.gz") for s in segs)
    assert int(segs[-1].name[:8]) >= 3                     # it rolled again and again
    assert rolled_bytes(episodes) <= keep_kb * 1024       # the oldest were deleted
    kept = list(iter_jsonl(episodes))
    assert 0 < len(kept) < daemon.counters["episodes"]     # ... so fewer are kept than played
    times = [e["time"] for e in kept]
    assert times == sorted(times)                          # in order across the segments
    assert len(slim_episodes(episodes)) == len(kept)       # the report reads the same
    plays = list(iter_jsonl(tmp_path / "run" / "plays.jsonl"))
    assert plays and all("regret" in p for p in plays)
