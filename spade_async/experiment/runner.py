"""`spade experiment run`: each arm's stack (the Procfile's processes under the supervise
wrapper, with the arm's config) one after another, until the arm has spent its budget.

The runner only starts processes and reads their files. When an arm's budget is spent it asks
the daemon to stop (a stop request in its run dir); the daemon drains, evaluates the version it
stopped on, and exits, and honcho then stops the arm's other processes. The stack runs in a
session of its own: a runner killed (even with kill -9) leaves it running, and the next
`spade experiment run` finds it by its process group and follows it again; a stack that died is
started again, and every process resumes from the arm's data dir. Ctrl-C stops the arm's stack
too (it resumes on the next run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from spade_async.core.config import SpadeConfig, run_dir
from spade_async.core.control import clear_stop_request, request_stop
from spade_async.core.logs import get_logger
from spade_async.experiment.budget import ArmProgress, Progress, describe, spent
from spade_async.experiment.layout import (
    arm_dir,
    arm_environment,
    arm_tables,
    experiment_dir,
    write_arm_config,
)
from spade_async.experiment.state import ArmRun, ArmState, ExperimentState
from spade_async.inference.launch import REPO

log = get_logger("experiment")


class ArmFailed(RuntimeError):
    """An arm's stack stopped before its budget was spent."""


