"""`spade experiment report`: the arms side by side. Per suite, one table (strict and lenient
mean score with 95% intervals and task counts, per evaluated version, arm against arm, and the
difference at the last version common to both), one plot (over versions and over the loop's
minutes), and paired differences task by task: each arm's last version against its first, and
the first arm against each other at their last versions (`spade - fixed / probe (v7 vs v5):
+0.040 [-0.030, +0.110] (n=200, ...)`); the diversity of what each arm played and accepted
over time (the collapse question); and the cost ledger. Writes <experiment>/report/
(summary.json, index.html, PNGs)."""

from __future__ import annotations

import html
import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from spade_async.core.io import atomic_write_text
from spade_async.evals.paired import compare_stored, first_to_last, paired_text
from spade_async.experiment.decontam import arm_decontamination
from spade_async.experiment.layout import arm_config_path, arm_dir, arm_environment
from spade_async.experiment.ledger import ledger
from spade_async.experiment.results import Point, arm_points, difference
from spade_async.experiment.state import ExperimentState
from spade_async.report.curves import diversity_curve

WINDOW = 20  # plays in the trailing window of the effective number of variants


def variant_diversity(plays: list[dict], t0: float) -> dict[str, list[float]]:
    """Over the plays in time order: the minutes, the distinct variants played so far, and the
    effective number of variants among the last WINDOW plays (exp of the entropy of their
    variant ids: WINDOW when every play is another variant, 1 when they are all the same)."""
    out: dict[str, list[float]] = {"minutes": [], "distinct": [], "effective": []}
    seen: set[str] = set()
    recent: list[str] = []
    for p in sorted(plays, key=lambda r: r.get("time", 0)):
        vid = str(p.get("variant_id") or p.get("env_id"))
        seen.add(vid)
        recent = (recent + [vid])[-WINDOW:]
        counts = Counter(recent).values()
        h = -sum(c / len(recent) * math.log(c / len(recent)) for c in counts)
        out["minutes"].append(round((float(p.get("time", t0)) - t0) / 60, 3))
        out["distinct"].append(len(seen))
        out["effective"].append(round(math.exp(h), 3))
    return out


def accepted_diversity(envs: list[dict], t0: float) -> dict[str, list[float]]:
    """Mean pairwise cosine distance of the accepted environments' embeddings, as they were
    stored (seeds included)."""
    from datetime import datetime

    acc = sorted((e for e in envs if e.get("status") == "accepted" and e.get("embedding")),
                 key=lambda e: e.get("created_at") or "")
    if not acc:
        return {"minutes": [], "distance": [], "count": []}
    created = [datetime.fromisoformat(e["created_at"]).timestamp() for e in acc]
    curve = diversity_curve(np.array([e["embedding"] for e in acc], dtype=np.float64))
    return {"minutes": [round((c - t0) / 60, 3) for c in created],
            "distance": [None if math.isnan(x) else round(float(x), 4) for x in curve],
            "count": list(range(1, len(acc) + 1))}


def _arm_keys(cfg_path: Path) -> dict[str, Any]:
    """The tables an arm.toml sets itself (its file, without the `extends`)."""
    import tomllib

    return {k: v for k, v in tomllib.loads(cfg_path.read_text()).items() if k != "extends"}


