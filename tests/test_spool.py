"""The batch spool: exact round trips, atomic writes under kill -9, strict ordering, one writer."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from structlog.testing import capture_logs

from spade_async.core.spool.batch import (
    BATCH_SCHEMA,
    SCHEMA_VERSION,
    Sample,
    SampleError,
    SpoolError,
)
from spade_async.core.spool.files import FileSpool, SpoolLockedError

REPO = Path(__file__).resolve().parents[1]


def make_sample(i: int, n_tokens: int = 12, *, seed: int = 0, role: str = "agent") -> Sample:
    """A valid sample whose floats are exactly representable in float32."""
    rng = np.random.default_rng([seed, i])
    mask = (rng.random(n_tokens) < 0.6).astype(int)
    mask[-1] = 1
    logprobs = np.where(mask == 1, -rng.random(n_tokens).astype(np.float32) * 5, 0.0)
    return Sample(
        sample_id=f"s{seed}-{i}",
        role=role,  # type: ignore[arg-type]
        env_id=f"env-{i % 3}",
        policy_version=i % 5,
        token_ids=[int(t) for t in rng.integers(0, 2**31 - 1, n_tokens)],
        loss_mask=[int(m) for m in mask],
        behaviour_logprobs=[float(np.float32(x)) for x in logprobs],
        advantage=float(np.float32(rng.normal())),
        reward=float(np.float32(rng.random())),
        episode_id=f"ep-{i}",
        hinted=bool(i % 2),
        created_at=datetime(2025, 5, 17, 8, 30, 1, 123456 + i, tzinfo=UTC),
    )


def batch_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith(("batch-", ".batch-")))


# -- round trip -----------------------------------------------------------------------------


def test_round_trip_is_exact(tmp_path):
    samples = [make_sample(i, n, role=r) for i, (n, r) in
               enumerate([(1, "agent"), (7, "designer"), (300, "agent"), (4096, "designer")])]
    # extremes: the largest int32 id, a zero-valued logprob on a sampled token, a negative
    # advantage, another timezone (stored as the same instant in UTC)
    samples.append(Sample(
        sample_id="edge", role="agent", env_id="", policy_version=2**40,
        token_ids=[0, 2**31 - 1, 5], loss_mask=[0, 1, 1], behaviour_logprobs=[0.0, -0.0, -1e-3],
        advantage=-3.5, reward=1.0, hinted=True,
        created_at=datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-7))),
    ))
    with FileSpool(tmp_path, writer=True) as spool:
        assert spool.write(samples) == 1
    batch = FileSpool(tmp_path).claim_next(0)
    assert batch is not None and batch.seq == 1 and len(batch) == len(samples)
    assert batch.schema_version == SCHEMA_VERSION
    assert batch.table.schema.metadata[b"schema_version"] == str(SCHEMA_VERSION).encode()
    assert batch.table.schema.equals(BATCH_SCHEMA, check_metadata=True)
    assert batch.table["seq"].to_pylist() == [1] * len(samples)
    assert batch.num_tokens == sum(len(s.token_ids) for s in samples)

    back = batch.samples()
    for want, got in zip(samples[:-1], back[:-1], strict=True):
        assert got == want
        assert all(isinstance(t, int) for t in got.token_ids)
    edge = back[-1]
    assert edge.token_ids == [0, 2**31 - 1, 5] and edge.policy_version == 2**40
    assert edge.behaviour_logprobs == [0.0, 0.0, float(np.float32(-1e-3))]
    assert edge.created_at == samples[-1].created_at and edge.created_at.utcoffset() == timedelta(0)


def test_floats_are_stored_as_float32(tmp_path):
    s = replace(make_sample(0), reward=0.1, advantage=1 / 3)
    with FileSpool(tmp_path, writer=True) as spool:
        spool.write([s])
    (got,) = FileSpool(tmp_path).claim_next(0).samples()
    assert got.reward == float(np.float32(0.1)) != 0.1
    assert got.advantage == float(np.float32(1 / 3))


def test_numpy_inputs_are_accepted(tmp_path):
    s = make_sample(3, 50)
    s_np = replace(
        s,
        token_ids=np.asarray(s.token_ids, dtype=np.int64),
        loss_mask=np.asarray(s.loss_mask, dtype=np.int8),
        behaviour_logprobs=np.asarray(s.behaviour_logprobs, dtype=np.float32),
        advantage=np.float32(s.advantage),
        policy_version=np.int64(s.policy_version),
    )
    with FileSpool(tmp_path, writer=True) as spool:
        spool.write([s_np])
    assert FileSpool(tmp_path).claim_next(0).samples() == [s]


# -- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "change", "needle"),
    [
        ("sample_id", {"sample_id": ""}, "non-empty"),
        ("role", {"role": "critic"}, "one of"),
        ("policy_version", {"policy_version": -1}, ">= 0"),
        ("policy_version", {"policy_version": 1.5}, "int"),
        ("token_ids", {"token_ids": []}, "non-empty"),
        ("token_ids", {"token_ids": [1.5] * 12}, "integers"),
        ("token_ids", {"token_ids": [2**31] + [1] * 11}, "ids must lie"),
        ("token_ids", {"token_ids": [-1] + [1] * 11}, "ids must lie"),
        ("loss_mask", {"loss_mask": [1] * 11}, "length 11"),
        ("loss_mask", {"loss_mask": [2] + [1] * 11}, "0 or 1"),
        ("loss_mask", {"loss_mask": [0] * 12, "behaviour_logprobs": [0.0] * 12}, "no sampled"),
        ("behaviour_logprobs", {"behaviour_logprobs": [-0.5] * 13}, "length 13"),
        ("behaviour_logprobs", {"loss_mask": [1] * 12, "behaviour_logprobs": [0.25] * 12}, "<= 0"),
        ("behaviour_logprobs", {"loss_mask": [1] * 12, "behaviour_logprobs": [float("nan")] * 12}, "finite"),
        ("behaviour_logprobs", {"loss_mask": [0] + [1] * 11, "behaviour_logprobs": [-0.5] * 12}, "0 where"),
        ("advantage", {"advantage": float("inf")}, "finite"),
        ("reward", {"reward": "1"}, "number"),
        ("reward", {"reward": 1e39}, "finite in float32"),
        ("hinted", {"hinted": 1}, "bool"),
        ("created_at", {"created_at": datetime(2025, 1, 1)}, "timezone"),
        ("env_id", {"env_id": None}, "string"),
    ],
)
def test_validation_names_sample_and_field(tmp_path, field, change, needle):
    change = dict(change)
    bad = replace(make_sample(0), sample_id=change.pop("sample_id", "s-bad"), **change)
    with pytest.raises(SampleError) as info:
        bad.validate()
    assert info.value.field == field
    assert f"field {field!r}" in str(info.value) and needle in str(info.value)
    if bad.sample_id:
        assert "'s-bad'" in str(info.value)
    with FileSpool(tmp_path, writer=True) as spool:
        with pytest.raises(SampleError):
            spool.write([make_sample(1), bad])
        assert spool.last_seq() == 0
    assert batch_files(tmp_path) == []


def test_batch_rejects_duplicate_ids_and_empty_batches(tmp_path):
    with FileSpool(tmp_path, writer=True) as spool:
        with pytest.raises(SampleError, match="appears twice") as info:
            spool.write([make_sample(1), make_sample(1)])
        assert info.value.field == "sample_id" and info.value.sample_id == "s0-1"
        with pytest.raises(SpoolError, match="at least one sample"):
            spool.write([])
        assert spool.write([make_sample(1)]) == 1


# -- sequence numbers, ordering, ack and gc -------------------------------------------------


def test_sequence_numbers_survive_restarts_and_gc(tmp_path):
    with FileSpool(tmp_path, writer=True) as spool:
        assert [spool.write([make_sample(i)]) for i in range(3)] == [1, 2, 3]
    with FileSpool(tmp_path, writer=True) as spool:
        assert spool.write([make_sample(9)]) == 4
    reader = FileSpool(tmp_path)
    assert reader.last_seq() == 4
    reader.ack(4)
    assert reader.gc() == 4
    assert batch_files(tmp_path) == []
    with FileSpool(tmp_path, writer=True) as spool:  # numbers of collected batches stay used
        assert spool.last_seq() == 4
        assert spool.write([make_sample(0)]) == 5
    # Even without the writer's state file the ack mark keeps collected numbers used.
    reader.ack(5)
    reader.gc()
    (tmp_path / "state.json").unlink()
    with FileSpool(tmp_path, writer=True) as spool:
        assert spool.write([make_sample(0)]) == 6


def test_claims_in_order_and_never_skips_a_gap(tmp_path):
    with FileSpool(tmp_path, writer=True) as spool:
        for i in range(3):
            spool.write([make_sample(i, seed=i)])
    reader = FileSpool(tmp_path)
    with capture_logs() as logs:
        assert reader.claim_next(3) is None  # not written yet: quiet
    assert logs == []

    (tmp_path / "batch-000000000002.arrow").unlink()  # lost (e.g. an operator deleted it)
    assert reader.claim_next(0).seq == 1
    with capture_logs() as logs:
        assert reader.claim_next(1) is None
        assert reader.claim_next(1) is None  # polled again: logged once
    gaps = [e for e in logs if e["event"].startswith("spool gap")]
    assert len(gaps) == 1 and gaps[0]["missing_seq"] == 2 and gaps[0]["next_present"] == 3
    assert gaps[0]["log_level"] == "warning"
    batch3 = reader.claim_next(2)
    assert batch3.seq == 3 and batch3.samples()[0].sample_id == "s2-2"


def test_ack_and_gc_rules(tmp_path):
    with FileSpool(tmp_path, writer=True) as spool:
        for i in range(4):
            spool.write([make_sample(i)])
        with pytest.raises(SpoolError, match="cannot ack 5"):
            spool.ack(5)
        with pytest.raises(SpoolError, match="unacknowledged"):
            spool.gc(1)
        spool.ack(2)
        spool.ack(1)  # an older mark never moves it back
        assert spool.acked_seq() == 2
        with pytest.raises(SpoolError, match="unacknowledged"):
            spool.gc(3)
        assert spool.gc(1) == 1
        assert batch_files(tmp_path) == [f"batch-{s:012d}.arrow" for s in (2, 3, 4)]
        assert spool.gc() == 1
        assert spool.gc() == 0
    reader = FileSpool(tmp_path)
    with pytest.raises(SpoolError, match="behind its own acknowledgement"):
        reader.claim_next(0)
    assert reader.claim_next(2).seq == 3


def test_reader_cannot_write_and_wait_next_times_out(tmp_path):
    reader = FileSpool(tmp_path)
    with pytest.raises(SpoolError, match="opened for reading"):
        reader.write([make_sample(0)])
    assert reader.wait_next(0, timeout_s=0) is None
    with FileSpool(tmp_path, writer=True) as spool:
        spool.write([make_sample(0)])
    assert reader.wait_next(0, timeout_s=0).seq == 1


def test_schema_version_mismatch_is_an_error(tmp_path):
    table = pa.table({"seq": pa.array([1], pa.int64())}).replace_schema_metadata(
        {"schema_version": "99"}
    )
    with pa.ipc.new_file(tmp_path / "batch-000000000001.arrow", table.schema) as w:
        w.write_table(table)
    with pytest.raises(SpoolError, match=f"schema_version 99, this reader knows {SCHEMA_VERSION}"):
        FileSpool(tmp_path).claim_next(0)


# -- one writer -----------------------------------------------------------------------------


def test_second_writer_in_this_process_is_refused(tmp_path):
    first = FileSpool(tmp_path, writer=True)
    with pytest.raises(SpoolLockedError) as info:
        FileSpool(tmp_path, writer=True)
    assert f"pid {os.getpid()}" in str(info.value) and str(tmp_path) in str(info.value)
    FileSpool(tmp_path).claim_next(0)  # readers are not writers: allowed
    first.close()
    with FileSpool(tmp_path, writer=True) as second:
        assert second.write([make_sample(0)]) == 1


def _python(code: str, *args: str, **kw) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # structlog's default prints to stdout, which is our line protocol with the child
    prelude = "from spade_async.core.logs import configure_logging\nconfigure_logging(json=True)\n"
    return subprocess.Popen(
        [sys.executable, "-c", prelude + textwrap.dedent(code), *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO, **kw,
    )


def _read_line(proc: subprocess.Popen[str], guard_s: float = 120) -> str:
    """The child's next stdout line; the guard only stops a broken test from hanging."""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(guard_s):
            proc.kill()
            pytest.fail("child process said nothing")
    return proc.stdout.readline().strip()


