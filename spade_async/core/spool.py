"""Regret batches and the spool: the process boundary between the daemon and the trainer (DESIGN §8).

The daemon writes each batch of training samples (both roles) as one Arrow IPC file with a
monotonically increasing sequence number; the trainer, another process, reads them strictly in
order and acknowledges what its checkpoint holds, which lets old files be collected.

What it must never do: expose a partial batch (files appear by rename only, after fsync), skip or
reuse a sequence number (a missing batch stops the reader; numbers survive restarts and gc), or
let two writers share a directory (an flock on `writer.lock`). It imports nothing from the daemon,
so the trainer may import it for the schema.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spade_async.core.io import atomic_write_json
from spade_async.core.io import fsync_dir as _fsync_dir  # a module name the crash tests patch
from spade_async.core.logs import get_logger

log = get_logger("spool")

SCHEMA_VERSION = 2
ROLES = ("agent", "designer")
Role = Literal["agent", "designer"]
MOVES = ("", "write", "edit")  # a designer sample's move; "" for the agent

BATCH_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("role", pa.string(), nullable=False),
        pa.field("env_id", pa.string(), nullable=False),
        pa.field("policy_version", pa.int64(), nullable=False),
        pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
        pa.field("behaviour_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("advantage", pa.float32(), nullable=False),
        pa.field("reward", pa.float32(), nullable=False),
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("hinted", pa.bool_(), nullable=False),
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
        # v2: the designer's move, and for a sample decoded under a choice constraint the
        # token ids the constraint allowed at each sampled (mask 1) token, in order; null for
        # free decoding (see spade_async/inference/constrained.py).
        pa.field("move", pa.string(), nullable=False),
        pa.field("allowed_tokens", pa.list_(pa.list_(pa.int32())), nullable=True),
    ],
    metadata={"schema_version": str(SCHEMA_VERSION)},
)

BATCH_V1_SCHEMA = pa.schema(list(BATCH_SCHEMA)[:-2], metadata={"schema_version": "1"})

_ROWS_PER_RECORD_BATCH = 256
_INT32_MAX = 2**31 - 1


class SpoolError(RuntimeError):
    """The spool cannot do what was asked; the message names the directory or batch."""


class SpoolLockedError(SpoolError):
    """Another writer holds the spool directory."""


class SampleError(ValueError):
    """A sample that breaks the batch contract; names the sample and the field."""

    def __init__(self, sample_id: str, field: str, problem: str) -> None:
        super().__init__(f"sample {sample_id!r}: field {field!r}: {problem}")
        self.sample_id = sample_id
        self.field = field


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Sample:
    """One training sample: a whole sequence with the model's own tokens marked in `loss_mask`.

    `behaviour_logprobs[i]` is the log-prob the server reported for token i when it was sampled
    (mask 1), and 0 where the mask is 0 (prompt, environment observations, tool results).
    Floats are stored as float32: a value reads back as `float(np.float32(value))`.
    """

    sample_id: str
    role: Role
    env_id: str
    policy_version: int
    token_ids: Sequence[int]
    loss_mask: Sequence[int]
    behaviour_logprobs: Sequence[float]
    advantage: float
    reward: float
    episode_id: str = ""
    hinted: bool = False
    created_at: datetime = field(default_factory=_utcnow)
    move: str = ""
    allowed_tokens: Sequence[Sequence[int]] | None = None

    def validate(self) -> None:
        """Raise SampleError naming the first field that breaks the contract."""
        _checked_arrays(self)


def _checked_arrays(s: Sample) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate `s`; return its token ids, mask and log-probs as int32, int8 and float32."""
    sid = s.sample_id if isinstance(s.sample_id, str) else repr(s.sample_id)

    def bad(field: str, problem: str) -> SampleError:
        return SampleError(sid, field, problem)

    if not isinstance(s.sample_id, str) or not s.sample_id:
        raise bad("sample_id", "must be a non-empty string")
    if s.role not in ROLES:
        raise bad("role", f"must be one of {ROLES}, got {s.role!r}")
    for name in ("env_id", "episode_id"):
        if not isinstance(getattr(s, name), str):
            raise bad(name, "must be a string")
    if isinstance(s.policy_version, bool) or not isinstance(s.policy_version, int | np.integer):
        raise bad("policy_version", f"must be an int, got {type(s.policy_version).__name__}")
    if s.policy_version < 0:
        raise bad("policy_version", f"must be >= 0, got {s.policy_version}")
    if not isinstance(s.hinted, bool | np.bool_):
        raise bad("hinted", "must be a bool")
    if not isinstance(s.created_at, datetime) or s.created_at.utcoffset() is None:
        raise bad("created_at", "must be a timezone-aware datetime")
    for name in ("advantage", "reward"):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
            raise bad(name, f"must be a number, got {type(value).__name__}")
        with np.errstate(over="ignore"):  # overflow is what we test for
            as_f32 = float(np.float32(value))
        if not math.isfinite(as_f32):
            raise bad(name, f"must be finite in float32, got {value}")

    try:
        tokens = np.asarray(s.token_ids)
        mask = np.asarray(s.loss_mask)
        logprobs = np.asarray(s.behaviour_logprobs, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise bad("token_ids/loss_mask/behaviour_logprobs", f"not a flat numeric list: {exc}") from None
    if tokens.ndim != 1 or len(tokens) == 0:
        raise bad("token_ids", "must be a non-empty flat list")
    if tokens.dtype.kind not in "iu":
        raise bad("token_ids", f"must hold integers, got {tokens.dtype}")
    if tokens.min() < 0 or tokens.max() > _INT32_MAX:
        raise bad("token_ids", f"ids must lie in [0, {_INT32_MAX}]")
    for name, arr in (("loss_mask", mask), ("behaviour_logprobs", logprobs)):
        if arr.ndim != 1 or len(arr) != len(tokens):
            raise bad(name, f"has length {arr.size}, token_ids has {len(tokens)}")
    if mask.dtype.kind not in "iub":
        raise bad("loss_mask", f"must hold 0/1 integers, got {mask.dtype}")
    off = ~np.isin(mask, (0, 1))
    if off.any():
        i = int(np.argmax(off))
        raise bad("loss_mask", f"values must be 0 or 1, got {mask[i]} at position {i}")
    sampled = mask == 1
    if not sampled.any():
        raise bad("loss_mask", "marks no sampled token (nothing to train on)")
    with np.errstate(over="ignore"):
        lp32 = logprobs.astype(np.float32)
    wrong = sampled & ~(np.isfinite(lp32) & (lp32 <= 0))
    if wrong.any():
        i = int(np.argmax(wrong))
        raise bad("behaviour_logprobs", f"must be finite and <= 0 where loss_mask is 1, "
                  f"got {logprobs[i]} at position {i}")
    nonzero = ~sampled & (lp32 != 0)
    if nonzero.any():
        i = int(np.argmax(nonzero))
        raise bad("behaviour_logprobs", f"must be 0 where loss_mask is 0, got {logprobs[i]} "
                  f"at position {i}")
    if s.move not in MOVES:
        raise bad("move", f"must be one of {MOVES}, got {s.move!r}")
    if s.allowed_tokens is not None:
        n_sampled = int(sampled.sum())
        if len(s.allowed_tokens) != n_sampled:
            raise bad("allowed_tokens", f"has {len(s.allowed_tokens)} sets for {n_sampled} "
                      "sampled tokens")
        for k, (pos, allowed) in enumerate(zip(np.flatnonzero(sampled), s.allowed_tokens,
                                               strict=True)):
            if int(tokens[pos]) not in allowed:
                raise bad("allowed_tokens", f"set {k} does not hold the sampled token "
                          f"{int(tokens[pos])} at position {int(pos)}")
    return tokens.astype(np.int32), mask.astype(np.int8), lp32


def _list_array(parts: list[np.ndarray], dtype: pa.DataType) -> pa.ListArray:
    lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = pa.array(np.concatenate(parts), type=dtype)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32), pa.int32()), values)


