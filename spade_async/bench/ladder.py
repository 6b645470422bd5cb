"""`spade bench ladder`: how often the served policy solves seed environments at chosen knob
settings (rungs), unhinted and hinted, with the daemon's own episode path (system prompt, chat
template, token-exact turns, the rollout config's sampling) in the real sandbox.

A rung is a family (a seed file's stem) and knob values, played as a variant is: the values go
to `reset(seed, params)` through the sandbox. `with_knobs` (the same values written into the
module as its defaults) is kept for checks that the two paths play the same task. It never runs
environment code outside the sandbox: knob specs are read from the module's source as literals
(`knob_specs`). Rung labels: `easiest` (every knob at its declared easy end), `middle` (a point
in between, from RUNGS), `default` (the module's defaults).
"""

from __future__ import annotations

import ast
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.errors import EndpointError
from spade_async.inference.pool import EndpointPool
from spade_async.rollout.episode import Episode, play_in_sandbox
from spade_async.sandbox.errors import SandboxError
from spade_async.sandbox.runtime import Sandbox

SEEDS_DIR = Path(__file__).resolve().parents[1] / "envs" / "seeds"
EPISODE_SEED_BASE = 10_000  # episode seeds, away from the validator's (0, 1, 2)
SOLVED = 1.0 - 1e-9  # an episode is solved when it scores full marks

# The rungs measured per family: the easiest point (every knob at its easy end) and one in the
# middle. Defaults are today's difficulty; a knob left out keeps its default.
RUNGS: dict[str, dict[str, dict[str, Any]]] = {
    "arithmetic": {"easiest": {"digits": 1, "operations": "+", "terms": 2},
                   "middle": {"digits": 1, "operations": "+-", "terms": 3}},
    "record_lookup": {"easiest": {"hops": 1, "fields": 1, "show_call": True},
                      "middle": {"hops": 2, "fields": 2, "show_call": False}},
    "date_arithmetic": {"easiest": {"kinds": "after", "max_days": 1, "cross_month": False},
                        "middle": {"kinds": "after_before", "max_days": 20,
                                   "cross_month": False}},
    "linear_system": {"easiest": {"unknowns": 1, "coef_max": 2, "value_max": 9,
                                  "negatives": False},
                      "middle": {"unknowns": 2, "coef_max": 2, "value_max": 9,
                                 "negatives": False}},
    "modular_coins": {"easiest": {"facts": 1, "moduli_max": 5, "bound_max": 20},
                      "middle": {"facts": 2, "moduli_max": 5, "bound_max": 100}},
    "number_guess": {"easiest": {"span_max": 5, "guesses": 12},
                     "middle": {"span_max": 50, "guesses": 8}},
    "mastermind": {"easiest": {"length": 1, "colors": 3, "guesses": 10, "opening": False},
                   "middle": {"length": 2, "colors": 4, "guesses": 8, "opening": True}},
    "word_guess": {"easiest": {"words": 2, "guesses": 6},
                   "middle": {"words": 8, "guesses": 4}},
    "run_length_encoding": {"easiest": {"runs_max": 1, "run_max": 3, "mode": "decode"},
                            "middle": {"runs_max": 3, "run_max": 5, "mode": "both"}},
    "string_pipeline": {"easiest": {"ops": 1, "word_len": 3, "op_set": "basic"},
                        "middle": {"ops": 2, "word_len": 5, "op_set": "basic"}},
    "trace_program": {"easiest": {"loop": 0, "statements": 1, "branch": False,
                                  "operators": "+", "variables": 1},
                      "middle": {"loop": 0, "statements": 2, "branch": False,
                                 "operators": "+-", "variables": 2}},
    "seating_logic": {"easiest": {"people": 2, "relations": False},
                      "middle": {"people": 3, "relations": True}},
    "grid_maze": {"easiest": {"height": 3, "width": 5, "walls": 0.0, "min_path": 2,
                              "replies": 12},
                  "middle": {"height": 5, "width": 6, "walls": 0.1, "min_path": 3,
                             "replies": 8}},
    "calendar_booking": {"easiest": {"move": False, "blocked": 0, "busy": 0.0, "submit": False,
                                     "show_format": True},
                         "middle": {"move": False, "blocked": 1, "busy": 0.3, "submit": True}},
    "kv_store": {"easiest": {"hops": 0, "decoys": 0, "junk": 0, "submit": False,
                             "show_format": True},
                 "middle": {"hops": 1, "decoys": 3, "junk": 0, "submit": True}},
    "file_system": {"easiest": {"logs": 1, "decoys": False, "digits": 1, "mkdir": False,
                                "paths_given": True, "show_format": True},
                    "middle": {"logs": 2, "decoys": False, "digits": 1, "mkdir": False,
                               "paths_given": True}},
    "shop_inventory": {"easiest": {"products": 1, "trap": False, "leftover": 0, "qty_max": 1,
                                   "show_format": True},
                       "middle": {"products": 2, "trap": False, "leftover": 0, "qty_max": 3}},
    "table_database": {"easiest": {"employees": 3, "departments": 1, "below": 1, "by_id": True,
                                   "show_format": True},
                       "middle": {"employees": 8, "departments": 2, "below": 2, "by_id": True}},
}


