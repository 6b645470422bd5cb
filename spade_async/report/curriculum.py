"""The designer's moves, the curriculum its edits set, and the probe's solve rate, as numbers
and text from a run's records (designs.jsonl, plays.jsonl, eval/results.jsonl): what `spade
report` plots and tabulates and `spade status` prints. Plain functions over records; they read
no file and draw nothing.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from typing import Any

DESIGN_MOVES = ("write", "edit")
PLAY_MOVES = ("write", "edit", "replay", "fixed")
PROBE = "probe"


def design_move(design: dict) -> str:
    return design.get("move") or "write"  # before edits existed, every design was a write


def play_move(play: dict) -> str:
    return play.get("move") or ("replay" if play.get("replayed") else "write")


def _bins(times: list[float], bins: int) -> tuple[list[float], list[int]]:
    """`bins` equal time bins over `times`: (the left edges, the bin of each time)."""
    lo, hi = min(times), max(times)
    width = (hi - lo) / bins or 1.0
    return ([lo + b * width for b in range(bins)],
            [min(bins - 1, int((t - lo) / width)) for t in times])


def move_counts(proposed: int, accepted: int, played: int) -> dict[str, Any]:
    """One move's counts and the share of its proposals that reached a scored play."""
    return {"proposed": proposed, "accepted": accepted, "played": played,
            "played_share": round(played / proposed, 4) if proposed else None}