def collect(exp_dir: Path) -> dict[str, Any]:
    """Everything the report shows, as plain data (what --json prints)."""
    from spade_async.envs.seed_checks import load_checked_config
    from spade_async.evals.base import load_results
    from spade_async.report.data import load_run

    state = ExperimentState.load(exp_dir)
    arms: dict[str, Any] = {}
    for arm in state.arms:
        st = state.arm[arm]
        data = arm_dir(exp_dir, arm)
        cfg_path = arm_config_path(exp_dir, arm)
        if not cfg_path.exists():
            arms[arm] = {"status": st.status, "points": {}, "ledger": None}
            continue
        # as the arm's processes read it: its own keys win over the shell's SPADE__* variables
        arm_cfg = load_checked_config(cfg_path, arm_environment(os.environ, _arm_keys(cfg_path))[0])
        run = load_run(arm_cfg)
        t0 = st.first_started or run.t0
        points = arm_points(data, t0)
        evals = [r for r in load_results(data) if not r.get("external")]
        arms[arm] = {
            "status": st.status, "budget_spent": st.budget_spent,
            "loop_minutes": round(st.elapsed_s / 60, 2), "runs": len(st.runs),
            "points": {s: [p.as_dict() for p in pts] for s, pts in points.items()},
            "ledger": ledger(run, evals, points, st.elapsed_s),
            # per suite: its last evaluated version minus its first, task by task
            "paired": {suite: p for suite in points
                       if (p := first_to_last(data, evals, suite)) is not None},
            "diversity": {"played": variant_diversity(run.plays, t0),
                          "accepted": accepted_diversity(run.envs, t0)},
            "memory_error": run.memory_error,
            # how near each held-out suite's tasks come to the arm's training environments
            "decontamination": arm_decontamination(arm_cfg, list(points), run.envs),
        }
    return {"name": state.name, "budget": state.budget, "arms": arms,
            "comparison": _compare(state.arms, arms),
            "paired_arms": _paired_arms(exp_dir, state.arms, arms)}


def _compare(names: list[str], arms: dict[str, Any]) -> dict[str, Any]:
    """First arm against each other arm, per suite, at the last version both evaluated."""
    out: dict[str, Any] = {}
    if len(names) < 2:
        return out
    a = names[0]
    for b in names[1:]:
        for suite, pts_a in arms[a].get("points", {}).items():
            pts_b = {p["version"]: p for p in arms[b].get("points", {}).get(suite, [])}
            common = [p for p in pts_a if p["version"] in pts_b]
            if not common:
                continue
            pa, pb = Point(**common[-1]), Point(**pts_b[common[-1]["version"]])
            row = {"version": pa.version}
            for kind in ("strict", "lenient"):
                d, lo, hi = difference(pa, pb, lenient=kind == "lenient")
                row[kind] = {"difference": round(d, 4), "ci95": [round(lo, 4), round(hi, 4)],
                             "verdict": (f"{a} ahead" if lo > 0 else f"{b} ahead" if hi < 0
                                         else "within noise")}
            out[f"{a} vs {b} / {suite}"] = row
    return out


def _paired_arms(exp_dir: Path, names: list[str], arms: dict[str, Any]) -> dict[str, Any]:
    """First arm minus each other arm, per suite, each at its own last evaluated version,
    paired task by task: every arm plays the same tasks (the probe's variants and seeds, the
    held-out suites' fixed seeds), so the tasks match by id across the arms' data dirs."""
    out: dict[str, Any] = {}
    if len(names) < 2:
        return out
    a = names[0]
    for b in names[1:]:
        pts_b = arms[b].get("points", {})
        for suite, pts_a in arms[a].get("points", {}).items():
            if not pts_a or not pts_b.get(suite):
                continue
            va, vb = pts_a[-1]["version"], pts_b[suite][-1]["version"]
            p = compare_stored(suite, (arm_dir(exp_dir, b), vb), (arm_dir(exp_dir, a), va))
            if p is not None:
                out[f"{a} - {b} / {suite}"] = {**p, "arms": [a, b], "versions": [va, vb]}
    return out


# ---- text -----------------------------------------------------------------------------------


