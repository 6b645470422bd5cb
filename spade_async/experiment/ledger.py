"""The cost ledger of one arm, from the records its processes wrote: tokens and seconds spent
designing (the designer's requests), validating (sandbox checks and the memory's novelty
filter), playing (episodes: model turns and sandbox steps), training (optimizer steps and
publishes) and evaluating; per accepted environment and per point of held-out score.

Seconds are busy seconds summed over work items that overlap in time (16 requests in flight for
one second count 16), so they add up across stages; the arm's wall time is beside them."""

from __future__ import annotations

from typing import Any

from spade_async.experiment.results import Point
from spade_async.report.data import RunData


def _sum(records: list[dict], key: str) -> float:
    return float(sum(float(r.get(key) or 0) for r in records))


def ledger(d: RunData, evals: list[dict], points: dict[str, list[Point]],
           wall_s: float) -> dict[str, Any]:
    accepted = [x for x in d.designs if x.get("status") == "accepted"]
    stages = {
        "designing": {"seconds": _sum(d.designs, "design_s"),
                      "tokens": int(_sum(d.designs, "completion_tokens")),
                      "prompt_tokens": int(_sum(d.designs, "prompt_tokens")),
                      "items": len(d.designs)},
        "validating": {"seconds": _sum(d.designs, "validation_s"), "tokens": 0,
                       "items": len(d.designs)},
        "playing": {"seconds": d.episodes.total("seconds"),
                    "tokens": int(d.episodes.total("sampled_tokens")),
                    "prompt_tokens": int(d.episodes.total("prompt_len")),
                    "items": len(d.episodes)},
        "training": {"seconds": _sum(d.steps, "step_s")
                     + sum(float((s.get("publish") or {}).get("seconds") or 0) for s in d.steps),
                     "tokens": int(_sum(d.steps, "tokens")), "items": len(d.steps)},
        "evaluating": {"seconds": _sum(evals, "seconds"),
                       "tokens": int(_sum(evals, "completion_tokens")), "items": len(evals)},
    }
    for s in stages.values():
        s["seconds"] = round(s["seconds"], 1)
    making = stages["designing"]["seconds"] + stages["validating"]["seconds"]
    total = sum(s["seconds"] for k, s in stages.items() if k != "evaluating")
    n_acc = len(accepted)
    per_point = {}
    for suite, pts in points.items():
        if len(pts) < 2:
            continue
        gain = {"strict": (pts[-1].strict - pts[0].strict) * 100,
                "lenient": (pts[-1].lenient - pts[0].lenient) * 100}
        per_point[suite] = {k: (round(total / g, 1) if g > 0 else None) for k, g in gain.items()}
        per_point[suite]["gain_points"] = {k: round(g, 2) for k, g in gain.items()}
    return {
        "stages": stages,
        "wall_s": round(wall_s, 1),
        "accepted": {"environments": sum(1 for x in accepted if x.get("move", "write") == "write"),
                     "variants": sum(1 for x in accepted if x.get("move") == "edit")},
        "per_accepted": ({"seconds": round(making / n_acc, 1),
                          "tokens": round(stages["designing"]["tokens"] / n_acc, 1)}
                         if n_acc else None),
        "busy_seconds": round(total, 1),
        # busy seconds (designing + validating + playing + training) per point (0.01) of
        # held-out score gained from the first evaluated version to the last; None: no gain
        "seconds_per_point": per_point,
        # what making environments costs relative to training in them (the paper's open question)
        "design_to_training": (round(making / (stages["playing"]["seconds"]
                                               + stages["training"]["seconds"]), 3)
                               if stages["playing"]["seconds"] + stages["training"]["seconds"]
                               else None),
    }