def moves_summary(designs: list[dict], plays: list[dict], t0: float,
                  bins: int = 20) -> dict[str, Any]:
    """Per move: designs proposed and accepted, plays scored (write and edit), plays of the
    replay sampler and of the fixed baseline; the share of proposals that reached a scored
    play; and the same counts per time bin (minutes since the run started)."""
    out: dict[str, Any] = {}
    events: list[tuple[float, str]] = []  # (minute, "<move>_<stage>")
    for x in designs:
        m = design_move(x)
        events.append(((float(x["time"]) - t0) / 60.0, f"{m}_proposed"))
        if x.get("status") == "accepted":
            events.append(((float(x["time"]) - t0) / 60.0, f"{m}_accepted"))
    for p in plays:
        events.append(((float(p["time"]) - t0) / 60.0, f"{play_move(p)}_played"))
    counts = Counter(k for _, k in events)
    for m in DESIGN_MOVES:
        out[m] = move_counts(*(counts.get(f"{m}_{k}", 0)
                               for k in ("proposed", "accepted", "played")))
    for m in PLAY_MOVES[2:]:
        out[m] = {"played": counts.get(f"{m}_played", 0)}
    timeline: list[dict[str, Any]] = []
    if events:
        nb = min(bins, max(1, len(events) // 4))
        edges, which = _bins([e[0] for e in events], nb)
        for b in range(nb):
            row: dict[str, Any] = {"minute": round(edges[b], 2)}
            row |= Counter(k for (_, k), w in zip(events, which, strict=True) if w == b)
            timeline.append(row)
    out["timeline"] = timeline
    return out


def _variant_key(rec: dict) -> str | None:
    """The variant a record names: its variant_id, else (env, canonical params)."""
    if rec.get("variant_id"):
        return str(rec["variant_id"])
    if isinstance(rec.get("params"), dict) and rec.get("env_id"):
        from memory_db.schema import variant_id

        return variant_id(str(rec["env_id"]), rec["params"])
    return None


def _solves(play: dict, solved_at: float) -> tuple[int, int]:
    scores = [float(x) for x in play.get("unhinted") or [] if isinstance(x, (int, float))]
    return sum(x >= solved_at for x in scores), len(scores)


def _rate(solved: int, n: int) -> dict[str, Any]:
    from spade_async.evals.base import wilson_interval

    lo, hi = wilson_interval(solved, n)
    return {"rate": round(solved / n, 4) if n else None, "solved": solved, "n": n,
            "ci95": [round(lo, 4), round(hi, 4)]}


def _family_curriculum(family: str, fp: list[dict], proposed: list[dict], t0: float,
                       solved_at: float) -> dict[str, Any] | None:
    """One family's curriculum from its plays and its edit designs (both in time order);
    None when neither names a knob."""
    chosen = [x for x in proposed
              if x.get("status") == "accepted" and isinstance(x.get("params"), dict)]
    if not chosen:  # designs.jsonl without the edits' params: their plays stand in
        chosen = [p for p in fp if play_move(p) == "edit"]
    if not any(p["params"] for p in fp) and not any(x["params"] for x in chosen):
        return None
    series: list[dict[str, Any]] = []
    if fp and (not chosen or float(fp[0]["time"]) <= float(chosen[0]["time"])):
        series.append({"time": float(fp[0]["time"]), "params": dict(fp[0]["params"]),
                       "variant": _variant_key(fp[0]), "by": play_move(fp[0])})
    for x in chosen:
        before = series[-1]["params"] if series else {}
        series.append({"time": float(x["time"]), "params": before | x["params"],
                       "variant": _variant_key(x), "by": "edit"})
    at: dict[str, tuple[int, int]] = {}  # variant -> (solved, unhinted episodes)
    for p in fp:
        key = _variant_key(p)
        if key is not None:
            solved, n = _solves(p, solved_at)
            prev = at.get(key, (0, 0))
            at[key] = (prev[0] + solved, prev[1] + n)
    rates = [_rate(*at.get(pt["variant"] or "", (0, 0))) for pt in series]
    knobs = []
    for knob in dict.fromkeys(k for pt in series for k in pt["params"]):
        values = [pt["params"].get(knob) for pt in series]
        knobs.append({"knob": knob, "first": values[0], "last": values[-1],
                      "changes": sum(a != b for a, b in itertools.pairwise(values))})
    return {
        "family": family, "edits": len(chosen), "edits_proposed": len(proposed),
        "plays": len(fp), "knobs": knobs,
        "solve_first": rates[0] if series else _rate(0, 0),
        "solve_last": rates[-1] if series else _rate(0, 0),
        "series": [{"minute": round((pt["time"] - t0) / 60.0, 2), "params": pt["params"],
                    "by": pt["by"], "variant_id": pt["variant"], "solve": r}
                   for pt, r in zip(series, rates, strict=True)],
        "plays_at": [{"minute": round((float(p["time"]) - t0) / 60.0, 2),
                      "params": p["params"], "move": play_move(p),
                      **dict(zip(("solved", "n"), _solves(p, solved_at), strict=True))}
                     for p in fp],
    }


def curriculum(designs: list[dict], plays: list[dict], t0: float,
               solved_at: float) -> list[dict[str, Any]]:
    """Per family with knobs, the settings the edits chose over time and the unhinted solve
    rate at them, the most edited family first. A family's series starts at its first played
    setting (its write, at the defaults) and takes each accepted edit's params in turn (an
    edit's partial params on top of the setting before it). A setting's solve rate pools every
    unhinted episode played at that variant (score >= `solved_at`)."""
    by_family: dict[str, list[dict]] = {}
    for p in sorted(plays, key=lambda r: float(r["time"])):
        if p.get("name") and isinstance(p.get("params"), dict):
            by_family.setdefault(str(p["name"]), []).append(p)
    edits: dict[str, list[dict]] = {}
    for x in sorted(designs, key=lambda r: float(r["time"])):
        if design_move(x) == "edit" and x.get("family"):
            edits.setdefault(str(x["family"]), []).append(x)
    out = [f for family in sorted(set(by_family) | set(edits))
           if (f := _family_curriculum(family, by_family.get(family, []),
                                       edits.get(family, []), t0, solved_at)) is not None]
    out.sort(key=lambda f: (-f["edits"], f["family"]))
    return out


def curriculum_table(families: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (family, knob): first and last value, edits, solve rate at the first and
    at the last setting (the family's, shared by its knobs)."""
    return [{"family": f["family"], "knob": k["knob"], "first": k["first"], "last": k["last"],
             "edits": f["edits"], "changes": k["changes"],
             "solve_first": f["solve_first"]["rate"], "n_first": f["solve_first"]["n"],
             "solve_last": f["solve_last"]["rate"], "n_last": f["solve_last"]["n"]}
            for f in families for k in f["knobs"]]


def probe_summary(evals: list[dict], suite: str = PROBE) -> list[dict[str, Any]]:
    """The probe's solve rate per policy version (its newest run of each), with the 95%
    Wilson interval over the tasks it scored; `suite`: probe, or probe-greedy."""
    latest: dict[int, dict] = {}
    for r in evals:
        if r.get("suite") == suite:
            v = int(r.get("version", 0))
            if v not in latest or float(r.get("time", 0)) >= float(latest[v].get("time", 0)):
                latest[v] = r
    out = []
    for v, r in sorted(latest.items()):
        n = int(r.get("scored", r.get("n", 0)))
        solved = round(float(r.get("passed", r.get("score", 0.0))) * n)
        out.append({"version": v, "solve_rate": r.get("passed", r.get("score")),
                    "solved": solved, "n": n, "ci95": _rate(solved, n)["ci95"]})
    return out


def moves_text(m: dict[str, Any]) -> str:
    """`write 40 proposed, 0 accepted, 0 played; edit 60 proposed, 58 accepted, 55 played
    (92%)`, and the replay / fixed plays when there are any."""
    parts = []
    for k in DESIGN_MOVES:
        x = m[k]
        part = f"{k} {x['proposed']} proposed, {x['accepted']} accepted, {x['played']} played"
        if x["played"] and x["played_share"] is not None:
            part += f" ({x['played_share']:.0%})"
        parts.append(part)
    parts += [f"{k} {m[k]['played']} played" for k in PLAY_MOVES[2:]
              if m.get(k, {}).get("played")]
    return "; ".join(parts)


def value_text(v: Any) -> str:
    return json.dumps(v) if not isinstance(v, str) else v


def rate_text(rate: float | None, n: int) -> str:
    return "-" if rate is None else f"{rate:.0%} of {n}"


CURRICULUM_HEAD = ("family", "knob", "first", "last", "edits", "solve rate first",
                   "solve rate last")


def curriculum_cells(row: dict[str, Any]) -> tuple[str, ...]:
    return (row["family"], row["knob"], value_text(row["first"]), value_text(row["last"]),
            str(row["edits"]), rate_text(row["solve_first"], row["n_first"]),
            rate_text(row["solve_last"], row["n_last"]))


def probe_text(row: dict[str, Any]) -> str:
    lo, hi = row["ci95"]
    rate = row["solved"] / row["n"] if row["n"] else None
    return (f"v{row['version']}: {rate_text(rate, row['n'])} solved, 95% interval "
            f"[{lo:.2f}, {hi:.2f}]")


def probe_paired_text(suite: str, p: dict[str, Any]) -> str:
    """`probe v12 - v0: +0.085 [+0.031, +0.139] (n=200, 31 gained, 14 lost; above 0)`."""
    from spade_async.evals.paired import paired_text

    return f"{suite} v{p['after']} - v{p['before']}: {paired_text(p)}"
