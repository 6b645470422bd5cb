"""What `spade status` shows, read from the files the daemon and the trainer write: the
daemon's status file, the spool's marks, the published policy version, the trainer's last
metrics. It reads and never writes (a read command creates nothing)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from spade_async.core.config import SpadeConfig, run_dir


def read_status(cfg: SpadeConfig) -> dict:
    """The daemon's status file with what the other files add: whether it runs, how old the
    status is, the trainer's progress, the designer's moves. FileNotFoundError: no status file
    (the daemon never started with this config)."""
    st = json.loads(status_path(cfg).read_text())
    try:
        os.kill(int(st["pid"]), 0)
        alive = True
    except (OSError, KeyError, ValueError):
        alive = False
    st["running"] = alive and not st.get("stopped")
    st["age_s"] = round(time.time() - float(st.get("updated_at", 0)), 1)
    st["trainer"] = trainer_progress(cfg)
    moves = design_moves(st.get("counters", {}))
    if moves is not None:
        st["moves"] = moves
    return st


def status_path(cfg: SpadeConfig) -> Path:
    """The status file the daemon rewrites as it runs."""
    return run_dir(cfg) / "status.json"


def trainer_progress(cfg: SpadeConfig) -> dict:
    """The trainer as the daemon's files show it: spool marks, current.json, its last step."""
    from spade_async.core.config.trainer import trainer_root
    from spade_async.core.policy import read_current
    from spade_async.core.spool.files import FileSpool

    data = cfg.paths.data_dir
    out: dict = {"last_seq": 0, "taken_seq": 0, "step": None,
                 "published_version": int((read_current(data) or {}).get("version", 0))}
    if (data / "spool").is_dir():  # a read command creates nothing
        spool = FileSpool(data / "spool")
        out.update(last_seq=spool.last_seq(), taken_seq=spool.taken_seq())
    metrics = trainer_root(cfg, cfg.trainer) / "metrics.jsonl"
    try:
        with open(metrics, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        lines = []
    events = []
    for raw in lines:
        try:
            events.append(json.loads(raw))
        except ValueError:
            continue  # the first line of the window may be cut
    if events:
        last = events[-1]
        out.update(step=last.get("step"), last_event=last.get("event"),
                   last_event_age_s=round(time.time() - float(last.get("time", 0)), 1))
    steps = [e for e in events if e.get("event") == "step"]
    if steps:
        out.update(loss=steps[-1].get("loss"), tokens_per_s=steps[-1].get("tokens_per_s"),
                   staleness_mean=steps[-1].get("staleness_mean"),
                   logprob_abs_diff_mean=steps[-1].get("logprob_abs_diff_mean"))
    return out


def design_moves(counters: dict) -> dict | None:
    """Per designer move (DESIGN §12): proposed, accepted, played (its variant's play was
    scored) and the share of proposals that got as far as a scored play, from the daemon's
    counters; None when the daemon counts no moves."""
    from spade_async.report.curriculum import DESIGN_MOVES, move_counts

    if not any(f"moves_{m}_proposed" in counters for m in DESIGN_MOVES):
        return None
    return {m: move_counts(*(int(counters.get(f"moves_{m}_{k}", 0))
                             for k in ("proposed", "accepted", "played")))
            for m in DESIGN_MOVES}
