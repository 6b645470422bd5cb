"""`spade report`: what a run did, as plots (PNG) and one HTML page that holds them.

Reads only what the processes already write, so it works on a live run or a finished one:
  <data_dir>/run/designs.jsonl     one line per design: time, status, rejection reason, version
  <data_dir>/run/episodes.jsonl    one line per episode: time, hinted, score, version
  <data_dir>/run/plays.jsonl       one line per played environment: regret, hinted/unhinted means
  the memory (LanceDB)             every stored environment, its embedding and regret stats
  <trainer root>/metrics.jsonl     one line per trainer step: loss, log-prob mismatch, version
  <data_dir>/eval/results.jsonl    evaluation scores per policy version (`spade eval`): the
                                   held-out suites, and the probe's solve rate on fixed training
                                   variants (with its 95% Wilson interval)
The designer's moves (write / edit, DESIGN §12) and the curriculum its edits set per family come
from the `move`, `family`/`name`, `params` and `variant_id` fields of designs.jsonl and
plays.jsonl (the numbers: curriculum.py); records written before those fields existed count as
writes (or replays).
Every plot renders, with "no data yet" where a source is still empty, so a report of a run that
has just started is complete too.
"""

from __future__ import annotations

import html
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from spade_async.core.config import SpadeConfig, run_dir
from spade_async.core.io import read_jsonl
from spade_async.report.curriculum import (
    CURRICULUM_HEAD,
    DESIGN_MOVES,
    PLAY_MOVES,
    PROBE,
    curriculum,
    curriculum_cells,
    curriculum_table,
    design_move,
    moves_summary,
    moves_text,
    play_move,
    probe_summary,
    probe_text,
    rate_text,
    value_text,
)


def rolling_mean(values: Iterable[float], window: int) -> np.ndarray:
    """Mean of the last `window` values at each position (fewer at the start)."""
    x = np.asarray(list(values), dtype=np.float64)
    if not len(x):
        return x
    c = np.concatenate([[0.0], np.cumsum(x)])
    idx = np.arange(1, len(x) + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def diversity_curve(vectors: np.ndarray) -> np.ndarray:
    """Mean pairwise cosine distance of the first i+1 unit vectors, for every i (NaN for i=0):
    with s = sum of the vectors, sum_{a != b} v_a . v_b = |s|^2 - n, so each point is O(d)."""
    n = len(vectors)
    out = np.full(n, np.nan)
    if n == 0:
        return out
    v = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    s = np.cumsum(v.astype(np.float64), axis=0)
    k = np.arange(1, n + 1, dtype=np.float64)
    sq = np.einsum("ij,ij->i", s, s)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_sim = (sq - k) / (k * (k - 1))
    out[1:] = 1.0 - mean_sim[1:]
    return out


def pca_2d(vectors: np.ndarray) -> np.ndarray:
    """The first two principal components (n x 2); fewer than 3 points sit on a line."""
    if len(vectors) == 0:
        return np.zeros((0, 2))
    x = vectors - vectors.mean(axis=0, keepdims=True)
    if len(vectors) < 3:
        return np.column_stack([x[:, 0], np.zeros(len(x))])
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    return x @ vt[:2].T


@dataclass
class RunData:
    designs: list[dict] = field(default_factory=list)
    episodes: list[dict] = field(default_factory=list)
    plays: list[dict] = field(default_factory=list)
    envs: list[dict] = field(default_factory=list)  # memory export, with embeddings
    steps: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    memory_error: str | None = None

    @property
    def t0(self) -> float:
        times = [float(r["time"]) for src in (self.designs, self.episodes, self.plays, self.steps)
                 for r in src if "time" in r]
        return min(times) if times else 0.0


def load_run(cfg: SpadeConfig) -> RunData:
    from spade_async.core.trainer_config import trainer_root
    from spade_async.evals.base import load_results

    rdir = run_dir(cfg)
    data = RunData(designs=read_jsonl(rdir / "designs.jsonl"),
                   episodes=[e for e in read_jsonl(rdir / "episodes.jsonl") if "time" in e],
                   plays=read_jsonl(rdir / "plays.jsonl"),
                   steps=[s for s in read_jsonl(trainer_root(cfg, cfg.trainer) / "metrics.jsonl")
                          if s.get("event") == "step"],
                   # the policy's versions; an external model's scores (spade eval --model)
                   # are no point on its curve
                   evals=[r for r in load_results(cfg.paths.data_dir) if not r.get("external")])
    try:
        data.envs = _memory_rows(cfg)
    except Exception as exc:  # a report without the memory is still a report
        data.memory_error = f"{type(exc).__name__}: {exc}"
    return data


def _memory_rows(cfg: SpadeConfig) -> list[dict]:
    import anyio

    from memory_db.store import EnvMemory
    from spade_async.core.config import memory_config

    mcfg, uri = memory_config(cfg)
    if "://" not in uri and not Path(uri).is_dir():
        return []

    async def main() -> list[dict]:
        mem = EnvMemory(mcfg, uri, writable=False)
        await mem.open()
        return [r async for r in mem.export(code=False, embeddings=True)]

    return anyio.run(main)


# ---- plots ---------------------------------------------------------------------------------


def _minutes(records: list[dict], t0: float) -> np.ndarray:
    return np.array([(float(r["time"]) - t0) / 60.0 for r in records])


def _empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} yet", ha="center", va="center", transform=ax.transAxes,
            color="0.5", fontsize=12)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_regret(d: RunData, ax_regret, ax_solve, solved_at: float) -> None:
    t0 = d.t0
    if d.plays:
        t = _minutes(d.plays, t0)
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
        _empty(ax_regret, "played environments")
    ax_regret.set_title("Regret per played environment")
    eps = [e for e in d.episodes if not e.get("error")]
    if eps:
        for hinted, label in ((False, "unhinted"), (True, "hinted")):
            sel = [e for e in eps if bool(e.get("hinted")) is hinted]
            if not sel:
                continue
            solved = [float(float(e.get("score", 0.0)) >= solved_at) for e in sel]
            score = [float(e.get("score", 0.0)) for e in sel]
            t = _minutes(sel, t0)
            ax_solve.plot(t, rolling_mean(solved, 20), lw=1.8, label=f"{label} solve rate")
            ax_solve.plot(t, rolling_mean(score, 20), lw=1, ls="--",
                          label=f"{label} mean score")
        ax_solve.set_ylabel("rolling over 20 episodes")
        ax_solve.set_ylim(-0.05, 1.05)
        ax_solve.legend(loc="upper left", fontsize=8)
    else:
        _empty(ax_solve, "episodes")
    ax_solve.set_title(f"Solve rate (score >= {solved_at:g}) and mean score, hinted vs unhinted")
    ax_solve.set_xlabel("minutes since the run started")
    if d.plays and eps:
        _same_x(ax_regret, ax_solve)