def _ci(mean: float, ci: list[float]) -> str:
    return f"{mean:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def text(rep: dict[str, Any]) -> str:
    lines = [f"experiment {rep['name']} · budget {rep['budget']}"]
    arms = rep["arms"]
    for arm, a in arms.items():
        lines.append(f"  arm {arm}: {a['status']}"
                     + (f", {a.get('budget_spent')}, loop {a.get('loop_minutes')} min"
                        if a.get("ledger") else ""))
    suites = sorted({s for a in arms.values() for s in a.get("points", {})})
    for suite in suites:
        lines += ["", f"{suite}: mean score [95% interval], strict | lenient, scored/n"]
        versions = sorted({p["version"] for a in arms.values()
                           for p in a.get("points", {}).get(suite, [])})
        for v in versions:
            cells = []
            for arm, a in arms.items():
                p = next((x for x in a.get("points", {}).get(suite, []) if x["version"] == v),
                         None)
                cells.append(f"{arm} " + (f"{_ci(p['strict'], p['strict_ci'])} | "
                                          f"{_ci(p['lenient'], p['lenient_ci'])} "
                                          f"{p['scored']}/{p['n']}" if p else "-"))
            lines.append(f"  v{v:<3} " + "   ".join(cells))
    if suites:
        from spade_async.evals import CATEGORIES

        order = ["reasoning", "code", "games", "tool use", "training probe"]
        by_cat: dict[str, list[str]] = {}
        for suite in suites:
            by_cat.setdefault(CATEGORIES.get(suite, "other"), []).append(suite)
        lines += ["", "per category (the paper's table), each arm's first and last evaluated "
                  "version: strict mean [95% interval], n scored"]
        for cat in order + sorted(set(by_cat) - set(order)):
            for suite in by_cat.get(cat, []):
                cells = []
                for arm, a in arms.items():
                    pts = a.get("points", {}).get(suite, [])
                    cells.append(f"{arm} " + (" -> ".join(
                        f"v{p['version']} {_ci(p['strict'], p['strict_ci'])} n={p['scored']}"
                        for p in ([pts[0], pts[-1]] if len(pts) > 1 else pts)) if pts else "-"))
                lines.append(f"  {cat:15s} {suite:19s} " + "   ".join(cells))
    if rep["comparison"]:
        lines += ["", "difference at the last version both evaluated (95% interval):"]
        for key, row in rep["comparison"].items():
            lines.append(f"  {key} (v{row['version']}): strict {row['strict']['difference']:+.3f} "
                         f"{row['strict']['ci95']} {row['strict']['verdict']}; lenient "
                         f"{row['lenient']['difference']:+.3f} {row['lenient']['ci95']} "
                         f"{row['lenient']['verdict']}")
    paired = [(f"{arm} / {suite}: v{p['after']} - v{p['before']}", p)
              for arm, a in arms.items() for suite, p in a.get("paired", {}).items()]
    paired += [(f"{key} (v{p['versions'][0]} vs v{p['versions'][1]})", p)
               for key, p in rep.get("paired_arms", {}).items()]
    if paired:
        lines += ["", "paired, task by task on the same tasks (mean difference [95% interval]): "
                  "each arm's last version against its first, and arm against arm at their "
                  "last versions"]
        lines += [f"  {label}: {paired_text(p)}" for label, p in paired]
    decon = [(arm, suite, d) for arm, a in arms.items()
             for suite, d in (a.get("decontamination") or {}).get("suites", {}).items()]
    if decon:
        lines += ["", "decontamination: each held-out suite's nearest training environment "
                  "(cosine distance of the embeddings; 0 = reads alike):"]
        lines += [f"  {arm} / {suite}: nearest {d['min_distance']:.3f} "
                  f"({d['closest']['environment']}), median over its {d['tasks']} tasks "
                  f"{d['median_nearest_distance']:.3f}, {d['environments']} environments"
                  for arm, suite, d in decon]
    lines += ["", "cost ledger (busy seconds / tokens sampled):"]
    for arm, a in arms.items():
        led = a.get("ledger")
        if not led:
            continue
        st = led["stages"]
        lines.append(f"  {arm}: " + ", ".join(f"{k} {v['seconds']:.0f} s / {v['tokens']}"
                                              for k, v in st.items()))
        acc = led["accepted"]
        per = led["per_accepted"]
        lines.append(f"    accepted {acc['environments']} environments, {acc['variants']} "
                     f"variants" + (f"; per accepted: {per['seconds']} s designing + validating, "
                                    f"{per['tokens']} tokens" if per else "")
                     + (f"; designing+validating / playing+training = "
                        f"{led['design_to_training']}" if led["design_to_training"] is not None
                        else ""))
        for suite, pp in led["seconds_per_point"].items():
            lines.append(f"    {suite}: busy seconds per point gained: strict {pp['strict']}, "
                         f"lenient {pp['lenient']} (gain {pp['gain_points']})")
        div = a["diversity"]["played"]
        if div["distinct"]:
            lines.append(f"    played {div['distinct'][-1]} distinct variants; effective number "
                         f"in the last {WINDOW} plays: {div['effective'][-1]}")
    return "\n".join(lines)