def _group_alive(pgid: int | None) -> bool:
    """Whether a live process is left in the process group. A zombie does not count: a stack
    whose runner was killed is reparented to pid 1, which on some hosts never reaps it."""
    if not pgid:
        return False
    proc = Path("/proc")
    if not proc.is_dir():  # no procfs: the group exists while anything in it does
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class Runner:
    def __init__(self, cfg: SpadeConfig, config_path: Path, *,
                 echo: Callable[[str], None] = print, poll_s: float = 2.0,
                 progress_every_s: float = 30.0) -> None:
        self.cfg, self.config_path, self.echo = cfg, config_path, echo
        self.poll_s, self.progress_every_s = poll_s, progress_every_s
        self.exp_dir = experiment_dir(cfg)
        self.kind, self.amount = cfg.experiment.parsed_budget()
        self.state = ExperimentState.open(self.exp_dir, name=cfg.experiment.name,
                                          arms=cfg.experiment.arms, budget=cfg.experiment.budget,
                                          config=config_path)
        # Every arm's config is written and loaded before anything starts: a bad one fails now,
        # by name, not after the first arm's hour.
        from spade_async.envs.seed_checks import load_checked_config

        self.arm_configs = {}
        for arm in cfg.experiment.arms:
            path = write_arm_config(cfg, config_path, self.exp_dir, arm)
            # read as its processes read it: without the SPADE__* variables of its own keys
            # (else the runner would watch the shell's data dir, not the arm's)
            environ, _ = arm_environment(os.environ, arm_tables(cfg, config_path,
                                                                self.exp_dir, arm))
            self.arm_configs[arm] = (path, load_checked_config(path, environ))

    def run(self) -> ExperimentState:
        arms = self.cfg.experiment.arms
        for i, arm in enumerate(arms, 1):
            st = self.state.arm[arm]
            if st.status == "done":
                self.echo(f"[experiment] arm {arm} ({i}/{len(arms)}): done ({st.budget_spent})")
                continue
            self._run_arm(arm, f"{i}/{len(arms)}", st)
        self.echo(f"[experiment] every arm has spent its budget ({self.cfg.experiment.budget}): "
                  f"spade experiment report --config {self.config_path}")
        return self.state

    # ---- one arm --------------------------------------------------------------------------

    def _launch(self, arm: str, arm_cfg: Path) -> subprocess.Popen:
        data = arm_dir(self.exp_dir, arm)
        clear_stop_request(data / "run")
        own = arm_tables(self.cfg, self.config_path, self.exp_dir, arm)
        kept, dropped = arm_environment(os.environ, own)
        if dropped:
            self.echo(f"[experiment] arm {arm}: not passed to its processes, the arm sets "
                      "these itself: " + ", ".join(f"{k} ({key})" for k, key in dropped))
        env = dict(kept, SPADE_CONFIG=str(arm_cfg), HF_HUB_OFFLINE="1",
                   PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        ecfg = self.cfg.experiment
        cmd = [sys.executable, "-m", "spade_async.cli.supervise", "--config", str(arm_cfg), "--",
               str(Path(sys.executable).with_name("honcho")), "start", "-f",
               str(REPO / ecfg.procfile), *(ecfg.processes or [])]
        out = open(data / "experiment-stack.log", "ab")  # noqa: SIM115 (the child holds it)
        try:
            return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            out.close()

    def _run_arm(self, arm: str, which: str, st: ArmState) -> None:
        arm_cfg, acfg = self.arm_configs[arm]
        data = arm_dir(self.exp_dir, arm)
        rdir = run_dir(acfg)
        proc: subprocess.Popen | None = None
        if _group_alive(st.pgid):
            self.echo(f"[experiment] arm {arm} ({which}): its stack is still running "
                      f"(process group {st.pgid}): following it again")
        else:
            proc = self._launch(arm, arm_cfg)
            st.pgid, st.status = proc.pid, "running"
            st.runs.append(ArmRun(started=time.time()))
            procs = ", ".join(self.cfg.experiment.processes or ["every process"])
            self.echo(f"[experiment] arm {arm} ({which}): stack started ({procs} of "
                      f"{self.cfg.experiment.procfile}; log {data / 'experiment-stack.log'}), "
                      f"budget {self.cfg.experiment.budget}")
        self.state.save(self.exp_dir)
        launched = time.time()
        progress = ArmProgress(data)
        stop_sent = (rdir / "stop-request.json").exists()
        last_tick, last_line, last_save = time.monotonic(), 0.0, time.monotonic()
        interval = acfg.daemon.status_interval_s
        try:
            while True:
                alive = proc.poll() is None if proc is not None else _group_alive(st.pgid)
                now = time.monotonic()
                status = _read_json(rdir / "status.json") or {}
                looping = (bool(status) and not status.get("stopped")
                           and float(status.get("updated_at", 0)) >= launched - 3 * interval
                           and time.time() - float(status.get("updated_at", 0)) < 3 * interval + 15)
                if looping and alive:
                    st.first_started = st.first_started or time.time()
                    if not stop_sent:  # the loop's time; the final evaluation is not budget
                        st.elapsed_s += now - last_tick
                last_tick = now
                p = progress.read(st.elapsed_s)
                if not stop_sent and alive and looping and spent(self.kind, self.amount, p):
                    st.budget_spent = describe(self.kind, self.amount, p)
                    request_stop(rdir, f"experiment budget: {st.budget_spent}", final_eval=True)
                    stop_sent = True
                    self.echo(f"[experiment] arm {arm}: budget spent ({st.budget_spent}): "
                              "stopping after the held-out evaluation of its last version")
                if not alive:
                    break
                if now - last_line >= self.progress_every_s:
                    last_line = now
                    self.echo(self._line(arm, which, p, looping, stop_sent))
                if now - last_save >= 10:
                    last_save = now
                    self.state.save(self.exp_dir)
                time.sleep(self.poll_s)
        except KeyboardInterrupt:
            self._stop_stack(st)
            self._ended(st, "interrupted")
            raise
        self._ended(st, "budget" if stop_sent else self._exit_reason(data, proc))
        if not stop_sent:
            raise ArmFailed(f"arm {arm}: its stack stopped before the budget was spent "
                            f"({st.runs[-1].how}); see {data / 'run' / 'stack.log'}. Run "
                            "`spade experiment run` again to resume it.")
        p = progress.read(st.elapsed_s)
        st.status = "done"
        self.state.save(self.exp_dir)
        self.echo(f"[experiment] arm {arm} ({which}): done: {st.budget_spent}, loop "
                  f"{st.elapsed_s / 60:.1f} min, evaluated "
                  f"{', '.join(f'v{v}' for v in sorted(p.evaluated)) or 'nothing'}")

    def _ended(self, st: ArmState, how: str) -> None:
        if st.runs and st.runs[-1].ended is None:
            st.runs[-1].ended, st.runs[-1].how = time.time(), how
        st.pgid = None
        self.state.save(self.exp_dir)

    @staticmethod
    def _stop_stack(st: ArmState) -> None:
        """SIGINT to the stack (honcho stops every process, each drains); SIGKILL after 120 s."""
        if not _group_alive(st.pgid):
            return
        os.killpg(st.pgid, signal.SIGINT)
        end = time.monotonic() + 120
        while _group_alive(st.pgid) and time.monotonic() < end:
            time.sleep(0.5)
        if _group_alive(st.pgid):
            os.killpg(st.pgid, signal.SIGKILL)

    @staticmethod
    def _exit_reason(data: Path, proc: subprocess.Popen | None) -> str:
        exit_ = _read_json(data / "run" / "stack-exit.json") or {}
        if exit_.get("line"):
            return str(exit_["line"])
        rc = proc.returncode if proc is not None else None
        return f"the stack exited with code {rc}"

    def _line(self, arm: str, which: str, p: Progress, looping: bool, stopping: bool) -> str:
        state = "stopping" if stopping else ("running" if looping else "starting")
        evals = ", ".join(f"v{v}" for v in sorted(p.evaluated)) or "none yet"
        return (f"[experiment] arm {arm} ({which}) {state}: "
                f"{describe(self.kind, self.amount, p)} · loop {p.elapsed_s / 60:.1f} min · "
                f"{p.designs} designs ({p.accepted} accepted) · {p.episodes} episodes · "
                f"{p.tokens} tokens · evaluated {evals}")
