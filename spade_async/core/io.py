"""Files written so that a reader sees the old content or the new, never half of it: a temp file
in the same directory, renamed over the target. `durable=True` adds the fsyncs (the file before
the rename, the directory after) that make the write survive a power cut, for the records a
crash must not lose (corpus cursor, spool marks, checkpoints, the policy version); status files
rewritten every few seconds skip them."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in directory `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_path(path: Path) -> Path:
    """The hidden temp name `path` is written under before its rename (`.name.tmp`)."""
    return path.with_name(f".{path.name}.tmp")


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "w", *, durable: bool = True) -> Iterator[IO[Any]]:
    """Write `path` through a temp file: renamed over it when the block ends without an error,
    deleted otherwise."""
    tmp = tmp_path(path)
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str, *, durable: bool = True) -> None:
    with atomic_open(path, durable=durable) as f:
        f.write(text)


def atomic_write_json(path: Path, obj: Any, *, durable: bool = True, **dump: Any) -> None:
    with atomic_open(path, durable=durable) as f:
        json.dump(obj, f, **dump)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """One JSON object line at the end of `path` (created if missing), written in one call."""
    line = json.dumps(record, ensure_ascii=False) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every whole JSON object line of `path` and of its rolled segments, oldest first (none
    if it is missing; a torn line is skipped). For files that fit in memory; stream with
    `core.rolling.iter_jsonl`."""
    from spade_async.core.rolling import iter_jsonl

    return list(iter_jsonl(path))