def test_second_writer_in_another_process_is_refused(tmp_path):
    code = """
        import sys
        from spade_async.core.spool.files import FileSpool
        spool = FileSpool(sys.argv[1], writer=True)
        print("locked", flush=True)
        sys.stdin.read()
    """
    with _python(code, str(tmp_path)) as holder:
        try:
            assert _read_line(holder) == "locked"
            with pytest.raises(SpoolLockedError, match=f"already has a writer \\(pid {holder.pid} "):
                FileSpool(tmp_path, writer=True)
        finally:
            holder.stdin.close()
    assert holder.returncode == 0
    with FileSpool(tmp_path, writer=True) as spool:  # the lock died with its holder
        assert spool.write([make_sample(0)]) == 1


# -- crash safety -----------------------------------------------------------------------------

_CRASHING_WRITER = """
import os, sys, time
import numpy as np
from spade_async.core.spool import files as sp

directory, point = sys.argv[1], sys.argv[2]
writer = sp.FileSpool(directory, writer=True)
writer.write([sp.Sample("small", "agent", "e", 0, [1, 2], [0, 1], [0.0, -1.0], 0.0, 0.0)])

def stall():
    print("stalled", flush=True)
    time.sleep(3600)

if point == "mid-write":
    real_open = open
    class StallingFile:
        def __init__(self, f):
            self._f, self.written = f, 0
        def write(self, data):
            if self.written > 2_000_000:
                self._f.flush()  # the torn prefix is on disk when the kill comes
                stall()
            self.written += len(data)
            return self._f.write(data)
        def __getattr__(self, name):
            return getattr(self._f, name)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            self._f.close()
    sp.open = lambda *a, **k: StallingFile(real_open(*a, **k))
elif point == "before-rename":
    sp.os.fsync = lambda fd: stall()
elif point == "after-rename":
    sp._fsync_dir = lambda path: stall()

n = 16384
rng = np.random.default_rng(0)
big = [
    sp.Sample(f"big-{i}", "agent", "e", 1, rng.integers(0, 50000, n), np.ones(n, np.int8),
              -rng.random(n, dtype=np.float32), 1.0, 1.0)
    for i in range(48)
]
writer.write(big)
print("finished", flush=True)
"""


