"""Orphans of killed sandboxes: this process becomes their subreaper and reaps them at once."""

from __future__ import annotations

import os
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphans of a killed sandbox (its PID namespace's processes) are re-parented to us, not to
    the host's init, so we reap them at once: a slow init would otherwise leave zombies that
    still count against the slot's pids limit."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_sandbox_orphans(uids: range, keep: set[int]) -> int:
    """waitpid() our zombie children that ran under a slot uid and are not a Worker's own
    process (those belong to their Popen); returns how many such children are still alive.
    Never touches any other child of this process."""
    children: set[int] = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                children |= {int(p) for p in
                             Path(f"/proc/self/task/{tid}/children").read_text().split()}
            except OSError:
                pass
    except OSError:
        return 0
    alive = 0
    for pid in children - keep:
        try:
            fields = dict(line.split(":", 1) for line in
                          Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
            if int(fields["Uid"].split()[0]) not in uids:
                continue
            if fields["State"].strip().startswith("Z"):
                os.waitpid(pid, os.WNOHANG)
            else:
                alive += 1
        except (OSError, ValueError, KeyError):
            pass
    return alive