def plot_designs(d: RunData, ax_rate, ax_reasons) -> None:
    if not d.designs:
        _empty(ax_rate, "designs")
        _empty(ax_reasons, "designs")
    else:
        t = _minutes(d.designs, d.t0)
        acc = np.array([float(x.get("status") == "accepted") for x in d.designs])
        ax_rate.plot(t, np.cumsum(acc) / np.arange(1, len(acc) + 1), lw=1.8, label="cumulative")
        ax_rate.plot(t, rolling_mean(acc, 20), lw=1, ls="--", label="rolling (20 designs)")
        ax_rate.set_ylim(-0.05, 1.05)
        ax_rate.set_ylabel("accepted share")
        ax_rate.legend(loc="upper left", fontsize=8)
        bins = min(20, max(1, len(d.designs) // 4))
        edges = np.linspace(t.min(), t.max() + 1e-9, bins + 1)
        which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
        labels = [_outcome(x) for x in d.designs]
        order = [k for k, _ in Counter(labels).most_common()]
        bottom = np.zeros(bins)
        width = (edges[1] - edges[0]) * 0.9
        for k in order:
            h = np.bincount(which[[lab == k for lab in labels]], minlength=bins)
            ax_reasons.bar(edges[:-1], h, width=width, bottom=bottom, align="edge", label=k)
            bottom += h
        ax_reasons.set_ylabel("designs per time bin")
        ax_reasons.legend(loc="upper left", fontsize=8, ncol=2)
        _same_x(ax_rate, ax_reasons)
    ax_rate.set_title("Acceptance rate of the designer's environments")
    ax_reasons.set_title("Design outcomes: accepted, or the rejection reason")
    ax_reasons.set_xlabel("minutes since the run started")


def _outcome(design: dict) -> str:
    if design.get("status") == "accepted":
        return "accepted"
    return design.get("reason") or design.get("status") or "rejected"


def _accepted_vectors(d: RunData) -> tuple[list[dict], np.ndarray]:
    acc = [e for e in d.envs if e.get("status") == "accepted" and e.get("embedding")]
    if not acc:
        return [], np.zeros((0, 0))
    return acc, np.array([e["embedding"] for e in acc], dtype=np.float64)


def plot_diversity(d: RunData, ax) -> None:
    acc, vecs = _accepted_vectors(d)
    if len(acc) < 2:
        _empty(ax, "two accepted environments" if not d.memory_error else "memory")
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
        _empty(ax, "stored environments" if not d.memory_error else "memory")
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
        _empty(ax_loss, "trainer steps")
        _empty(ax_lp, "trainer steps")
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
    if not any(r.get("suite") != PROBE for r in d.evals):
        _empty(ax, "evaluations (`spade eval`)")
    else:
        by_suite: dict[str, list[tuple[int, float]]] = {}
        for r in d.evals:
            if r.get("suite") == PROBE:
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


# ---- designer moves, the curriculum, the probe ---------------------------------------------

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
            t = np.sort(_minutes(recs, t0))
            ax.step(t, np.arange(1, len(t) + 1), where="post", ls=ls, color=f"C{i}",
                    lw=1.6, label=f"{m} {stage}")
            drawn = True
    for j, m in enumerate(PLAY_MOVES[2:]):
        recs = [p for p in d.plays if play_move(p) == m]
        if recs:
            t = np.sort(_minutes(recs, t0))
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
        _empty(ax, "designs")
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
        _empty(axes[0], "family with knobs played")
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
    rows = probe_summary(d.evals)
    if not rows:
        _empty(ax, "probe evaluations (`spade eval --suite probe`)")
    else:
        x = np.array([r["version"] for r in rows])
        y = np.array([r["solved"] / r["n"] if r["n"] else np.nan for r in rows])
        lo = np.array([r["ci95"][0] for r in rows])
        hi = np.array([r["ci95"][1] for r in rows])
        ax.errorbar(x, y, yerr=[np.maximum(0, y - lo), np.maximum(0, hi - y)], marker="o",
                    capsize=4, lw=1.5)
        for r, xi, yi in zip(rows, x, y, strict=True):
            ax.annotate(f"n={r['n']}", (xi, yi), textcoords="offset points", xytext=(6, 4),
                        fontsize=7, color="0.4")
        ax.set_xlabel("policy version")
        ax.set_ylabel("unhinted solve rate")
        ax.set_ylim(-0.05, 1.05)
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Probe: solve rate on fixed training variants per version (95% Wilson "
                 "interval)")


# ---- the report ----------------------------------------------------------------------------


PLOTS: list[tuple[str, str, str]] = [
    ("regret.png", "Regret and solve rates",
     "Top: regret (mean hinted score minus mean unhinted score) of every played environment, "
     "new and replayed, with its rolling mean. Bottom: solve rate and mean score of hinted and "
     "unhinted episodes, rolling over 20 episodes."),
    ("designs.png", "Acceptance and rejections",
     "Share of the designer's proposals accepted into the memory, and every design's outcome per "
     "time bin: accepted or the first failing check (no_code, static.parse, sandbox checks, "
     "duplicate)."),
    ("diversity.png", "Memory diversity",
     "Mean pairwise cosine distance of the accepted environments' embeddings as each was stored "
     "(grey: how many there were)."),
    ("embedding_map.png", "Embedding map",
     "Every stored environment projected on the first two principal components of its "
     "embedding; played ones coloured by their regret EMA, rejected ones as grey crosses."),
    ("trainer.png", "Trainer",
     "Loss per optimizer step and the mean absolute difference between the trainer's and the "
     "inference server's log-probs of the sampled tokens; grey lines mark published versions."),
    ("eval.png", "Held-out evaluation",
     "Scores per held-out suite for each evaluated policy version (`spade eval`)."),
    ("moves.png", "Designer moves",
     "Cumulative counts per move over time: designs proposed (solid), accepted (dashed) and "
     "played with a score (dotted), for writes (new modules) and edits (new knob settings of a "
     "stored environment); grey: plays of the replay sampler and of the fixed baseline."),
    ("curriculum.png", "Curriculum",
     "Per family with knobs (the most edited first): the knob values its edits chose over "
     "time, one line per knob, from the family's first played setting; markers are its plays, "
     "coloured by their unhinted solve rate. The table gives each knob's first and last value "
     "and the solve rate at the first and at the last setting."),
    ("probe.png", "Probe",
     "Unhinted solve rate on the probe set (fixed training variants, fixed seeds: `spade eval "
     "--suite probe`) per policy version, with its 95% Wilson interval."),
]


def _curriculum_panels(d: RunData, cfg: SpadeConfig) -> int:
    return max(1, min(MAX_CURRICULUM_PANELS,
                      len(curriculum(d.designs, d.plays, d.t0,
                                 cfg.validation.solution_score))))


# file -> (panels, or a function of the data giving them; inches per panel;
#          draw(data, axes, figure, config))
LAYOUT: dict[str, tuple[int | Callable[[RunData, SpadeConfig], int], float,
                        Callable[[RunData, list, Any, SpadeConfig], None]]] = {
    "regret.png": (2, 3.2, lambda d, ax, fig, cfg: plot_regret(d, *ax,
                                                                cfg.validation.solution_score)),
    "designs.png": (2, 3.2, lambda d, ax, fig, cfg: plot_designs(d, *ax)),
    "diversity.png": (1, 3.6, lambda d, ax, fig, cfg: plot_diversity(d, *ax)),
    "embedding_map.png": (1, 6.5, lambda d, ax, fig, cfg: plot_embedding_map(d, *ax, fig)),
    "trainer.png": (2, 3.2, lambda d, ax, fig, cfg: plot_trainer(d, *ax)),
    "eval.png": (1, 3.6, lambda d, ax, fig, cfg: plot_eval(d, *ax)),
    "moves.png": (1, 3.6, lambda d, ax, fig, cfg: plot_moves(d, *ax)),
    "curriculum.png": (_curriculum_panels, 2.8, lambda d, ax, fig, cfg: plot_curriculum(
        d, ax, fig, cfg.validation.solution_score)),
    "probe.png": (1, 3.6, lambda d, ax, fig, cfg: plot_probe(d, *ax)),
}


def _same_x(*axes) -> None:
    """Panels over the same minutes get the same x range."""
    lo = min(a.get_xlim()[0] for a in axes)
    hi = max(a.get_xlim()[1] for a in axes)
    for a in axes:
        a.set_xlim(lo, hi)


def _leak_summary(plays: list[dict]) -> dict[str, Any]:
    """Plays whose hinted wins were copied from the hint: how many were measured and flagged,
    the mean leak, and the flagged share per quarter of the run (the leak rate over time)."""
    measured = [p for p in plays if p.get("hint_leak") is not None]
    flagged = [bool(p.get("leak_flagged")) for p in measured]
    quarters = [flagged[i * len(flagged) // 4:(i + 1) * len(flagged) // 4] for i in range(4)]
    return {"plays": len(measured), "flagged": sum(flagged),
            "mean": round(sum(float(p["hint_leak"]) for p in measured) / len(measured), 4)
            if measured else None,
            "flagged_share_by_quarter": [round(sum(q) / len(q), 3) if q else None
                                         for q in quarters]}


def summary(cfg: SpadeConfig, d: RunData) -> dict[str, Any]:
    fams = curriculum(d.designs, d.plays, d.t0, cfg.validation.solution_score)
    outcomes = Counter(_outcome(x) for x in d.designs)
    regrets = [float(p.get("regret", 0.0)) for p in d.plays]
    published = [s["publish"]["version"] for s in d.steps
                 if isinstance(s.get("publish"), dict) and s["publish"].get("ok")]
    return {
        "data_dir": str(cfg.paths.data_dir),
        "minutes": round((max(float(r["time"]) for r in d.designs + d.episodes + d.steps)
                          - d.t0) / 60.0, 1) if (d.designs or d.episodes or d.steps) else 0.0,
        "designs": len(d.designs),
        "accepted": outcomes.get("accepted", 0),
        "rejected_by_reason": {k: v for k, v in outcomes.most_common() if k != "accepted"},
        "memory": {"stored": len(d.envs),
                   "accepted": sum(e.get("status") == "accepted" for e in d.envs),
                   "error": d.memory_error},
        "episodes": len(d.episodes),
        # failed on the endpoint or in the sandbox: never scores, counted here by kind
        "episodes_failed": dict(Counter(e.get("error_kind") or "unknown" for e in d.episodes
                                        if e.get("error"))),
        "episode_versions": sorted({int(e.get("policy_version", 0)) for e in d.episodes}),
        "envs_played": len(d.plays),
        "regret_mean": round(sum(regrets) / len(regrets), 4) if regrets else None,
        "hint_leak": _leak_summary(d.plays),
        "trainer_steps": len(d.steps),
        "versions_published": published,
        "evaluations": len(d.evals),
        "moves": moves_summary(d.designs, d.plays, d.t0),
        "curriculum": curriculum_table(fams),
        "curriculum_families": fams,
        "probe": probe_summary(d.evals),
        "saturation": _saturation(cfg),
    }


def _saturation(cfg: SpadeConfig) -> dict[str, Any]:
    """Per endpoint, the run's mean saturation from the daemon's last status (while running,
    while waiting for the trainer, and the share of time it waited)."""
    try:
        st = json.loads((run_dir(cfg) / "status.json").read_text())
    except (OSError, ValueError):
        return {}
    return {ep["name"]: ep.get("saturation_run") for ep in st.get("endpoints", [])}


def write_report(cfg: SpadeConfig, out: Path,
                 progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Render every plot into `out` and the page `out/index.html`; returns the summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    progress("reading the run's logs, the memory and the trainer's metrics")
    d = load_run(cfg)

    files = []
    for name, _, _ in PLOTS:
        progress(f"plotting {name}")
        panels, inches, draw = LAYOUT[name]
        if callable(panels):
            panels = panels(d, cfg)
        fig, axes = plt.subplots(panels, 1, figsize=(9, inches * panels), squeeze=False)
        draw(d, [a[0] for a in axes], fig, cfg)
        if not fig.get_layout_engine():  # a colorbar over several panels set its own
            fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        files.append(str(out / name))
    s = summary(cfg, d)
    s["files"] = files + [str(out / "index.html")]
    (out / "index.html").write_text(_html(s), encoding="utf-8")
    (out / "summary.json").write_text(json.dumps(s, indent=2))
    return s


def _html_table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "\n".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                     for r in rows)
    return f"<table><tr>{cells}</tr>\n{body}</table>"


def _html(s: dict[str, Any]) -> str:
    rows = [("run data", s["data_dir"]), ("minutes covered", s["minutes"]),
            ("designs", f"{s['designs']} ({s['accepted']} accepted)"),
            ("rejections", ", ".join(f"{k} {v}" for k, v in s["rejected_by_reason"].items())
             or "none"),
            ("memory", f"{s['memory']['stored']} stored, {s['memory']['accepted']} accepted"
             + (f" (unreadable: {s['memory']['error']})" if s["memory"]["error"] else "")),
            ("episodes", f"{s['episodes']} on policy versions {s['episode_versions']}"),
            ("environments played", f"{s['envs_played']}, mean regret {s['regret_mean']}"),
            ("trainer", f"{s['trainer_steps']} steps, versions published "
             f"{s['versions_published']}"),
            ("evaluations", s["evaluations"]),
            ("designer moves", moves_text(s["moves"])),
            ("probe", "; ".join(probe_text(r) for r in s["probe"]) or "not run yet")]
    table = "\n".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                      for k, v in rows)
    extra = {
        "curriculum.png": _html_table(CURRICULUM_HEAD,
                                      [curriculum_cells(r) for r in s["curriculum"]])
        if s["curriculum"] else "<p>No family with knobs played yet.</p>",
        "probe.png": _html_table(("version", "solved", "n", "solve rate", "95% interval"), [
            (str(r["version"]), str(r["solved"]), str(r["n"]),
             rate_text(r["solved"] / r["n"] if r["n"] else None, r["n"]),
             f"[{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]") for r in s["probe"]])
        if s["probe"] else "",
    }
    sections = "\n".join(
        f'<section><h2>{html.escape(title)}</h2><p>{html.escape(caption)}</p>'
        f'<a href="{name}"><img src="{name}" alt="{html.escape(title)}"></a>'
        f'{extra.get(name, "")}</section>'
        for name, title, caption in PLOTS)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>SPADE-async run report</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;color:#222}}
table{{border-collapse:collapse}}th,td{{text-align:left;padding:2px 12px 2px 0}}
img{{max-width:100%;border:1px solid #ddd}}section{{margin-top:2em}}</style></head>
<body><h1>SPADE-async run report</h1>
<table>
{table}
</table>
{sections}
</body></html>
"""
