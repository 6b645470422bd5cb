"""JSONL records and logs under retention, for a run that lasts weeks.

`<dir>/<name>.jsonl` is the live segment a run appends to. Once it passes the retention's
`segment_mb` it is rolled: renamed (atomically, so a record is never in two places) into
`<dir>/<name>.rolled/<seq>-<UTC time>.jsonl`, then gzip-compressed there to `.jsonl.gz`, and the
rolled segments beyond `keep_mb` in all, or older than `keep_days`, are deleted oldest first.
A crash between the rename and the compression leaves a plain `.jsonl` segment, which readers
read as it is and the next roll compresses.

Readers stream the rolled segments, oldest first, then the live one, a line at a time
(`iter_jsonl`), so that memory stays bounded whatever the run's age; `read_jsonl` (core/io.py)
is that list for the small files. A torn last line (a writer killed mid-write) is skipped.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

_SEGMENT = re.compile(r"^(\d{8})-[0-9TZ]+\.jsonl(\.gz)?$")


@dataclass(frozen=True)
class Retention:
    """How much of one record stream is kept: the live segment rolls at `segment_bytes`, the
    rolled ones are kept to `keep_bytes` in all (None: no size limit) and `keep_s` of age
    (None: no age limit)."""

    segment_bytes: int = 64 << 20
    keep_bytes: int | None = 2 << 30
    keep_s: float | None = None

    @classmethod
    def of(cls, cfg: Any) -> Retention:
        """From a `[retention]` config section (RetentionConfig)."""
        return cls(segment_bytes=max(1, int(cfg.segment_mb * (1 << 20))),
                   keep_bytes=int(cfg.keep_mb * (1 << 20)) if cfg.keep_mb else None,
                   keep_s=cfg.keep_days * 86400.0 if cfg.keep_days else None)


def rolled_dir(path: Path) -> Path:
    """Where the rolled segments of `path` go: `<name>.jsonl` -> `<name>.rolled/`."""
    return path.with_name(path.name.removesuffix(".jsonl").removesuffix(".log") + ".rolled")


def rolled_segments(path: Path) -> list[Path]:
    """The rolled segments of `path`, oldest first (by their sequence number)."""
    folder = rolled_dir(path)
    try:
        names = [n for n in os.listdir(folder) if _SEGMENT.match(n)]
    except OSError:
        return []
    return [folder / n for n in sorted(names, key=lambda n: (n[:8], n.endswith(".gz")))]


def _open_segment(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def _records(f: IO[bytes]) -> Iterator[dict[str, Any]]:
    for raw in f:
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict):
            yield rec


def iter_jsonl(path: Path, *, rolled: bool = True) -> Iterator[dict[str, Any]]:
    """Every whole JSON object line of `path`'s rolled segments (oldest first) and of `path`
    itself, streamed. A segment deleted by retention while it is read ends early; a missing
    file is empty."""
    for seg in (rolled_segments(path) if rolled else []) + [path]:
        try:
            f = _open_segment(seg)
        except OSError:
            continue
        try:
            with f:
                yield from _records(f)
        except (OSError, EOFError, gzip.BadGzipFile):
            continue


def rolled_bytes(path: Path) -> int:
    """Bytes on disk of `path`'s rolled segments."""
    total = 0
    for seg in rolled_segments(path):
        try:
            total += seg.stat().st_size
        except OSError:
            pass
    return total


