"""Isolation backends: how a sandbox worker process is launched (DESIGN §4).

Each backend turns (slot, interpreter, worker argv) into one command line; the runtime owns the
process lifecycle. Layers, outermost first:
- cgroup membership (memory, pids) entered by a tiny `sh` while still root, then
- `setpriv`: a per-slot unprivileged uid/gid, no supplementary groups, no capabilities,
  no_new_privs (root only), then
- `bwrap`: new user, PID, network, IPC, UTS and cgroup namespaces, a root with only the
  interpreter read-only, a private size-limited /tmp, a cleared environment, no further user
  namespaces; or `unshare` + `chroot` when bubblewrap is missing (root only); or
- `none`: a bare interpreter, for hosts that cannot isolate, only when the config says so.
This module must never start an environment itself; `probe` starts only `python -c pass`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from spade_async.core.config import SandboxConfig
from spade_async.core.logs import get_logger

log = get_logger("sandbox")
MB = 1 << 20


class SandboxUnavailable(RuntimeError):
    """The host cannot provide the isolation the config asks for; the message says why."""


def base_interpreter(cfg: SandboxConfig) -> Path:
    """The real interpreter behind this Python (a venv's python is only a link to it)."""
    if cfg.python is not None:
        return cfg.python
    return Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))


def _interpreter_root(python: Path) -> Path:
    # .../bin/python3.11 -> ... (the prefix holding bin/ and lib/pythonX.Y)
    return python.parent.parent


@dataclass(frozen=True)
class Layers:
    namespaces: bool
    uid_per_slot: bool
    no_new_privs: bool
    private_root: bool
    tmp_size_limit: bool
    rlimits: bool = True
    cgroups: bool = False

    def describe(self) -> dict[str, bool]:
        return dict(self.__dict__)