def samples_to_table(seq: int, samples: Sequence[Sample]) -> pa.Table:
    """Validate every sample and build the batch table (the schema's metadata included)."""
    if not samples:
        raise SpoolError("a batch needs at least one sample")
    seen: set[str] = set()
    arrays = []
    for s in samples:
        arrays.append(_checked_arrays(s))
        if s.sample_id in seen:
            raise SampleError(s.sample_id, "sample_id", "appears twice in one batch")
        seen.add(s.sample_id)
    if sum(len(a[0]) for a in arrays) > _INT32_MAX:
        raise SpoolError(f"batch {seq}: more than {_INT32_MAX} tokens; split it")
    n = len(samples)
    columns = [
        pa.array(np.full(n, seq, dtype=np.int64)),
        pa.array([s.sample_id for s in samples], pa.string()),
        pa.array([s.role for s in samples], pa.string()),
        pa.array([s.env_id for s in samples], pa.string()),
        pa.array([int(s.policy_version) for s in samples], pa.int64()),
        _list_array([a[0] for a in arrays], pa.int32()),
        _list_array([a[1] for a in arrays], pa.int8()),
        _list_array([a[2] for a in arrays], pa.float32()),
        pa.array(np.array([s.advantage for s in samples], dtype=np.float32)),
        pa.array(np.array([s.reward for s in samples], dtype=np.float32)),
        pa.array([s.episode_id for s in samples], pa.string()),
        pa.array([bool(s.hinted) for s in samples], pa.bool_()),
        pa.array([s.created_at for s in samples], pa.timestamp("us", tz="UTC")),
        pa.array([s.move for s in samples], pa.string()),
        pa.array([None if s.allowed_tokens is None else [list(map(int, a))
                                                          for a in s.allowed_tokens]
                  for s in samples], pa.list_(pa.list_(pa.int32()))),
    ]
    return pa.Table.from_arrays(columns, schema=BATCH_SCHEMA)