@dataclass(frozen=True)
class Rung:
    family: str
    params: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    code: str | None = None  # the module text; None: the seed file named `family`

    def source(self) -> str:
        return self.code if self.code is not None else (SEEDS_DIR / f"{self.family}.py").read_text()


def rung_params(family: str, label: str) -> dict[str, Any]:
    """The knob values of a rung: `default` is the module's defaults, `easiest` and `middle`
    come from RUNGS (a family missing there gets its declared easy ends for `easiest`)."""
    if label == "default":
        return {k: s["default"] for k, s in knob_specs((SEEDS_DIR / f"{family}.py").read_text())
                .items()}
    if label in RUNGS.get(family, {}):
        return dict(RUNGS[family][label])
    if label == "easiest":
        from spade_async.envs.knobs import declared_params, easiest_point

        return easiest_point(declared_params((SEEDS_DIR / f"{family}.py").read_text()))
    raise ValueError(f"no rung {label!r} for {family} (labels: easiest, middle, default)")


def seed_family_names() -> list[str]:
    return sorted(p.stem for p in SEEDS_DIR.glob("*.py") if p.name != "__init__.py")


def default_rungs(families: Sequence[str] | None = None,
                  labels: Sequence[str] = ("easiest", "middle")) -> list[Rung]:
    known = seed_family_names()
    names = list(families) if families else known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"no seed family {', '.join(unknown)} (known: {', '.join(known)})")
    bad = [label for label in labels if label not in ("easiest", "middle", "default")]
    if bad:
        raise ValueError(f"unknown rung label {', '.join(bad)}: easiest, middle or default")
    return [Rung(n, rung_params(n, label), label) for n in names for label in labels
            if label != "middle" or label in RUNGS.get(n, {})]


# ---- knobs, read from source and set as defaults ------------------------------------------


def knob_specs(code: str) -> dict[str, dict[str, Any]]:
    """The `params` of the module's Environment class as a literal (directly, or through a
    module-level name), without running the code. {} when it declares none."""
    tree = ast.parse(code)
    top: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name):
            top[node.targets[0].id] = node.value
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Environment":
            for item in node.body:
                if isinstance(item, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "params" for t in item.targets):
                    value = item.value
                    if isinstance(value, ast.Name):
                        value = top[value.id]
                    return ast.literal_eval(value)
    return {}