class RollingFile:
    """Appends to one file under a retention, thread-safe within the process (one writer
    process per file, as the run's logs have: the daemon, the trainer, the supervisor)."""

    def __init__(self, path: Path, retention: Retention | None = None) -> None:
        self.path = path
        self.retention = retention or Retention()
        self._lock = threading.Lock()
        try:
            self._size: int | None = path.stat().st_size
        except OSError:
            self._size = 0
        self._finish_rolls()

    def append_bytes(self, data: bytes) -> None:
        with self._lock:
            self._append_locked(data)

    def _append_locked(self, data: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(data)
        self._size = (self._size or 0) + len(data)
        if self._size >= self.retention.segment_bytes:
            self._roll()

    def append(self, record: dict[str, Any], *, time_field: str | None = None) -> None:
        """One JSON object line, written in one call. `time_field`: set to the time of the
        write, under the lock, so the lines stay in its order whichever thread writes them."""
        with self._lock:
            if time_field is not None:
                record = {**record, time_field: time.time()}
            self._append_locked((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))

    def roll(self) -> None:
        """Roll the live segment now (if it holds anything)."""
        with self._lock:
            self._roll()

    def _roll(self) -> None:
        try:
            if self.path.stat().st_size == 0:
                return
        except OSError:
            return
        folder = rolled_dir(self.path)
        folder.mkdir(parents=True, exist_ok=True)
        done = rolled_segments(self.path)
        seq = int(done[-1].name[:8]) + 1 if done else 1
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        os.replace(self.path, folder / f"{seq:08d}-{stamp}.jsonl")
        self._size = 0
        self._finish_rolls()

    def _finish_rolls(self) -> None:
        """Compress the plain rolled segments, then drop what the retention does not keep."""
        for seg in rolled_segments(self.path):
            if not seg.name.endswith(".gz"):
                _compress(seg)
        self.prune()

    def prune(self, now: float | None = None) -> list[Path]:
        """Delete the rolled segments past the retention, oldest first; the ones deleted."""
        keep_bytes, keep_s = self.retention.keep_bytes, self.retention.keep_s
        segs = rolled_segments(self.path)
        sizes = []
        for seg in segs:
            try:
                st = seg.stat()
                sizes.append((seg, st.st_size, st.st_mtime))
            except OSError:
                pass
        now = time.time() if now is None else now
        total = sum(s for _, s, _ in sizes)
        dropped = []
        for seg, size, mtime in sizes:
            too_big = keep_bytes is not None and total > keep_bytes
            too_old = keep_s is not None and now - mtime > keep_s
            if not (too_big or too_old):
                break
            seg.unlink(missing_ok=True)
            total -= size
            dropped.append(seg)
        return dropped


def _compress(seg: Path) -> None:
    """`<seg>` -> `<seg>.gz`, through a temp name; the plain file goes once the gz is whole."""
    gz = seg.with_name(seg.name + ".gz")
    tmp = seg.with_name("." + gz.name + ".tmp")
    try:
        with open(seg, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp, gz)
        seg.unlink(missing_ok=True)
    except OSError:
        tmp.unlink(missing_ok=True)


_files: dict[Path, RollingFile] = {}
_files_lock = threading.Lock()


def rolling(path: Path, retention: Retention | None = None) -> RollingFile:
    """The process's one RollingFile for `path` (its retention set by the first caller that
    names one)."""
    key = Path(os.path.abspath(path))
    with _files_lock:
        rf = _files.get(key)
        if rf is None or (retention is not None and rf.retention != retention):
            rf = _files[key] = RollingFile(path, retention)
        return rf


def tail_bytes(path: Path, nbytes: int) -> bytes:
    """The last `nbytes` of the stream (the live file, and before it the newest rolled segment
    when the live one is shorter: a roll does not blank a status line's recent figures). The
    first line may be cut; the caller skips what does not parse."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - nbytes))
            live = f.read()
    except OSError:
        live = b""
    if len(live) >= nbytes:
        return live
    segs = rolled_segments(path)
    if not segs:
        return live
    want, kept = nbytes - len(live), b""
    try:
        with _open_segment(segs[-1]) as f:
            while chunk := f.read(1 << 20):
                kept = (kept + chunk)[-want:]
    except (OSError, EOFError, gzip.BadGzipFile):
        pass
    return kept + live


class JsonlTail:
    """New whole lines of a record stream since the last read, across rolls: a segment rolled
    since the last read is read on from where the live file was left, then the live one."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.seq = path, 0, 0  # seq: the last rolled segment read

    def lines(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for seg in rolled_segments(self.path):
            seq = int(seg.name[:8])
            if seq <= self.seq:
                continue
            skip = self.offset if seq == self.seq + 1 else 0
            try:
                with _open_segment(seg) as f:
                    if skip:
                        f.seek(skip)
                    out.extend(_records(f))
            except (OSError, EOFError, gzip.BadGzipFile):
                pass
            self.seq, self.offset = seq, 0
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return out
        if len(chunk) == 0 and self.offset and self.path.stat().st_size < self.offset:
            self.offset = 0  # rolled and pruned between reads: start the new live file over
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        out.extend(_records(iter(chunk[:end].splitlines())))
        return out
