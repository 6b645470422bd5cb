"""Record files under retention (core/rolling.py): the live file rolls into gzip segments, the
oldest go past the size or age limit, and every reader (whole, streamed, tail, incremental)
sees the rolled records in order with nothing twice."""

from __future__ import annotations

import gzip
import json
import os
import time

from spade_async.core.io import read_jsonl
from spade_async.core.rolling import (
    JsonlTail,
    Retention,
    RollingFile,
    iter_jsonl,
    rolled_bytes,
    rolled_segments,
    tail_bytes,
)
from spade_async.core.trainer_metrics import events, tail_events


def _fill(log: RollingFile, n: int, start: int = 0, pad: int = 100) -> None:
    for i in range(start, start + n):
        log.append({"i": i, "pad": "x" * pad})


def test_rolls_compress_and_read_back_in_order(tmp_path):
    path = tmp_path / "episodes.jsonl"
    log = RollingFile(path, Retention(segment_bytes=2000, keep_bytes=None))
    _fill(log, 100)
    segs = rolled_segments(path)
    assert len(segs) >= 5 and all(s.name.endswith(".jsonl.gz") for s in segs)
    assert [int(s.name[:8]) for s in segs] == list(range(1, len(segs) + 1))
    with gzip.open(segs[0]) as f:  # a plain gzip file: zcat reads it
        assert json.loads(f.readline())["i"] == 0
    assert [r["i"] for r in iter_jsonl(path)] == list(range(100))
    assert [r["i"] for r in read_jsonl(path)] == list(range(100))
    assert path.stat().st_size < 2000  # the live segment starts over after a roll


def test_retention_keeps_the_newest_segments_by_size_and_age(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = RollingFile(path, Retention(segment_bytes=1500, keep_bytes=600))
    _fill(log, 200)
    kept = [r["i"] for r in iter_jsonl(path)]
    assert rolled_bytes(path) <= 600
    assert kept == list(range(kept[0], 200)) and kept[0] > 0  # the oldest went, in order
    aged = RollingFile(path, Retention(segment_bytes=1500, keep_bytes=None, keep_s=3600))
    old = rolled_segments(path)[0]
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert aged.prune() == [old]


def test_a_crash_between_rename_and_compression_loses_and_repeats_nothing(tmp_path):
    path = tmp_path / "plays.jsonl"
    log = RollingFile(path, Retention(segment_bytes=10**9))
    _fill(log, 10)
    folder = path.with_name("plays.rolled")
    folder.mkdir()
    os.replace(path, folder / "00000001-20260101T000000Z.jsonl")  # renamed, not compressed
    path.write_text('{"i": 10}\n{"i": 11, "torn')  # a writer killed mid-line
    assert [r["i"] for r in iter_jsonl(path)] == list(range(11))
    RollingFile(path, Retention(segment_bytes=10**9))  # the next writer finishes the roll
    assert [s.name.endswith(".gz") for s in rolled_segments(path)] == [True]
    assert [r["i"] for r in iter_jsonl(path)] == list(range(11))


def test_the_incremental_tail_reads_across_rolls_once(tmp_path):
    path = tmp_path / "designs.jsonl"
    log = RollingFile(path, Retention(segment_bytes=3000, keep_bytes=None))
    tail = JsonlTail(path)
    seen = []
    for start in range(0, 120, 7):
        _fill(log, 7, start)
        seen += [r["i"] for r in tail.lines()]
    assert seen == list(range(0, 126))
    assert len(rolled_segments(path)) >= 3


def test_trainer_metrics_readers_see_the_rolled_steps(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = RollingFile(path, Retention(segment_bytes=4000, keep_bytes=None))
    for step in range(1, 61):
        log.append({"event": "step", "step": step, "pad": "y" * 50})
    assert [e["step"] for e in events(path)] == list(range(1, 61))
    log.roll()  # the live file is empty: the tail still has the last steps
    assert not path.exists()
    steps = [e["step"] for e in tail_events(path, nbytes=1000)]
    assert steps and steps[-1] == 60 and steps == list(range(steps[0], 61))
    assert len(tail_bytes(path, 1000)) == 1000
def test_concurrent_appends_land_in_the_order_of_their_time_field(tmp_path):
    """The run's logs stamp "time" under the file's lock: threads that write in any order
    still leave the lines in time order (the daemon appends from worker threads)."""
    import threading

    log = RollingFile(tmp_path / "e.jsonl", Retention(segment_bytes=8000, keep_bytes=None))
    go = threading.Barrier(8)

    def writer(k: int) -> None:
        go.wait()
        for i in range(200):
            log.append({"time": 0.0, "k": k, "i": i}, time_field="time")

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = list(iter_jsonl(tmp_path / "e.jsonl"))
    assert len(lines) == 1600 and list(lines[0]) == ["time", "k", "i"]  # the field keeps its place
    times = [r["time"] for r in lines]
    assert times == sorted(times) and times[0] > 0
