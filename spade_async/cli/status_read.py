"""What `spade status` shows, read from the files the daemon and the trainer write: the
daemon's status file (its counters, sample ledger and token counts), the spool's marks and
waiting samples, the published policy version, the trainer's metrics (spade_async.core.
trainer_metrics) and the saved `spade bench inference` result. It reads and never writes (a
read command creates nothing)."""

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
    st["samples"] = sample_account(st)
    st["tokens"] = loop_tokens(cfg, st.get("tokens"))
    moves = design_moves(st.get("counters", {}))
    if moves is not None:
        st["moves"] = moves
    return st


def status_path(cfg: SpadeConfig) -> Path:
    """The status file the daemon rewrites as it runs."""
    return run_dir(cfg) / "status.json"


def trainer_progress(cfg: SpadeConfig) -> dict:
    """The trainer as the files show it: spool marks and the samples in batches not taken yet,
    current.json, its last step, its recent steps' figures (RECENT_STEPS) and its ledger."""
    from spade_async.core.config.trainer import trainer_root
    from spade_async.core.policy import read_current
    from spade_async.core.spool.files import FileSpool
    from spade_async.core.trainer_metrics import step_stats, tail_events, trainer_ledger

    data = cfg.paths.data_dir
    out: dict = {"last_seq": 0, "taken_seq": 0, "samples_waiting": 0, "step": None,
                 "published_version": int((read_current(data) or {}).get("version", 0))}
    if (data / "spool").is_dir():  # a read command creates nothing
        spool = FileSpool(data / "spool")
        out.update(last_seq=spool.last_seq(), taken_seq=spool.taken_seq())
        out["samples_waiting"] = sum(spool.batch_rows(seq) or 0 for seq in
                                     range(out["taken_seq"] + 1, out["last_seq"] + 1))
    metrics = trainer_root(cfg, cfg.trainer) / "metrics.jsonl"
    events = tail_events(metrics)
    if events:
        last = events[-1]
        out.update(step=last.get("step"), last_event=last.get("event"),
                   last_event_age_s=round(time.time() - float(last.get("time", 0)), 1))
    steps = [e for e in events if e.get("event") == "step"]
    if steps:
        out.update(loss=steps[-1].get("loss"), tokens_per_s=steps[-1].get("tokens_per_s"),
                   staleness_mean=steps[-1].get("staleness_mean"),
                   logprob_abs_diff_mean=steps[-1].get("logprob_abs_diff_mean"),
                   recent=step_stats(steps[-RECENT_STEPS:]))
    out["ledger"] = trainer_ledger(metrics, events)
    return out


RECENT_STEPS = 20  # the trainer line's figures: over its last steps


def sample_account(st: dict) -> dict | None:
    """Every sample played, end to end: the daemon's ledger (played, written to the spool,
    dropped by reason, in flight, per role), then the trainer's side (trained, dropped by
    reason, buffered) and the samples waiting in the spool. None: the daemon's status has no
    ledger (a daemon from before it was counted)."""
    ledger = st.get("ledger")
    if not isinstance(ledger, dict):
        return None
    roles = {r: v for r, v in ledger.items() if isinstance(v, dict)}
    t = st.get("trainer") or {}
    tl = t.get("ledger") or {}
    return {
        "played": {r: v.get("played", 0) for r, v in roles.items()},
        "written": sum(v.get("written", 0) for v in roles.values()),
        "dropped_by_daemon": {r: v.get("dropped", {}) for r, v in roles.items()},
        "in_flight": sum(v.get("in_flight", 0) for v in roles.values()),
        "waiting_in_spool": t.get("samples_waiting", 0),
        "trainer": tl or None,
    }


def loop_tokens(cfg: SpadeConfig, tokens: dict | None) -> dict | None:
    """The daemon's token counts with what `spade bench inference` measured here beside them:
    `bench` (the reference, or why there is none) and `ratio_window` / `ratio_run` (the loop's
    sampled tokens/s over the last minute / over the run, divided by the reference)."""
    from spade_async.bench.saved import loop_reference, read_inference_result

    if not isinstance(tokens, dict):
        return None
    ref = loop_reference(cfg, read_inference_result(cfg))
    out = {**tokens, "bench": ref, "ratio_window": None, "ratio_run": None}
    rate = ref.get("tokens_per_s")
    if rate:
        window = (tokens.get("window") or {}).get("sampled_per_s")
        if window is not None:
            out["ratio_window"] = round(window / rate, 4)
        if tokens.get("sampled_per_s") is not None:
            out["ratio_run"] = round(tokens["sampled_per_s"] / rate, 4)
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
