"""What every panel of the report shares: minutes since the run started, the "no ... yet"
placeholder of an empty panel, and one x range for panels over the same minutes."""

from __future__ import annotations

import numpy as np


def minutes(records: list[dict], t0: float) -> np.ndarray:
    return np.array([(float(r["time"]) - t0) / 60.0 for r in records])


def empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} yet", ha="center", va="center", transform=ax.transAxes,
            color="0.5", fontsize=12)
    ax.set_xticks([])
    ax.set_yticks([])


def same_x(*axes) -> None:
    """Panels over the same minutes get the same x range."""
    lo = min(a.get_xlim()[0] for a in axes)
    hi = max(a.get_xlim()[1] for a in axes)
    for a in axes:
        a.set_xlim(lo, hi)
