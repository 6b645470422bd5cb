"""Runs the Procfile stack (honcho) and says, in one line, how it ended and why.

honcho stops the whole stack when any process exits. This wrapper keeps that behaviour (a
half-running loop is worse than a stopped one, and every process resumes where it stopped
when the stack starts again) but never lets it pass silently: it copies honcho's output to the
terminal and to `<data_dir>/run/stack.log`, and when honcho returns it prints which process
ended first, with its exit code or signal and the last error it wrote, and records the same in
`<data_dir>/run/stack-exit.json`. Ctrl-C goes to the whole process group as usual (honcho stops
the processes); SIGTERM sent to this wrapper is passed on to honcho.

    python -m spade_async.cli.supervise --config configs/embedded.toml -- honcho start

It never restarts anything itself: for that, run the three processes under a supervisor that
does (systemd units in the README).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from spade_async.core.rolling import Retention, RollingFile

# honcho's own lines: "HH:MM:SS system      | daemon.1 stopped (rc=1)"
_LINE = re.compile(r"^\S+ (?P<name>\S+?)\s*\| (?P<text>.*)$")
_STOPPED = re.compile(r"^(?P<proc>\S+?)(?:\.\d+)? stopped \(rc=(?P<rc>-?\d+)\)")
_RECEIVED = re.compile(r"^(?P<sig>SIG\w+) received")
_ERRORISH = re.compile(r"error|exception|traceback|killed|fatal|failed", re.I)


@dataclass(frozen=True)
class StackExit:
    """How the stack ended: `first` is the process that ended first (None: stopped by a
    signal sent to the stack), with its return code and the last error-like line it wrote."""

    first: str | None
    rc: int | None
    signal: str | None  # the signal that asked the stack to stop, or that killed `first`
    last_words: str
    line: str  # the one line printed

    def as_dict(self) -> dict:
        return asdict(self)


def _proc(name: str) -> str:
    return name.rsplit(".", 1)[0]


def _last_words(lines: list[tuple[str, str]], proc: str) -> str:
    """The last error-like line `proc` wrote (else its last line), made readable: a JSON
    log line becomes `event: error`."""
    own = [text for name, text in lines if _proc(name) == proc and text.strip()]
    pick = next((t for t in reversed(own) if _ERRORISH.search(t)), own[-1] if own else "")
    try:
        rec = json.loads(pick)
    except ValueError:
        return pick.strip()[:300]
    if isinstance(rec, dict):
        detail = rec.get("error") or rec.get("reason") or ""
        return f"{rec.get('event', '')}: {detail}".strip(": ")[:300]
    return pick.strip()[:300]


def explain(log_lines: list[str], returncode: int) -> StackExit:
    """Reads honcho's output and says how the stack ended."""
    lines: list[tuple[str, str]] = []
    for raw in log_lines:
        m = _LINE.match(raw.rstrip("\n"))
        if m:
            lines.append((m["name"], m["text"]))
    asked: str | None = None
    for name, text in lines:
        if name != "system":
            continue
        if (m := _RECEIVED.match(text)) and asked is None:
            asked = m["sig"]
            continue
        m = _STOPPED.match(text)
        if m is None:
            continue
        proc, rc = _proc(m["proc"]), int(m["rc"])
        if asked is not None:
            break  # a process that stopped after the stack was asked to stop
        words = _last_words(lines, proc)
        if rc < 0:
            sig = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
            how = f"was killed by {sig}"
        elif rc == 0:
            sig, how = None, "finished (exit code 0)"
        else:
            sig, how = None, f"exited with code {rc}"
        line = (f"[run] {proc} {how}" + (f": {words}" if words and rc != 0 else "")
                + "; honcho stopped the other processes. `bash scripts/run.sh` starts the "
                "stack again and every process resumes where it stopped.")
        return StackExit(proc, rc, sig, words, line)
    if asked is not None:
        line = (f"[run] stopped by {asked}: every process was asked to stop (honcho exit code "
                f"{returncode}); `bash scripts/run.sh` resumes.")
        return StackExit(None, None, asked, "", line)
    line = f"[run] honcho exited with code {returncode} before any process stopped."
    return StackExit(None, None, None, "", line)


def supervise(cmd: list[str], log_path: Path,
              retention: Retention | None = None) -> tuple[int, StackExit]:
    """Run `cmd`, its output to the terminal and to `log_path` (rolled by `retention`); its
    exit code and what stopped it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1,
                            text=True, errors="replace")

    def forward(signum: int, _frame: object) -> None:
        if signum == signal.SIGTERM:  # Ctrl-C's SIGINT reaches honcho by itself
            proc.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    seen: list[str] = []
    assert proc.stdout is not None
    log = RollingFile(log_path, retention)
    log.append_bytes(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        log.append_bytes(line.encode("utf-8", "replace"))
        seen.append(line)
        if len(seen) > 20000:
            del seen[:10000]
    rc = proc.wait()
    return rc, explain(seen, rc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spade_async.cli.supervise",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", "-c", type=Path, required=True)
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- honcho start [args]")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("give the command to run after --")
    from spade_async.core.config import ConfigError, run_dir
    from spade_async.envs.seed_checks import load_checked_config

    try:
        cfg = load_checked_config(args.config)
        rdir = run_dir(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rc, result = supervise(cmd, rdir / "stack.log", Retention.of(cfg.retention))
    print(result.line, file=sys.stderr, flush=True)
    (rdir / "stack-exit.json").write_text(json.dumps({**result.as_dict(), "honcho_rc": rc,
                                                      "time": time.time()}, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