# ---- files ----------------------------------------------------------------------------------


def write(exp_dir: Path, rep: dict[str, Any]) -> Path:
    out = exp_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "summary.json", json.dumps(rep, indent=1))
    pngs = _plots(rep, out)
    atomic_write_text(out / "report.txt", text(rep) + "\n")
    body = "".join(f'<h2>{html.escape(p.stem)}</h2><img src="{p.name}" width="900">'
                   for p in pngs)
    atomic_write_text(out / "index.html",
                      f"<html><body><h1>experiment {html.escape(rep['name'])}</h1>"
                      f"<pre>{html.escape(text(rep))}</pre>{body}</body></html>")
    return out


def _plots(rep: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    arms = rep["arms"]
    suites = sorted({s for a in arms.values() for s in a.get("points", {})})
    for suite in suites:
        fig, (ax_v, ax_t) = plt.subplots(1, 2, figsize=(12, 4.2))
        for i, (arm, a) in enumerate(arms.items()):
            pts = a.get("points", {}).get(suite, [])
            if not pts:
                continue
            for kind, style in (("strict", "-"), ("lenient", "--")):
                y = np.array([p[kind] for p in pts])
                lo = np.array([p[f"{kind}_ci"][0] for p in pts])
                hi = np.array([p[f"{kind}_ci"][1] for p in pts])
                for ax, xs in ((ax_v, [p["version"] for p in pts]),
                               (ax_t, [p["minutes"] or 0.0 for p in pts])):
                    ax.plot(xs, y, style, marker="o", color=f"C{i}", label=f"{arm} {kind}")
                    ax.fill_between(xs, lo, hi, color=f"C{i}", alpha=0.1 if kind == "strict"
                                    else 0.05)
        ax_v.set_xlabel("policy version")
        ax_t.set_xlabel("minutes of the arm's loop")
        for ax in (ax_v, ax_t):
            ax.set_ylabel("mean score (95% interval)")
            ax.set_ylim(-0.02, 1.02)
            ax.legend(fontsize=8)
        fig.suptitle(f"{suite}: arm against arm")
        fig.tight_layout()
        path = out / f"suite-{suite}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        files.append(path)
    fig, (ax_p, ax_a) = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, (arm, a) in enumerate(arms.items()):
        div = a.get("diversity")
        if not div:
            continue
        played, acc = div["played"], div["accepted"]
        ax_p.plot(played["minutes"], played["effective"], color=f"C{i}",
                  label=f"{arm}: effective variants, last {WINDOW} plays")
        ax_p.plot(played["minutes"], played["distinct"], "--", color=f"C{i}",
                  label=f"{arm}: distinct variants played")
        ax_a.plot(acc["minutes"], [np.nan if x is None else x for x in acc["distance"]],
                  color=f"C{i}", label=arm)
    ax_p.set_xlabel("minutes")
    ax_p.set_title("what each arm played")
    ax_a.set_xlabel("minutes")
    ax_a.set_ylabel("mean pairwise cosine distance")
    ax_a.set_title("accepted environments (embeddings)")
    for ax in (ax_p, ax_a):
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "diversity.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    files.append(path)
    return files