def _upgrade_v1(table: pa.Table) -> pa.Table:
    """A v1 batch (written before moves and constraints existed) read as v2: every sample
    free-decoded, designer samples written by the write move."""
    n = table.num_rows
    moves = pa.array(["write" if r == "designer" else "" for r in table["role"].to_pylist()],
                     pa.string())
    table = table.append_column(BATCH_SCHEMA.field("move"), moves)
    table = table.append_column(BATCH_SCHEMA.field("allowed_tokens"),
                                pa.nulls(n, pa.list_(pa.list_(pa.int32()))))
    return table.replace_schema_metadata(BATCH_SCHEMA.metadata)


@dataclass(frozen=True)
class Batch:
    """One claimed batch: `table` for columnar use (the trainer), `samples()` for Python use."""

    seq: int
    table: pa.Table
    schema_version: int

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def num_tokens(self) -> int:
        return int(pc.sum(pc.list_value_length(self.table["token_ids"])).as_py())

    def samples(self) -> list[Sample]:
        return [
            Sample(**{k: v for k, v in row.items() if k != "seq"})
            for row in self.table.to_pylist()
        ]


class BatchSpool(ABC):
    """Ordered, durable hand-off of batches from one writer to readers in other processes.

    Sequence numbers start at 1 and never repeat. A reader keeps its own cursor (the trainer
    stores the last consumed seq in its checkpoint) and asks for the batch after it; `ack(seq)`
    says every batch up to seq is safely consumed, and only acknowledged batches may be
    collected by `gc`.
    """

    @abstractmethod
    def write(self, samples: Iterable[Sample]) -> int:
        """Validate, persist atomically, return the batch's sequence number."""

    @abstractmethod
    def claim_next(self, after_seq: int) -> Batch | None:
        """The batch numbered after_seq + 1, or None while it is not there (never a later one)."""

    @abstractmethod
    def ack(self, seq: int) -> None:
        """Every batch up to and including seq is consumed; it may be collected."""

    @abstractmethod
    def gc(self, upto_seq: int | None = None) -> int:
        """Delete acknowledged batches up to upto_seq (default: the ack mark); return how many."""

    @abstractmethod
    def last_seq(self) -> int:
        """The highest sequence number ever written (0 before the first batch)."""

    @abstractmethod
    def acked_seq(self) -> int:
        """The acknowledgement mark (0 before the first ack)."""

    @abstractmethod
    def mark_taken(self, seq: int) -> None:
        """The reader has taken every batch up to seq into training. Progress only, for the
        writer's back-pressure: not durable (a restarted reader takes from its checkpoint)."""

    @abstractmethod
    def taken_seq(self) -> int:
        """How far the reader has got: the later of the progress and acknowledgement marks."""

    def wait_next(
        self, after_seq: int, *, timeout_s: float, poll_interval_s: float = 0.2
    ) -> Batch | None:
        """`claim_next`, polling until a batch arrives or timeout_s passes (for sync readers)."""
        deadline = time.monotonic() + timeout_s
        while True:
            batch = self.claim_next(after_seq)
            remaining = deadline - time.monotonic()
            if batch is not None or remaining <= 0:
                return batch
            time.sleep(min(poll_interval_s, remaining))

    def close(self) -> None:  # noqa: B027 - optional hook; the base holds nothing
        """Release what the spool holds (a writer's lock)."""

    def __enter__(self) -> BatchSpool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_BATCH_NAME = re.compile(r"^batch-(\d{12})\.arrow$")
