"""Slot uids claimed per sandbox, host-wide: two sandboxes on one host (two daemons, an
experiment's two arms, an eval or a CLI check beside the daemon) never run environments under
the same uid, so one's environment can never signal, trace or count against the other's.

A claim is one `flock` per uid on a root-only lock file; the kernel drops it when its holder's
process dies, so a crashed daemon leaves nothing to clean up. This module never starts a process.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from spade_async.sandbox.isolation import SandboxUnavailable

# /run is root's and cleared at boot; bwrap's and unshare's private roots never show it.
LOCK_DIR = Path("/run/spade-sandbox-uids")
MAX_BLOCKS = 256  # blocks of `count` uids tried above `base`, in order
UID_LIMIT = 1 << 31  # slot uids stay below it
NOBODY = 65534  # never a slot's uid: files of unmapped owners show as it


class UidBlock:
    """`count` consecutive uids held by this process until `release()` (or its death)."""

    def __init__(self, first: int, count: int, fds: list[int]) -> None:
        self.first, self.count, self._fds = first, count, fds

    @property
    def uids(self) -> range:
        return range(self.first, self.first + self.count)

    def release(self) -> None:
        while self._fds:
            os.close(self._fds.pop())  # closing the last descriptor drops its flock


def _try_block(lock_dir: Path, first: int, count: int) -> list[int] | None:
    fds: list[int] = []
    for uid in range(first, first + count):
        fd = os.open(lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            for held in fds:
                os.close(held)
            return None
        fds.append(fd)
    return fds


def claim_uids(base: int, count: int, lock_dir: Path = LOCK_DIR) -> UidBlock:
    """The first free block `base + k * count ...` (k = 0, 1, ...); SandboxUnavailable, naming
    the lock directory, when every block below `UID_LIMIT` is held or the locks cannot be made."""
    try:
        lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise SandboxUnavailable(f"cannot create the slot-uid lock directory {lock_dir}: "
                                 f"{exc}") from None
    for k in range(MAX_BLOCKS):
        first = base + k * count
        if first + count > UID_LIMIT:
            break
        if first <= NOBODY < first + count:
            continue
        try:
            fds = _try_block(lock_dir, first, count)
        except OSError as exc:
            raise SandboxUnavailable(f"cannot lock slot uids in {lock_dir}: {exc}") from None
        if fds is not None:
            return UidBlock(first, count, fds)
    raise SandboxUnavailable(
        f"no free block of {count} slot uids from sandbox.uid_base = {base}: every block up to "
        f"uid {min(base + MAX_BLOCKS * count, UID_LIMIT) - 1} is held by another sandbox on "
        f"this host (lock files in {lock_dir}); stop one, or set a higher sandbox.uid_base")