class Isolation(ABC):
    name: str

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        self.python = base_interpreter(cfg)
        self.is_root = os.geteuid() == 0
        self.uid_base = cfg.uid_base  # the Sandbox moves it to the block it claimed (uids.py)

    @abstractmethod
    def wrap(self, slot: int, argv: list[str]) -> list[str]:
        """The command that runs `argv` (interpreter first) isolated for `slot`."""

    @abstractmethod
    def layers(self) -> Layers: ...

    def uid(self, slot: int) -> int:
        return self.uid_base + slot

    def _setpriv(self, slot: int) -> list[str]:
        if not self.is_root:
            return []
        uid = str(self.uid(slot))
        return [_tool("setpriv"), "--reuid", uid, "--regid", uid, "--clear-groups",
                "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"]

    def probe(self) -> None:
        """Start `python -c pass` through this backend once; raise SandboxUnavailable if not."""
        cmd = self.wrap(0, [str(self.python), "-I", "-S", "-c", "pass"])
        try:
            res = subprocess.run(cmd, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(f"{self.name}: cannot start a worker: {exc}") from None
        if res.returncode != 0:
            err = res.stderr.decode(errors="replace").strip()[-400:]
            raise SandboxUnavailable(f"{self.name}: test worker exited {res.returncode}: {err}")


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
    if path is None:
        raise SandboxUnavailable(f"'{name}' not found on PATH")
    return path


def _world_readable(path: Path) -> bool:
    """Can an unprivileged uid reach `path` (every ancestor o+x, the file o+r)?"""
    import stat

    try:
        if not path.stat().st_mode & stat.S_IROTH:
            return False
        return all(p.stat().st_mode & stat.S_IXOTH for p in path.resolve().parents)
    except OSError:
        return False


class BwrapIsolation(Isolation):
    name = "bwrap"

    def __init__(self, cfg: SandboxConfig) -> None:
        super().__init__(cfg)
        self.bwrap = _tool("bwrap")
        if self.is_root and cfg.python is None and not _world_readable(self.python):
            # bwrap runs as the slot's uid, which cannot see e.g. a pyenv build under /root.
            # The worker is stdlib-only: the system interpreter serves as well.
            system = Path(f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}")
            system = system if system.exists() else Path("/usr/bin/python3")
            if not system.exists():
                raise SandboxUnavailable(f"bwrap: {self.python} is not readable by the slot uids "
                                         "and there is no /usr/bin/python3; set sandbox.python")
            log.debug("sandbox_interpreter", chosen=str(system),
                     reason=f"{self.python} is not readable by unprivileged uids")
            self.python = system

    def _ro_binds(self) -> list[str]:
        args = ["--ro-bind", "/usr", "/usr"]
        for link in ("lib", "lib64", "bin", "sbin"):
            p = Path("/") / link
            if p.is_symlink():
                args += ["--symlink", os.readlink(p), f"/{link}"]
            elif p.is_dir():
                args += ["--ro-bind", str(p), f"/{link}"]
        root = _interpreter_root(self.python)
        if not str(root).startswith("/usr/") and str(root) != "/usr":
            args += ["--ro-bind", str(root), str(root)]
        return args

    def wrap(self, slot: int, argv: list[str]) -> list[str]:
        return [
            *self._setpriv(slot),
            self.bwrap,
            "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--disable-userns",
            "--die-with-parent", "--new-session", "--hostname", "sandbox",
            *self._ro_binds(),
            "--proc", "/proc", "--dev", "/dev",
            "--size", str(self.cfg.tmp_size_mb * MB), "--tmpfs", "/tmp",
            "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
            "--setenv", "LANG", "C.UTF-8", "--chdir", "/tmp",
            "--", *argv,
        ]

    def layers(self) -> Layers:
        return Layers(namespaces=True, uid_per_slot=self.is_root, no_new_privs=True,
                      private_root=True, tmp_size_limit=True)


# Runs as root inside fresh mount/PID/net/IPC/UTS namespaces: builds a size-limited tmpfs root
# holding only the interpreter (read-only binds) and a few device nodes, then chroots into it and
# drops to the slot's uid. $1 = scratch mountpoint, $2 = root size, $3 = interpreter root, rest =
# setpriv + argv.
_UNSHARE_SCRIPT = r"""
set -e
R=$1; SIZE=$2; PYROOT=$3; shift 3
mount --make-rprivate /
mount -t tmpfs -o size="$SIZE",mode=755 sandbox "$R"
mkdir -p "$R/usr" "$R/tmp" "$R/proc" "$R/dev" "$R$PYROOT"
chmod 1777 "$R/tmp"
mount --rbind /usr "$R/usr"; mount -o remount,bind,ro "$R/usr"
case "$PYROOT" in /usr|/usr/*) ;; *) mount --rbind "$PYROOT" "$R$PYROOT"; mount -o remount,bind,ro "$R$PYROOT";; esac
for l in lib lib64 bin sbin; do [ -L "/$l" ] && ln -s "$(readlink "/$l")" "$R/$l"; done
for d in null zero urandom random; do : > "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"; done
mount -t proc proc "$R/proc"
cd "$R/tmp"
exec chroot "$R" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/tmp LANG=C.UTF-8 "$@"
"""


class UnshareIsolation(Isolation):
    """For hosts without bubblewrap: util-linux `unshare` + `chroot`, root only."""

    name = "unshare"

    def __init__(self, cfg: SandboxConfig) -> None:
        super().__init__(cfg)
        if not self.is_root:
            raise SandboxUnavailable("unshare: needs root (bubblewrap is the unprivileged path)")
        self.unshare = _tool("unshare")
        self.scratch = Path(f"/run/spade-sandbox-{os.getpid()}")

    def wrap(self, slot: int, argv: list[str]) -> list[str]:
        mnt = self.scratch / f"slot-{slot}"
        mnt.mkdir(parents=True, exist_ok=True)
        return [
            self.unshare, "--mount", "--pid", "--fork", "--kill-child", "--net", "--ipc", "--uts",
            "/bin/sh", "-c", _UNSHARE_SCRIPT, "sh", str(mnt), str(self.cfg.tmp_size_mb * MB),
            str(_interpreter_root(self.python)), *self._setpriv(slot), *argv,
        ]

    def layers(self) -> Layers:
        return Layers(namespaces=True, uid_per_slot=True, no_new_privs=True,
                      private_root=True, tmp_size_limit=True)


class NoIsolation(Isolation):
    name = "none"

    def wrap(self, slot: int, argv: list[str]) -> list[str]:
        return list(argv)

    def layers(self) -> Layers:
        return Layers(namespaces=False, uid_per_slot=False, no_new_privs=False,
                      private_root=False, tmp_size_limit=False)


def choose_isolation(cfg: SandboxConfig, uid_base: int | None = None) -> Isolation:
    """The configured backend, probed; `auto` tries bwrap, then unshare. Never silently none.
    `uid_base`: the first slot uid, when not the config's (a claimed block, uids.py)."""
    if cfg.isolation == "none":
        log.warning("sandbox_unisolated", detail="sandbox.isolation = 'none': generated code runs "
                    "with this user's rights, network and files. Never do this with untrusted "
                    "models.")
        return NoIsolation(cfg)
    order = {"auto": [BwrapIsolation, UnshareIsolation], "bwrap": [BwrapIsolation],
             "unshare": [UnshareIsolation]}[cfg.isolation]
    reasons = []
    for backend in order:
        try:
            iso = backend(cfg)
            if uid_base is not None:
                iso.uid_base = uid_base
            iso.probe()
            return iso
        except SandboxUnavailable as exc:
            reasons.append(str(exc))
    raise SandboxUnavailable(
        "no sandbox isolation available (" + "; ".join(reasons) + "). Install bubblewrap "
        "(apt-get install bubblewrap), or set sandbox.isolation = \"none\" to run generated code "
        "unisolated (unsafe)."
    )
