"""Per-slot cgroup limits (memory incl. the slot's tmpfs pages, and pids), where the host lets us.

cgroup v2 (unified hierarchy with the memory and pids controllers) or v1 (separate memory and
pids hierarchies). Workers enter their slot's groups through `enter_prefix` before dropping
privileges; `sweep` SIGKILLs whatever is left in a slot. Unavailable -> `None` from `create`,
and the sandbox reports the layer as off.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from spade_async.core.logs import get_logger

log = get_logger("sandbox")
ROOT = Path("/sys/fs/cgroup")

# Moves this shell into every cgroup.procs given before `--`, then execs the rest.
_ENTER = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"'


class SlotCgroups:
    def __init__(self, groups: list[Path], memory_bytes: int, pids: int) -> None:
        # `groups` are the per-run parents (one for v2; memory and pids for v1).
        self.groups, self.memory_bytes, self.pids = groups, memory_bytes, pids

    @staticmethod
    def remove_stale(prefix: str = "spade-sandbox-") -> None:
        """Groups left by a daemon that died (`spade-sandbox-<pid>-<n>` whose pid is gone)."""
        for hierarchy in (ROOT, ROOT / "memory", ROOT / "pids"):
            for g in hierarchy.glob(prefix + "*"):
                pid = g.name[len(prefix):].split("-")[0]
                if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                    SlotCgroups([g], 0, 0).remove()

    @classmethod
    def create(cls, name: str, memory_bytes: int, pids: int) -> SlotCgroups | None:
        cls.remove_stale()
        try:
            if (ROOT / "cgroup.controllers").is_file():  # v2
                parent = ROOT / name
                parent.mkdir(exist_ok=True)
                (parent / "cgroup.subtree_control").write_text("+memory +pids")
                return cls([parent], memory_bytes, pids)
            mem, pid = ROOT / "memory", ROOT / "pids"
            if not ((mem / "cgroup.procs").is_file() and (pid / "cgroup.procs").is_file()):
                log.info("cgroups_unavailable", reason="no memory and pids hierarchies")
                return None
            groups = [mem / name, pid / name]
            for g in groups:
                g.mkdir(exist_ok=True)
            return cls(groups, memory_bytes, pids)
        except OSError as exc:
            log.info("cgroups_unavailable", reason=str(exc))
            return None

    def _slot_dirs(self, slot: int) -> list[Path]:
        return [g / f"slot-{slot}" for g in self.groups]

    def prepare(self, slot: int) -> None:
        for d in self._slot_dirs(slot):
            d.mkdir(exist_ok=True)
            files = {
                "memory.max": str(self.memory_bytes), "pids.max": str(self.pids),
                "memory.swap.max": "0",
                "memory.limit_in_bytes": str(self.memory_bytes),
                "memory.memsw.limit_in_bytes": str(self.memory_bytes),
            }
            for fname, value in files.items():
                f = d / fname
                if f.exists():
                    try:
                        f.write_text(value)
                    except OSError:  # memsw needs the swap accounting boot flag; optional
                        if fname not in ("memory.memsw.limit_in_bytes", "memory.swap.max"):
                            raise

    def enter_prefix(self, slot: int) -> list[str]:
        procs = [str(d / "cgroup.procs") for d in self._slot_dirs(slot)]
        return ["/bin/sh", "-c", _ENTER, "sh", *procs, "--"]

    def pids_in(self, slot: int) -> set[int]:
        found: set[int] = set()
        for d in self._slot_dirs(slot):
            try:
                found |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return found

    def sweep(self, slot: int) -> int:
        """SIGKILL every process still in the slot (a child that left the process group)."""
        killed = 0
        for _ in range(3):
            pids = self.pids_in(slot)
            if not pids:
                break
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
        return killed

    def remove(self) -> None:
        for g in self.groups:
            for d in sorted(g.glob("slot-*")):
                try:
                    d.rmdir()
                except OSError:
                    pass
            try:
                g.rmdir()
            except OSError:
                pass
