"""One function per panel of the run's plots: regret and solve rates, design outcomes, the
memory's diversity and embedding map, the trainer, held-out evaluations. Each draws on the axes it
is given and reads nothing but the run's records."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np

from spade_async.core.config.eval import PROBE_SUITES
from spade_async.report.axes import empty, minutes, same_x
from spade_async.report.curves import diversity_curve, pca_2d, rolling_mean
from spade_async.report.data import RunData, design_outcome


def plot_regret(d: RunData, ax_regret, ax_solve, solved_at: float) -> None:
    t0 = d.t0
    if d.plays:
        t = minutes(d.plays, t0)
        r = np.array([float(p.get("regret", 0.0)) for p in d.plays])
        replayed = np.array([bool(p.get("replayed")) for p in d.plays])
        ax_regret.scatter(t[~replayed], r[~replayed], s=18, label="new environment", alpha=0.8)
        ax_regret.scatter(t[replayed], r[replayed], s=18, marker="x", label="replayed",
                          alpha=0.8)
        ax_regret.plot(t, rolling_mean(r, 10), color="k", lw=1.5, label="rolling mean (10)")
        measured = [(x, float(p["hint_leak"])) for x, p in zip(t, d.plays, strict=True)
                    if p.get("hint_leak") is not None]
        if measured:  # hinted wins copied from the hint, over time
            ax_regret.plot([x for x, _ in measured], rolling_mean([v for _, v in measured], 10),
                           color="tab:red", lw=1.2, ls="--", label="hint leak, rolling (10)")
        ax_regret.set_ylabel("regret (hinted - unhinted)")
        ax_regret.set_ylim(-0.05, 1.05)
        ax_regret.legend(loc="upper left", fontsize=8)
    else:
        empty(ax_regret, "played environments")
    ax_regret.set_title("Regret per played environment")
    eps = d.episodes
    scored = ~eps.failed
    if scored.any():
        for hinted, label in ((False, "unhinted"), (True, "hinted")):
            sel = scored & (eps.hinted == hinted)
            if not sel.any():
                continue
            score = np.nan_to_num(eps.score[sel].astype(np.float64))
            t = (eps.time[sel] - t0) / 60.0
            solved = rolling_mean(score >= solved_at, 20)
            mean = rolling_mean(score, 20)
            # a week's millions of episodes drawn as at most ~4k points of the same curve
            keep = slice(None, None, max(1, len(t) // 4000))
            ax_solve.plot(t[keep], solved[keep], lw=1.8, label=f"{label} solve rate")
            ax_solve.plot(t[keep], mean[keep], lw=1, ls="--", label=f"{label} mean score")
        ax_solve.set_ylabel("rolling over 20 episodes")
        ax_solve.set_ylim(-0.05, 1.05)
        ax_solve.legend(loc="upper left", fontsize=8)
    else:
        empty(ax_solve, "episodes")
    ax_solve.set_title(f"Solve rate (score >= {solved_at:g}) and mean score, hinted vs unhinted")
    ax_solve.set_xlabel("minutes since the run started")
    if d.plays and scored.any():
        same_x(ax_regret, ax_solve)


def plot_designs(d: RunData, ax_rate, ax_reasons) -> None:
    if not d.designs:
        empty(ax_rate, "designs")
        empty(ax_reasons, "designs")
    else:
        t = minutes(d.designs, d.t0)
        acc = np.array([float(x.get("status") == "accepted") for x in d.designs])
        ax_rate.plot(t, np.cumsum(acc) / np.arange(1, len(acc) + 1), lw=1.8, label="cumulative")
        ax_rate.plot(t, rolling_mean(acc, 20), lw=1, ls="--", label="rolling (20 designs)")
        ax_rate.set_ylim(-0.05, 1.05)
        ax_rate.set_ylabel("accepted share")
        ax_rate.legend(loc="upper left", fontsize=8)
        bins = min(20, max(1, len(d.designs) // 4))
        edges = np.linspace(t.min(), t.max() + 1e-9, bins + 1)
        which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
        labels = [design_outcome(x) for x in d.designs]
        order = [k for k, _ in Counter(labels).most_common()]
        bottom = np.zeros(bins)
        width = (edges[1] - edges[0]) * 0.9
        for k in order:
            h = np.bincount(which[[lab == k for lab in labels]], minlength=bins)
            ax_reasons.bar(edges[:-1], h, width=width, bottom=bottom, align="edge", label=k)
            bottom += h
        ax_reasons.set_ylabel("designs per time bin")
        ax_reasons.legend(loc="upper left", fontsize=8, ncol=2)
        same_x(ax_rate, ax_reasons)
    ax_rate.set_title("Acceptance rate of the designer's environments")
    ax_reasons.set_title("Design outcomes: accepted, or the rejection reason")
    ax_reasons.set_xlabel("minutes since the run started")

def _accepted_vectors(d: RunData) -> tuple[list[dict], np.ndarray]:
    acc = [e for e in d.envs if e.get("status") == "accepted" and e.get("embedding")]
    if not acc:
        return [], np.zeros((0, 0))
    return acc, np.array([e["embedding"] for e in acc], dtype=np.float64)


def plot_diversity(d: RunData, ax) -> None:
    acc, vecs = _accepted_vectors(d)
    if len(acc) < 2:
        empty(ax, "two accepted environments" if not d.memory_error else "memory")
    else:
        from datetime import datetime

        created = [datetime.fromisoformat(e["created_at"]).timestamp() for e in acc]
        t0 = min([d.t0 or min(created), *created])
        t = (np.array(created) - t0) / 60.0
        ax.plot(t, diversity_curve(vecs), lw=1.8, color="C2")
        ax.set_ylabel("mean pairwise cosine distance")
        ax2 = ax.twinx()
        ax2.step(t, np.arange(1, len(t) + 1), where="post", color="0.6", lw=1)
        ax2.set_ylabel("accepted environments", color="0.4")
        ax.set_xlabel("minutes (environment stored)")
    ax.set_title("Diversity of the memory's accepted environments")


def plot_embedding_map(d: RunData, ax, fig) -> None:
    envs = [e for e in d.envs if e.get("embedding")]
    if len(envs) < 2:
        empty(ax, "stored environments" if not d.memory_error else "memory")
        ax.set_title("Environment embeddings (PCA)")
        return
    vecs = np.array([e["embedding"] for e in envs], dtype=np.float64)
    xy = pca_2d(vecs)
    accepted = np.array([e.get("status") == "accepted" for e in envs])
    regret = np.array([_num(e.get("stats", {}).get("regret_ema")) for e in envs])
    played = accepted & ~np.isnan(regret)
    ax.scatter(xy[~accepted, 0], xy[~accepted, 1], s=10, marker="x", c="0.75",
               label=f"rejected ({int((~accepted).sum())})")
    unplayed = accepted & ~played
    ax.scatter(xy[unplayed, 0], xy[unplayed, 1], s=28, facecolors="none", edgecolors="0.3",
               label=f"accepted, not played ({int(unplayed.sum())})")
    if played.any():
        sc = ax.scatter(xy[played, 0], xy[played, 1], s=40, c=regret[played], cmap="viridis",
                        vmin=0.0, vmax=max(1e-6, float(np.nanmax(regret[played]))),
                        edgecolors="k", linewidths=0.4, label=f"played ({int(played.sum())})")
        fig.colorbar(sc, ax=ax, label="regret (EMA)")
    ax.legend(loc="best", fontsize=8)
    ax.set_xlabel("PC 1")
    ax.set_ylabel("PC 2")
    ax.set_title("Environment embeddings (PCA), coloured by regret")


def _num(x: Any) -> float:
    try:
        return float(x) if x is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def plot_trainer(d: RunData, ax_loss, ax_lp) -> None:
    if not d.steps:
        empty(ax_loss, "trainer steps")
        empty(ax_lp, "trainer steps")
    else:
        step = np.array([int(s.get("step", i)) for i, s in enumerate(d.steps)])
        loss = np.array([_num(s.get("loss")) for s in d.steps])
        ax_loss.plot(step, loss, marker="o", ms=3, lw=1.2)
        ax_loss.set_ylabel("policy-gradient loss")
        lp = np.array([_num(s.get("logprob_abs_diff_mean")) for s in d.steps])
        ax_lp.plot(step, lp, marker="o", ms=3, lw=1.2, color="C3",
                   label="mean |trainer - vLLM| log p")
        ax_lp.set_ylabel("log-prob mismatch")
        versions = [(int(s["step"]), s["publish"]["version"]) for s in d.steps
                    if isinstance(s.get("publish"), dict) and s["publish"].get("ok")]
        for x, v in versions:
            for a in (ax_loss, ax_lp):
                a.axvline(x, color="0.85", lw=0.8, zorder=0)
            ax_lp.annotate(f"v{v}", (x, 0.98), xycoords=("data", "axes fraction"),
                           fontsize=7, color="0.4", ha="center", va="top")
        from matplotlib.ticker import MaxNLocator

        ax_lp.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax_lp.legend(loc="upper left", fontsize=8)
    ax_loss.set_title("Trainer loss per step (grey lines: a version published)")
    ax_lp.set_title("Trainer vs inference log-prob mismatch (sampled tokens)")
    ax_lp.set_xlabel("optimizer step")


def plot_eval(d: RunData, ax) -> None:
    if not any(r.get("suite") not in PROBE_SUITES for r in d.evals):
        empty(ax, "evaluations (`spade eval`)")
    else:
        by_suite: dict[str, list[tuple[int, float]]] = {}
        for r in d.evals:
            if r.get("suite") in PROBE_SUITES:
                continue  # not held out: its own plot, with intervals
            by_suite.setdefault(str(r.get("suite")), []).append(
                (int(r.get("version", 0)), _num(r.get("score"))))
        for suite, pts in sorted(by_suite.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=suite)
        ax.set_xlabel("policy version")
        ax.set_ylabel("held-out score")
        ax.set_ylim(-0.05, 1.05)
        ax.legend(loc="best", fontsize=8)
    ax.set_title("Held-out evaluation per policy version")