@pytest.mark.parametrize("point", ["mid-write", "before-rename", "after-rename"])
def test_kill_9_during_a_large_write_leaves_no_torn_batch(tmp_path, point):
    with _python(_CRASHING_WRITER, str(tmp_path), point) as child:
        try:
            assert _read_line(child) == "stalled"
        finally:
            child.send_signal(signal.SIGKILL)
    assert child.returncode == -signal.SIGKILL

    torn = tmp_path / ".batch-000000000002.tmp"
    reader = FileSpool(tmp_path)
    assert reader.claim_next(0).samples()[0].sample_id == "small"
    if point == "after-rename":  # renamed, so complete and visible; the state file lags
        assert not torn.exists()
        batch = reader.claim_next(1)
        assert len(batch) == 48 and batch.num_tokens == 48 * 16384
        expected_next = 3
    else:
        assert torn.stat().st_size > 0
        if point == "mid-write":
            with pa.OSFile(str(torn)) as f, pytest.raises(pa.ArrowInvalid):
                pa.ipc.open_file(f).read_all()
        assert reader.claim_next(1) is None
        assert reader.last_seq() == 1
        expected_next = 2

    with FileSpool(tmp_path, writer=True) as spool:
        assert not torn.exists()  # cleaned up by the next writer
        assert spool.last_seq() == expected_next - 1
        assert spool.write([make_sample(7)]) == expected_next
    assert reader.claim_next(expected_next - 1).samples() == [make_sample(7)]
    assert batch_files(tmp_path) == [f"batch-{s:012d}.arrow" for s in range(1, expected_next + 1)]