_STATE_FILE = "state.json"
_ACK_FILE = "acked.json"
_TAKEN_FILE = "taken.json"
_LOCK_FILE = "writer.lock"


def _batch_name(seq: int) -> str:
    return f"batch-{seq:012d}.arrow"


class FileSpool(BatchSpool):
    """A directory of `batch-{seq:012d}.arrow` files (Arrow IPC file format).

    Files in the directory:
      batch-*.arrow      complete batches; they appear only by rename after fsync
      .batch-*.tmp       a batch being written (or torn by a crash; the next writer deletes it)
      state.json         the writer's last sequence number, so collected numbers are not reused
      acked.json         the reader's acknowledgement mark
      writer.lock        flock'ed by the one writer; holds its pid

    `FileSpool(dir)` reads, acks and collects; `FileSpool(dir, writer=True)` also writes, and
    fails at once with SpoolLockedError if another writer (any process) holds the directory.
    """

    def __init__(self, directory: str | Path, *, writer: bool = False) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = None
        self._last_seq = 0
        self._gap_logged: int | None = None
        self._write_lock = threading.Lock()  # callers write from worker threads
        if writer:
            self._lock_fd = self._acquire_lock()
            try:
                self._recover()
            except BaseException:
                self.close()
                raise

    # -- writer -------------------------------------------------------------------------------

    def _acquire_lock(self) -> int:
        path = self.dir / _LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise SpoolLockedError(
                f"spool {self.dir} already has a writer (pid {holder} holds {path}); "
                "only one daemon may write a spool directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _recover(self) -> None:
        """Delete torn temp files; continue numbering after everything ever written."""
        for tmp in self.dir.glob(".batch-*.tmp"):
            log.warning("spool: removing a torn batch left by a crash", path=str(tmp))
            tmp.unlink()
        self._last_seq = self._derived_last_seq()
        if self._read_json(_STATE_FILE).get("last_seq", 0) != self._last_seq:
            self._write_state()
        log.info("spool writer ready", dir=str(self.dir), last_seq=self._last_seq)

    def _write_state(self) -> None:
        atomic_write_json(
            self.dir / _STATE_FILE, {"schema_version": SCHEMA_VERSION, "last_seq": self._last_seq}
        )

    def write(self, samples: Iterable[Sample]) -> int:
        with self._write_lock:
            return self._write(samples)

    def _write(self, samples: Iterable[Sample]) -> int:
        if self._lock_fd is None:
            raise SpoolError(f"spool {self.dir} was opened for reading; use writer=True to write")
        seq = self._last_seq + 1
        table = samples_to_table(seq, list(samples))
        final = self.dir / _batch_name(seq)
        if final.exists():
            raise SpoolError(f"{final} exists although the writer's last seq is {seq - 1}")
        tmp = self.dir / f".{_batch_name(seq).removesuffix('.arrow')}.tmp"
        with open(tmp, "wb") as f:
            with pa.ipc.new_file(f, BATCH_SCHEMA) as ipc:
                for record_batch in table.to_batches(max_chunksize=_ROWS_PER_RECORD_BATCH):
                    ipc.write_batch(record_batch)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.dir)
        self._last_seq = seq
        self._write_state()
        log.debug("spool batch written", seq=seq, samples=table.num_rows)
        return seq

    def close(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- shared -------------------------------------------------------------------------------

    def _read_json(self, name: str) -> dict:
        path = self.dir / name
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError as exc:
            raise SpoolError(f"{path}: unreadable: {exc}") from None
        if not isinstance(data, dict):
            raise SpoolError(f"{path}: expected a JSON object")
        return data

    def _visible_seqs(self) -> list[int]:
        seqs = []
        for entry in os.scandir(self.dir):
            m = _BATCH_NAME.match(entry.name)
            if m:
                seqs.append(int(m.group(1)))
        return sorted(seqs)

    def _derived_last_seq(self) -> int:
        seqs = self._visible_seqs()
        return max(
            seqs[-1] if seqs else 0,
            int(self._read_json(_STATE_FILE).get("last_seq", 0)),
            self.acked_seq(),
        )

    def last_seq(self) -> int:
        return self._last_seq if self._lock_fd is not None else self._derived_last_seq()

    def acked_seq(self) -> int:
        return int(self._read_json(_ACK_FILE).get("acked_seq", 0))

    def claim_next(self, after_seq: int) -> Batch | None:
        if after_seq < 0:
            raise SpoolError(f"after_seq must be >= 0, got {after_seq}")
        seq = after_seq + 1
        path = self.dir / _batch_name(seq)
        try:
            # Read into memory rather than map it: gc may unlink the file while the batch lives.
            source = pa.OSFile(str(path), "rb")
        except FileNotFoundError:
            self._missing(seq)
            return None
        try:
            table = pa.ipc.open_file(source).read_all()
        except (pa.ArrowInvalid, OSError) as exc:
            raise SpoolError(f"{path}: not a readable batch: {exc}") from None
        finally:
            source.close()
        version = self._check_schema(path, seq, table)
        if version == 1:
            table = _upgrade_v1(table)
        return Batch(seq=seq, table=table, schema_version=version)

    def _check_schema(self, path: Path, seq: int, table: pa.Table) -> int:
        meta = table.schema.metadata or {}
        version = meta.get(b"schema_version", b"?").decode()
        if version not in ("1", str(SCHEMA_VERSION)):
            raise SpoolError(
                f"{path}: batch schema_version {version}, this reader knows {SCHEMA_VERSION}"
                " (and reads 1)")
        expected = BATCH_V1_SCHEMA if version == "1" else BATCH_SCHEMA
        if not table.schema.equals(expected, check_metadata=False):
            raise SpoolError(f"{path}: columns differ from the batch schema v{version}")
        seqs = table["seq"]
        if len(seqs) and (pc.min(seqs).as_py(), pc.max(seqs).as_py()) != (seq, seq):
            raise SpoolError(f"{path}: rows carry another sequence number than {seq}")
        return int(version)

    def _missing(self, seq: int) -> None:
        """Batch seq is not there: not yet written (normal), collected, or lost (a gap)."""
        acked = self.acked_seq()
        if seq <= acked:
            raise SpoolError(
                f"spool {self.dir}: batch {seq} is acknowledged (acked up to {acked}) and may "
                "have been collected; the reader's cursor is behind its own acknowledgement"
            )
        later = [s for s in self._visible_seqs() if s > seq]
        committed = int(self._read_json(_STATE_FILE).get("last_seq", 0))
        if (later or committed >= seq) and self._gap_logged != seq:
            self._gap_logged = seq  # once per gap, not once per poll
            log.warning(
                "spool gap: waiting for a missing batch, not skipping it",
                dir=str(self.dir), missing_seq=seq, next_present=later[0] if later else None,
                writer_last_seq=committed,
            )

    def ack(self, seq: int) -> None:
        last = self.last_seq()
        if not 0 <= seq <= last:
            raise SpoolError(f"spool {self.dir}: cannot ack {seq}; batches run up to {last}")
        if seq <= self.acked_seq():
            return
        atomic_write_json(self.dir / _ACK_FILE, {"acked_seq": seq})

    def mark_taken(self, seq: int) -> None:
        atomic_write_json(self.dir / _TAKEN_FILE, {"taken_seq": int(seq)})

    def taken_seq(self) -> int:
        return max(int(self._read_json(_TAKEN_FILE).get("taken_seq", 0)), self.acked_seq())

    def gc(self, upto_seq: int | None = None) -> int:
        acked = self.acked_seq()
        upto = acked if upto_seq is None else upto_seq
        if upto > acked:
            raise SpoolError(
                f"spool {self.dir}: gc up to {upto} would delete unacknowledged batches "
                f"(acked up to {acked})"
            )
        removed = 0
        for seq in self._visible_seqs():
            if seq > upto:
                break
            try:
                (self.dir / _batch_name(seq)).unlink()
                removed += 1
            except FileNotFoundError:
                pass  # another collector got there first
        if removed:
            _fsync_dir(self.dir)
            log.debug("spool collected", dir=str(self.dir), upto_seq=upto, removed=removed)
        return removed
