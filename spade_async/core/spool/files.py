"""FileSpool: the spool as a directory of Arrow IPC files, with its state, acknowledgement and
progress marks and the one writer's lock."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from spade_async.core.io import atomic_write_json
from spade_async.core.io import fsync_dir as _fsync_dir  # a module name the crash tests patch
from spade_async.core.logs import get_logger
from spade_async.core.spool.base import BatchSpool
from spade_async.core.spool.batch import (
    BATCH_SCHEMA,
    BATCH_V1_SCHEMA,
    SCHEMA_VERSION,
    Batch,
    Sample,
    SpoolError,
    samples_to_table,
    upgrade_v1,
)

log = get_logger("spool")

_ROWS_PER_RECORD_BATCH = 256


class SpoolLockedError(SpoolError):
    """Another writer holds the spool directory."""


_BATCH_NAME = re.compile(r"^batch-(\d{12})\.arrow$")
_STATE_FILE = "state.json"
_ACK_FILE = "acked.json"
_TAKEN_FILE = "taken.json"
_LOCK_FILE = "writer.lock"


def _batch_name(seq: int) -> str:
    return f"batch-{seq:012d}.arrow"


# On a shared filesystem (NFS, EFS, Lustre: the multi-node trainer's ranks read the spool from
# other hosts) a read can fail for a moment and then succeed: a stale handle after another node
# replaced the file (ESTALE), an I/O error or timeout while the server is away (soft mounts),
# a view of a file whose pages have not all arrived. Such reads are tried again, with backoff,
# before a batch or a mark counts as unreadable: 6 tries over ~1.6 s.
TRANSIENT_ERRNOS = frozenset({errno.ESTALE, errno.EIO, errno.ETIMEDOUT, errno.EAGAIN})
READ_TRIES = 6
READ_BACKOFF_S = 0.05


class _Unreadable(Exception):
    """A read that may succeed when tried again; carries what the last try said."""


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS


def _retried(read, what: str):
    """`read()`, tried again while it raises _Unreadable or a transient OSError; the last
    error propagates (an _Unreadable as its cause)."""
    delay = READ_BACKOFF_S
    for attempt in range(READ_TRIES):
        try:
            return read()
        except (OSError, _Unreadable) as exc:
            if not (isinstance(exc, _Unreadable) or _transient(exc)):
                raise
            if attempt == READ_TRIES - 1:
                if isinstance(exc, _Unreadable) and exc.__cause__ is not None:
                    raise exc.__cause__ from None
                raise
            if attempt == 0:
                log.info("spool: read failed, trying again (shared filesystem?)", what=what,
                         error=f"{type(exc).__name__}: {exc}")
            time.sleep(delay)
            delay *= 2


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

        def read() -> dict:
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                return {}
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:  # replaced atomically: a torn view is a cache's
                raise _Unreadable(str(exc)) from exc

        try:
            data = _retried(read, str(path))
        except (json.JSONDecodeError, OSError) as exc:
            raise SpoolError(f"{path}: unreadable: {exc}") from None
        if not isinstance(data, dict):
            raise SpoolError(f"{path}: expected a JSON object")
        return data

    def _visible_seqs(self) -> list[int]:
        def scan() -> list[int]:
            seqs = []
            for entry in os.scandir(self.dir):
                m = _BATCH_NAME.match(entry.name)
                if m:
                    seqs.append(int(m.group(1)))
            return sorted(seqs)

        return _retried(scan, str(self.dir))

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

        def read() -> pa.Table | None:
            try:
                # Into memory rather than mapped: gc may unlink the file while the batch lives.
                source = pa.OSFile(str(path), "rb")
            except FileNotFoundError:
                return None
            try:
                return pa.ipc.open_file(source).read_all()
            except pa.ArrowInvalid as exc:  # complete by rename: a partial view is transient
                raise _Unreadable(str(exc)) from exc
            finally:
                source.close()

        try:
            table = _retried(read, str(path))
        except (pa.ArrowInvalid, OSError) as exc:
            raise SpoolError(f"{path}: not a readable batch: {exc}") from None
        if table is None:
            self._missing(seq)
            return None
        version = self._check_schema(path, seq, table)
        if version == 1:
            table = upgrade_v1(table)
        return Batch(seq=seq, table=table, schema_version=version)

    def batch_rows(self, seq: int) -> int | None:
        """How many samples batch `seq` holds (from the file's record batches, without reading
        its columns), or None when it is not there (not yet written, or collected)."""
        def read() -> int | None:
            try:
                with pa.memory_map(str(self.dir / _batch_name(seq)), "rb") as source:
                    reader = pa.ipc.open_file(source)
                    return sum(reader.get_batch(i).num_rows
                               for i in range(reader.num_record_batches))
            except FileNotFoundError:
                return None
            except pa.ArrowInvalid as exc:
                raise _Unreadable(str(exc)) from exc

        try:
            return _retried(read, str(self.dir / _batch_name(seq)))
        except (pa.ArrowInvalid, OSError) as exc:
            raise SpoolError(f"{self.dir / _batch_name(seq)}: not a readable batch: {exc}") \
                from None

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
