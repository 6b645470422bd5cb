"""The report's view of training: per optimizer step, the policy's drift from the base model
(KL and mean |delta log p|), the trainer's throughput (trained and sequence tokens/s) and
padded/real tokens (training.png); and the summary's `training` entry: steps per hour, mean
samples per step, padded/real, tokens/s, and the sample ledger of both sides (the daemon's
last status, the trainer's metrics; spade_async/core/trainer_metrics.py)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from spade_async.core.config import SpadeConfig, run_dir
from spade_async.core.trainer_metrics import step_figures, step_stats, trainer_ledger
from spade_async.report.axes import empty
from spade_async.report.data import RunData


def training_summary(cfg: SpadeConfig, d: RunData) -> dict[str, Any]:
    from spade_async.core.config.trainer import trainer_root

    try:
        daemon = json.loads((run_dir(cfg) / "status.json").read_text()).get("ledger")
    except (OSError, ValueError):
        daemon = None
    return {**step_stats(d.steps),
            "ledger": {"daemon": daemon,
                       "trainer": trainer_ledger(trainer_root(cfg, cfg.trainer)
                                                 / "metrics.jsonl")}}


def _n(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def training_text(t: dict[str, Any]) -> str:
    """One line: the steps' pace and throughput."""
    return (f"{t['steps']} steps, {_n(t['steps_per_hour'], '.1f')} per hour, "
            f"{_n(t['samples_per_step'], 'g')} samples per step, "
            f"{_n(t['tokens_per_s'], '.1f')} tok/s trained "
            f"({_n(t['seq_tokens_per_s'], '.1f')} of sequence), padded/real "
            f"{_n(t['padding_ratio'], '.2f')}, last KL to base {_n(t['kl_base'], '.4g')}")


def ledger_text(ledger: dict[str, Any]) -> str:
    """One line: played -> written -> trained, with every drop's reason."""
    parts = []
    daemon = ledger.get("daemon")
    if isinstance(daemon, dict):
        for role, row in daemon.items():
            drops = ", ".join(f"{k} {v}" for k, v in row.get("dropped", {}).items())
            parts.append(f"{role} {row.get('played', 0)} played, {row.get('written', 0)} "
                         f"written" + (f", dropped {drops}" if drops else "")
                         + (f", {row['in_flight']} in flight" if row.get("in_flight") else ""))
    else:
        parts.append("no daemon ledger")
    tl = ledger.get("trainer")
    if tl:
        drops = ", ".join(f"{k} {v}" for k, v in tl["dropped"].items())
        parts.append(f"trainer {tl['trained']} trained" + (f", dropped {drops}" if drops else "")
                     + (f", {tl['buffered']} buffered" if tl.get("buffered") else ""))
    else:
        parts.append("no trainer metrics")
    return "; ".join(parts)


def plot_training(d: RunData, ax_drift, ax_speed, ax_pad) -> None:
    figs = [step_figures(s) for s in d.steps]
    step = np.array([int(s.get("step", i)) for i, s in enumerate(d.steps)])

    def series(key: str) -> np.ndarray:
        return np.array([np.nan if f[key] is None else f[key] for f in figs], dtype=float)

    panels = [
        (ax_drift, (("kl_base", "KL(policy || base)"),
                    ("logprob_abs_diff_base", "mean |log pi - log pi_base|")),
         "drift from the base model", "Drift from the base model per step (scored tokens)"),
        (ax_speed, (("tokens_per_s", "trained tokens/s"),
                    ("seq_tokens_per_s", "sequence tokens/s")),
         "tokens / s", "Trainer throughput per step"),
        (ax_pad, (("padding_ratio", "computed / real tokens"),),
         "padded / real", "Padding per step (1 = no padding)"),
    ]
    for ax, keys, ylabel, title in panels:
        drawn = False
        for i, (key, label) in enumerate(keys):
            y = series(key)
            if len(y) and not np.isnan(y).all():
                ax.plot(step, y, marker="o", ms=3, lw=1.2, color=f"C{i}", label=label)
                drawn = True
        if drawn:
            ax.set_ylabel(ylabel)
            ax.legend(loc="best", fontsize=8)
        else:
            empty(ax, "trainer steps with these figures")
        ax.set_title(title)
    ax_pad.set_xlabel("optimizer step")
