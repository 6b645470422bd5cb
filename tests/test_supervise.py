"""The run script's supervision: when one process of the Procfile stack ends, the wrapper says
which one, how (exit code or signal) and why (its last error line), in one line, and records it
in <data_dir>/run/stack-exit.json. Real honcho, real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from spade_async.cli.supervise import explain

REPO = Path(__file__).resolve().parents[1]
HONCHO = str(Path(sys.executable).with_name("honcho"))


def test_explain_names_the_first_process_to_stop_and_its_last_error():
    log = [
        "10:00:00 system      | inference.1 started (pid=1)\n",
        "10:00:00 system      | daemon.1 started (pid=2)\n",
        '10:00:01 daemon.1    | {"event": "design", "status": "invalid"}\n',
        '10:00:02 daemon.1    | {"event": "daemon_failed", "error": "KeyError: x", '
        '"level": "error"}\n',
        "10:00:02 daemon.1    | error: the daemon failed: KeyError: x\n",
        "10:00:02 inference.1 | INFO: fine\n",
        "10:00:02 system      | daemon.1 stopped (rc=1)\n",
        "10:00:02 system      | sending SIGTERM to inference.1 (pid 1)\n",
        "10:00:03 system      | inference.1 stopped (rc=-15)\n",
    ]
    out = explain(log, 1)
    assert (out.first, out.rc, out.signal) == ("daemon", 1, None)
    assert out.last_words == "error: the daemon failed: KeyError: x"
    assert out.line.startswith("[run] daemon exited with code 1: error: the daemon failed")
    assert "\n" not in out.line


def test_explain_a_killed_process_and_a_requested_stop():
    killed = explain(["10:00:00 inference.1 | Uvicorn running\n",
                      "10:00:05 system      | inference.1 stopped (rc=-9)\n",
                      "10:00:05 system      | sending SIGTERM to daemon.1 (pid 3)\n"], 247)
    assert (killed.first, killed.rc, killed.signal) == ("inference", -9, "SIGKILL")
    assert "inference was killed by SIGKILL" in killed.line
    asked = explain(["10:00:00 system      | SIGINT received\n",
                     "10:00:00 system      | sending SIGTERM to daemon.1 (pid 3)\n",
                     "10:00:01 system      | daemon.1 stopped (rc=0)\n"], 130)
    assert asked.first is None and asked.signal == "SIGINT"
    assert asked.line.startswith("[run] stopped by SIGINT")


def _stack(tmp_path: Path, procfile: str) -> subprocess.Popen:
    (tmp_path / "Procfile").write_text(procfile)
    (tmp_path / "spade.toml").write_text(f'[paths]\ndata_dir = "{tmp_path / "data"}"\n')
    return subprocess.Popen(
        [sys.executable, "-m", "spade_async.cli.supervise", "--config", str(tmp_path / "spade.toml"),
         "--", HONCHO, "start", "-f", str(tmp_path / "Procfile"), "-d", str(tmp_path)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)


def _exit_record(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "data" / "run" / "stack-exit.json").read_text())


def test_a_process_that_fails_is_named_with_its_error_and_the_others_stopped(tmp_path):
    proc = _stack(tmp_path, (
        "sleeper: exec sleep 60\n"
        "crasher: exec python3 -c \"import sys, time; time.sleep(1); "
        "print('error: the daemon failed: RuntimeError: boom', flush=True); sys.exit(3)\"\n"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3
    last = err.strip().splitlines()[-1]
    assert last.startswith("[run] crasher exited with code 3: error: the daemon failed: "
                           "RuntimeError: boom"), err
    rec = _exit_record(tmp_path)
    assert rec["first"] == "crasher" and rec["rc"] == 3 and rec["honcho_rc"] == 3
    log = (tmp_path / "data" / "run" / "stack.log").read_text()
    assert "sleeper.1 stopped" in log and "RuntimeError: boom" in log  # the whole log is kept
    assert "RuntimeError: boom" in out  # and the terminal still sees everything


def test_a_killed_process_is_named_with_its_signal(tmp_path):
    proc = _stack(tmp_path, (
        "sleeper: exec sleep 60\n"
        "victim: exec python3 -c \"import os, time; time.sleep(1); os.kill(os.getpid(), 9)\"\n"))
    _, err = proc.communicate(timeout=60)
    assert "[run] victim was killed by SIGKILL" in err, err
    assert _exit_record(tmp_path)["signal"] == "SIGKILL"


def test_sigterm_to_the_wrapper_stops_the_stack_and_says_so(tmp_path):
    proc = _stack(tmp_path, "a: exec sleep 60\nb: exec sleep 60\n")
    deadline = time.monotonic() + 30
    log = tmp_path / "data" / "run" / "stack.log"
    while not (log.exists() and log.read_text().count("started (pid") == 2):
        assert time.monotonic() < deadline, "honcho did not start both processes"
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert "[run] stopped by SIGTERM" in err, err
    assert _exit_record(tmp_path)["first"] is None
