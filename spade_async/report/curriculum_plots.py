"""The panels of the designer's moves, the curriculum its edits set per family, and the probe's
solve rate per version (the numbers come from curriculum.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from spade_async.core.config.eval import PROBE_SUITES
from spade_async.report.axes import empty, minutes
from spade_async.report.curriculum import (
    DESIGN_MOVES,
    PLAY_MOVES,
    curriculum,
    design_move,
    play_move,
    probe_summary,
    rate_text,
    value_text,
)
from spade_async.report.data import RunData


def plot_moves(d: RunData, ax) -> None:
    stages = (("proposed", "-"), ("accepted", "--"), ("played", ":"))
    drawn = False
    t0 = d.t0
    for i, m in enumerate(DESIGN_MOVES):
        for stage, ls in stages:
            if stage == "played":
                recs = [p for p in d.plays if play_move(p) == m]
            else:
                recs = [x for x in d.designs if design_move(x) == m
                        and (stage == "proposed" or x.get("status") == "accepted")]
            if not recs:
                continue
            t = np.sort(minutes(recs, t0))
            ax.step(t, np.arange(1, len(t) + 1), where="post", ls=ls, color=f"C{i}",
                    lw=1.6, label=f"{m} {stage}")
            drawn = True
    for j, m in enumerate(PLAY_MOVES[2:]):
        recs = [p for p in d.plays if play_move(p) == m]
        if recs:
            t = np.sort(minutes(recs, t0))
            ax.step(t, np.arange(1, len(t) + 1), where="post", color=f"{0.35 + 0.25 * j}",
                    lw=1.2, label=f"{m} played")
            drawn = True
    if drawn:
        from matplotlib.ticker import MaxNLocator

        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("cumulative count")
        ax.set_xlabel("minutes since the run started")
        ax.legend(loc="upper left", fontsize=8, ncol=2)
    else:
        empty(ax, "designs")
    ax.set_title("Designer moves: proposed, accepted and played, by kind")


MAX_CURRICULUM_PANELS = 12


def _knob_axis(values: list[Any], scaled: bool) -> tuple[list[float], list[str]]:
    """A knob's values as y positions: numbers as they are (bools as 0/1), anything else by
    order of first appearance (then also the tick labels); `scaled` maps them onto [0, 1]."""
    cats: list[str] = []
    if all(isinstance(v, (int, float)) for v in values):
        ys = [float(v) for v in values]
    else:
        cats = list(dict.fromkeys(value_text(v) for v in values))
        ys = [float(cats.index(value_text(v))) for v in values]
    if scaled and ys:
        lo, hi = min(ys), max(ys)
        ys = [(y - lo) / (hi - lo) if hi > lo else 0.5 for y in ys]
    return ys, cats


def _rate_text(r: dict[str, Any]) -> str:
    return rate_text(r["rate"], r["n"])


def plot_curriculum(d: RunData, axes: list, fig, solved_at: float) -> None:
    fams = curriculum(d.designs, d.plays, d.t0, solved_at)[:MAX_CURRICULUM_PANELS]
    if not fams:
        empty(axes[0], "family with knobs played")
        axes[0].set_title("Curriculum: knob values chosen by edits")
        return
    markers = "osD^v<>p"
    sc = None
    for ax, f in zip(axes, fams, strict=False):
        # The knobs the edits moved (all of them while none has moved); the table has the rest.
        drawn = [k for k in f["knobs"] if k["changes"]] or f["knobs"]
        scaled = len(drawn) > 1  # knobs of different ranges share the panel
        end = max([pt["minute"] for pt in f["series"]] + [p["minute"] for p in f["plays_at"]])
        for i, k in enumerate(drawn):
            knob = k["knob"]
            pts = [pt for pt in f["series"] if knob in pt["params"]]
            pls = [p for p in f["plays_at"] if knob in p["params"] and p["n"]]
            ys, cats = _knob_axis([pt["params"][knob] for pt in pts]
                                  + [p["params"][knob] for p in pls], scaled)
            if pts:
                line = ys[:len(pts)]
                ax.step([pt["minute"] for pt in pts] + [end], line + line[-1:], where="post",
                        color=f"C{i}", lw=1.6,
                        label=f"{knob}: {value_text(k['first'])} -> {value_text(k['last'])}")
            if pls:
                sc = ax.scatter([p["minute"] for p in pls], ys[len(pts):],
                                c=[p["solved"] / p["n"] for p in pls], cmap="RdYlGn",
                                vmin=0.0, vmax=1.0, marker=markers[i % len(markers)], s=36,
                                edgecolors="k", linewidths=0.4, zorder=3)
            if cats and not scaled:
                ax.set_yticks(range(len(cats)), cats)
        ax.set_ylabel("knob value" + (" (scaled to its range)" if scaled else ""), fontsize=8)
        ax.legend(loc="best", fontsize=7)
        ax.set_title(f"{f['family']}: {f['edits']} edits; unhinted solve rate "
                     f"{_rate_text(f['solve_first'])} at the first setting, "
                     f"{_rate_text(f['solve_last'])} at the last", fontsize=9)
    for ax in axes[len(fams):]:
        ax.set_visible(False)
    axes[len(fams) - 1].set_xlabel("minutes since the run started (markers: plays, coloured "
                                   "by their unhinted solve rate)")
    if sc is not None:
        fig.set_layout_engine("constrained")  # tight_layout cannot place a shared colorbar
        fig.colorbar(sc, ax=axes[:len(fams)], label="unhinted solve rate of the play",
                     fraction=0.03, pad=0.01)


def plot_probe(d: RunData, ax) -> None:
    drawn = False
    for i, suite in enumerate(PROBE_SUITES):  # sampled at the rollout's temperature, greedy
        rows = probe_summary(d.evals, suite)
        if not rows:
            continue
        drawn = True
        x = np.array([r["version"] for r in rows], dtype=float) + 0.08 * i  # side by side
        y = np.array([r["solved"] / r["n"] if r["n"] else np.nan for r in rows])
        lo = np.array([r["ci95"][0] for r in rows])
        hi = np.array([r["ci95"][1] for r in rows])
        ax.errorbar(x, y, yerr=[np.maximum(0, y - lo), np.maximum(0, hi - y)], marker="o",
                    capsize=4, lw=1.5, color=f"C{i}", label=suite)
        for r, xi, yi in zip(rows, x, y, strict=True):
            ax.annotate(f"n={r['n']}", (xi, yi), textcoords="offset points", xytext=(6, 4),
                        fontsize=7, color="0.4")
    if not drawn:
        empty(ax, "probe evaluations (`spade eval --suite probe --suite probe-greedy`)")
    else:
        ax.set_xlabel("policy version")
        ax.set_ylabel("unhinted solve rate")
        ax.set_ylim(-0.05, 1.05)
        ax.legend(loc="best", fontsize=8)
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Probe: solve rate on fixed training variants per version, sampled and "
                 "greedy (95% Wilson interval)")
