"""Whether the curriculum aims at the frontier, as numbers from a run's records (designs.jsonl,
plays.jsonl): how many neighbour steps each edit moved each knob (the `knob_steps` the daemon
records with every edit, measured on the scale of envs/knob_steps.py, the one the options were
drawn from) and where the played variants' unhinted solve rates lie. Plain functions over
records; they read no file and draw nothing.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from spade_async.report.curriculum import design_move, play_move

BAND = (0.2, 0.8)  # the solve rates a curriculum at the frontier keeps its plays in


def _solve_rate(play: dict, solved_at: float) -> float | None:
    """A play's unhinted solve rate (score >= `solved_at`); None when none scored."""
    scores = [float(x) for x in play.get("unhinted") or [] if isinstance(x, (int, float))]
    return sum(x >= solved_at for x in scores) / len(scores) if scores else None


def _rates_summary(rates: list[float]) -> dict[str, Any]:
    """The median of some plays' solve rates, the share strictly between 0 and 1 and the
    share inside BAND."""
    n = len(rates)
    return {"plays": n,
            "solve_median": round(statistics.median(rates), 4) if rates else None,
            "solve_between_share": round(sum(0 < r < 1 for r in rates) / n, 4) if n else None,
            "solve_in_band_share": round(sum(BAND[0] <= r <= BAND[1] for r in rates) / n, 4)
            if n else None}


def _edit_row(x: dict, t0: float) -> dict[str, Any]:
    steps = {str(k): int(v) for k, v in x["knob_steps"].items()}
    return {"minute": round((float(x["time"]) - t0) / 60.0, 2), "family": x.get("family"),
            "status": x.get("status"), "direction": x.get("direction"),
            "parent_solve": x.get("parent_solve"), "steps": steps,
            "max_steps": max(steps.values(), default=0)}


def frontier_summary(designs: list[dict], plays: list[dict], t0: float,
                     solved_at: float) -> dict[str, Any]:
    """The curriculum's acceptance numbers: per edit (every proposed edit with params, accepted
    or not) the steps each knob moved, their maximum over the run and how many edits moved a
    knob more than one step; how the edits' options were drawn (easier, harder, either,
    fallback); and the median unhinted solve rate of the played variants (each play one
    value), with the share strictly between 0 and 1 and the share in BAND, over all plays and
    per move. Edits recorded before `knob_steps` existed are counted as unmeasured."""
    edits = [x for x in sorted(designs, key=lambda r: float(r["time"]))
             if design_move(x) == "edit" and isinstance(x.get("params"), dict)]
    rows = [_edit_row(x, t0) for x in edits if isinstance(x.get("knob_steps"), dict)]
    worst = [r["max_steps"] for r in rows]
    rates = [(play_move(p), r) for p in plays if (r := _solve_rate(p, solved_at)) is not None]
    return {
        "edits_measured": len(rows), "edits_unmeasured": len(edits) - len(rows),
        "max_knob_steps": max(worst) if worst else None,
        "edits_over_one_step": sum(w > 1 for w in worst),
        "directions": dict(Counter(str(r["direction"]) for r in rows)),
        "edit_steps": rows,
        **_rates_summary([r for _, r in rates]),
        "by_move": {m: _rates_summary([r for mm, r in rates if mm == m])
                    for m in dict.fromkeys(m for m, _ in rates)},
        "band": list(BAND),
    }


def frontier_text(f: dict[str, Any]) -> str:
    """`median unhinted solve rate 0.50 over 40 plays (60% strictly between 0 and 1, 55% in
    [0.2, 0.8]); 38 edits measured, at most 1 neighbour step per knob (0 over one step)`."""
    if f["plays"]:
        rates = (f"median unhinted solve rate {f['solve_median']:.2f} over {f['plays']} plays "
                 f"({f['solve_between_share']:.0%} strictly between 0 and 1, "
                 f"{f['solve_in_band_share']:.0%} in [{f['band'][0]}, {f['band'][1]}])")
    else:
        rates = "no play scored yet"
    if f["edits_measured"]:
        edits = (f"{f['edits_measured']} edits measured, at most {f['max_knob_steps']} "
                 f"neighbour step(s) per knob ({f['edits_over_one_step']} over one step)")
    else:
        edits = "no edit measured"
    if f["edits_unmeasured"]:
        edits += f", {f['edits_unmeasured']} recorded without knob steps"
    return f"{rates}; {edits}"