def test_reader_in_this_process_sees_only_whole_batches_of_a_live_writer(tmp_path):
    n_batches = 30
    code = """
        import sys
        from tests.test_spool import make_sample
        from spade_async.core.spool.files import FileSpool
        with FileSpool(sys.argv[1], writer=True) as spool:
            for b in range(1, int(sys.argv[2]) + 1):
                spool.write([make_sample(i, 64 * b, seed=b) for i in range(b)])
    """
    reader = FileSpool(tmp_path)
    with _python(code, str(tmp_path), str(n_batches)) as writer:
        writer.stdin.close()
        for seq in range(1, n_batches + 1):
            batch = reader.wait_next(seq - 1, timeout_s=120, poll_interval_s=0.01)
            assert batch is not None, f"batch {seq} never arrived"
            assert batch.seq == seq and len(batch) == seq
            assert batch.samples() == [make_sample(i, 64 * seq, seed=seq) for i in range(seq)]
    assert writer.returncode == 0


def test_torn_temp_files_are_ignored_by_readers_and_removed_by_the_writer(tmp_path):
    (tmp_path / ".batch-000000000001.tmp").write_bytes(b"ARROW1\x00\x00 half a batch")
    reader = FileSpool(tmp_path)
    assert reader.claim_next(0) is None and reader.last_seq() == 0
    with FileSpool(tmp_path, writer=True) as spool:
        assert batch_files(tmp_path) == []
        assert spool.write([make_sample(0)]) == 1
    assert reader.claim_next(0).samples() == [make_sample(0)]