def extremes(specs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each knob at each end (min and max, first and last choice, both bools), the others at
    their defaults: the points the validator checks besides the defaults."""
    points = []
    for name, spec in specs.items():
        kind = spec["type"]
        if kind in ("int", "float"):
            ends = [spec["min"], spec["max"]]
        elif kind == "bool":
            ends = [False, True]
        else:
            ends = [spec["choices"][0], spec["choices"][-1]]
        points += [{name: v} for v in dict.fromkeys(ends) if v != spec["default"]]
    return points


def with_knobs(code: str, values: dict[str, Any]) -> str:
    """`code` with the given knob values as its defaults, so `reset(seed)` plays them."""
    if not values:
        return code
    specs = knob_specs(code)
    unknown = sorted(set(values) - set(specs))
    if unknown:
        raise ValueError(f"unknown knobs {', '.join(unknown)} (the module has "
                         f"{', '.join(specs) or 'none'})")
    lines = ["", "", "# A bench rung: these knob values are the defaults.",
             "Environment.params = {k: dict(v) for k, v in Environment.params.items()}"]
    lines += [f"Environment.params[{k!r}]['default'] = {v!r}" for k, v in values.items()]
    return code.rstrip("\n") + "\n".join(lines) + "\n"


# ---- measuring ------------------------------------------------------------------------------


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% at z = 1.96)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def _summary(episodes: list[Episode]) -> dict[str, Any]:
    scored = [e for e in episodes if e.error is None]
    solved = sum(e.score >= SOLVED for e in scored)
    low, high = wilson(solved, len(scored))
    return {"n": len(scored), "solved": solved,
            "rate": solved / len(scored) if scored else None,
            "ci95": [round(low, 3), round(high, 3)],
            "mean_score": (sum(e.score for e in scored) / len(scored)) if scored else None,
            "errors": len(episodes) - len(scored),
            "turns_mean": (sum(len(e.turns) for e in scored) / len(scored)) if scored else None}


async def measure_rungs(cfg: Any, pool: EndpointPool, chat: ChatTokens, sandbox: Sandbox,
                        rungs: Sequence[Rung], episodes: int = 24, *, hinted: int | None = None,
                        concurrency: int = 16, model: str | None = None,
                        temperature: float | None = None,
                        progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Play `episodes` unhinted and `hinted` (default episodes // 2) hinted episodes of every
    rung; per rung the solve rates with n and a Wilson 95% interval. `cfg` is the SpadeConfig
    (its rollout settings and served model name). Episode seeds are EPISODE_SEED_BASE + i, so the
    hinted episodes replay the first unhinted tasks. An episode that failed on the endpoint or
    in the sandbox is no score: it is left out of n and counted under errors. `temperature`
    overrides the rollout config's sampling temperature (to compare settings side by side)."""
    hinted = episodes // 2 if hinted is None else hinted
    model = model or cfg.model.served_name
    rollout = (cfg.rollout if temperature is None
               else cfg.rollout.model_copy(update={"temperature": temperature}))
    limiter = anyio.CapacityLimiter(concurrency)
    codes = [r.source() for r in rungs]
    played: list[dict[bool, list[Episode]]] = [{False: [], True: []} for _ in rungs]
    started = [0.0] * len(rungs)
    finished = [0.0] * len(rungs)

    async def one(i: int, seed: int, with_hint: bool) -> None:
        async with limiter:
            started[i] = started[i] or time.perf_counter()
            try:
                ep = await play_in_sandbox(sandbox, codes[i], pool, chat,
                                           env_id=f"ladder:{rungs[i].family}", seed=seed,
                                           hinted=with_hint, model=model, policy_version=0,
                                           cfg=rollout, params=dict(rungs[i].params) or None)
            except (SandboxError, EndpointError) as exc:
                ep = Episode("failed", rungs[i].family, seed, with_hint, 0, model,
                             error=f"{type(exc).__name__}: {exc}")
            played[i][with_hint].append(ep)
            finished[i] = time.perf_counter()
            done = len(played[i][False]) + len(played[i][True])
            if progress and done == episodes + hinted:
                s = _summary(played[i][False])
                progress(f"{rungs[i].family} {rungs[i].label or rungs[i].params}: unhinted "
                         f"{s['solved']}/{s['n']}")

    async with anyio.create_task_group() as tg:
        for i in range(len(rungs)):
            for k in range(episodes):
                tg.start_soon(one, i, EPISODE_SEED_BASE + k, False)
            for k in range(hinted):
                tg.start_soon(one, i, EPISODE_SEED_BASE + k, True)

    out = []
    for i, rung in enumerate(rungs):
        eps = played[i]
        sample = sorted(eps[False], key=lambda e: e.seed)[:3]
        out.append({
            "family": rung.family, "label": rung.label, "params": dict(rung.params),
            "temperature": rollout.temperature,
            "unhinted": _summary(eps[False]), "hinted": _summary(eps[True]),
            "seconds": round(finished[i] - started[i], 1),
            "examples": [{"seed": e.seed, "observation": e.first_observation[:300],
                          "actions": [t.action[:200] for t in e.turns[:3]], "score": e.score}
                         for e in sample],
        })
    return out