# -- a shared filesystem ----------------------------------------------------------------------


def _later(seconds: float, fn) -> None:
    import threading

    t = threading.Timer(seconds, fn)
    t.daemon = True
    t.start()


def test_reads_on_a_shared_filesystem_ride_out_partial_views_and_stale_handles(tmp_path,
                                                                               monkeypatch):
    """Another host's reader (a trainer rank on NFS) may see a batch before all its pages, a mark
    mid-replace, or a stale handle: each read is tried again with backoff, and only what stays
    unreadable fails, by name."""
    import errno

    from spade_async.core.spool import files

    with FileSpool(tmp_path / "w", writer=True) as w:
        w.write([make_sample(i) for i in range(40)])
    whole = (tmp_path / "w" / "batch-000000000001.arrow").read_bytes()
    d = tmp_path / "shared"
    d.mkdir()
    path = d / "batch-000000000001.arrow"
    path.write_bytes(whole[: len(whole) // 2])           # the first half of its pages, for now
    _later(0.15, lambda: path.write_bytes(whole))
    (d / "acked.json").write_text('{"acked_se')            # a torn view of a replaced mark
    _later(0.15, lambda: (d / "acked.json").write_text('{"acked_seq": 0}'))
    reader = FileSpool(d)
    batch = reader.claim_next(0)
    assert batch is not None and len(batch.samples()) == 40
    assert reader.acked_seq() == 0

    # A stale handle twice, then the file: read; a permission error is not retried.
    calls = {"n": 0}
    real = files.pa.OSFile

    def flaky(p, mode="rb"):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise OSError(errno.ESTALE, "Stale file handle", p)
        return real(p, mode)

    monkeypatch.setattr(files.pa, "OSFile", flaky)
    assert reader.claim_next(0).seq == 1 and calls["n"] == 3

    def denied(p, mode="rb"):
        calls["n"] += 1
        raise PermissionError(errno.EACCES, "Permission denied", p)

    calls["n"] = 0
    monkeypatch.setattr(files.pa, "OSFile", denied)
    with pytest.raises(SpoolError, match="not a readable batch: .*Permission denied"):
        reader.claim_next(0)
    assert calls["n"] == 1
    monkeypatch.setattr(files.pa, "OSFile", real)

    # Still torn after every try: an error naming the file.
    path.write_bytes(whole[:100])
    with pytest.raises(SpoolError, match="batch-000000000001.arrow: not a readable batch"):
        reader.claim_next(0)
    (d / "acked.json").write_text("{")
    with pytest.raises(SpoolError, match="acked.json: unreadable"):
        reader.acked_seq()
