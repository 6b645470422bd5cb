"""A knob's neighbours: the one scale on which the edit move offers new settings
(design/edit.py) and the report measures how far an edit moved a knob (report/frontier.py), so
what is offered and what is checked cannot drift apart. Plain functions over a ParamSpec; they
never run environment code.

The scale (`rungs`), by knob type:
- int on a narrow range (max - min <= NARROW_INT_SPAN): every integer, a step is ±1;
- int on a wide range: a ladder that doubles from min (min, 2 min, 4 min, ..., at least +1 a
  rung) and ends at max, where a last rung closer to max than a factor √RATIO gives way to it.
  span_max 5..2000 reads 5, 10, 20, 40, 80, 160, 320, 640, 1280, 2000: a step is ×2 or ÷2,
  never a jump to the range's end. A range that reaches 0 or below climbs the ladder in
  magnitude on each side of 0 (-8, -4, -2, -1, 0, 1, 2, 4, ...);
- float: ten equal steps over the range; a positive range that spans a factor of
  WIDE_FLOAT_RATIO or more climbs the doubling ladder instead;
- choice: the choices in declared order, a step is ±1 rank; bool: false, true, a step flips.
A value between two rungs (a default off the ladder) has those two rungs as its neighbours. The
size of a move is its number of steps: 1 plus the rungs strictly between the two values.

A move's direction is read against the knob's easiest value (`ParamSpec.easiest`: its `easy`
where declared, else min, the first choice, false): nearer to it is easier.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from typing import Any

from spade_async.envs.contract import ParamSpec

NARROW_INT_SPAN = 16  # an int knob with at most 17 values steps by one
RATIO = 2.0  # a wide knob's ladder: each rung about twice the one below
FLOAT_STEPS = 10  # a float knob on a linear scale: ten equal steps over its range
WIDE_FLOAT_RATIO = 16.0  # a positive float range with max / min at least this: the ladder


def _ladder(lo: float, hi: float, *, whole: bool) -> list[float]:
    """Rungs from `lo` (>= 1 for ints, > 0 for floats) to `hi`, each about RATIO times the one
    below (whole numbers at least one apart when `whole`)."""
    if lo >= hi:
        return [lo]
    out = [lo]
    while True:
        nxt = out[-1] * RATIO
        nxt = max(out[-1] + 1, math.floor(nxt + 0.5)) if whole else float(f"{nxt:.6g}")
        if nxt >= hi:
            break
        out.append(nxt)
    if len(out) > 1 and hi / out[-1] < math.sqrt(RATIO):
        out[-1] = hi  # the end is nearer than half a rung: it takes the last rung's place
    else:
        out.append(hi)
    return out


def _int_ladder(lo: int, hi: int) -> list[float]:
    """A wide int range's rungs: the ladder from `lo` when it is positive, else by magnitude on
    each side of 0 (a doubling ladder needs a positive start)."""
    if lo >= 1:
        return _ladder(lo, hi, whole=True)
    if hi <= -1:
        return [-x for x in reversed(_ladder(-hi, -lo, whole=True))]
    below = [-x for x in reversed(_ladder(1, -lo, whole=True))] if lo < 0 else []
    return [*below, 0, *(_ladder(1, hi, whole=True) if hi > 0 else [])]


@functools.lru_cache(maxsize=1024)
def rungs(spec: ParamSpec) -> tuple[Any, ...]:
    """The values a knob's steps walk over, from its first to its last (ascending numbers,
    the choices in declared order, false then true). Both ends of a range are rungs."""
    if spec.type == "bool":
        return (False, True)
    if spec.type == "choice":
        return tuple(spec.choices or ())
    if spec.type == "int":
        lo, hi = int(spec.min), int(spec.max)
        if hi - lo <= NARROW_INT_SPAN:
            return tuple(range(lo, hi + 1))
        return tuple(int(x) for x in _int_ladder(lo, hi))
    lo, hi = float(spec.min), float(spec.max)
    if lo > 0 and hi >= lo * WIDE_FLOAT_RATIO:
        return tuple(_ladder(lo, hi, whole=False))
    inner = (float(f"{lo + k * (hi - lo) / FLOAT_STEPS:.12g}") for k in range(1, FLOAT_STEPS))
    return tuple(sorted({lo, hi, *(x for x in inner if lo < x < hi)}))


def _same(spec: ParamSpec, a: Any, b: Any) -> bool:
    if spec.type == "float":
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _place(spec: ParamSpec, value: Any) -> float:
    """Where `value` sits on the knob's scale: i on rung i, i - 0.5 between rungs i - 1 and i.
    ValueError for a value the knob does not take."""
    rs = rungs(spec)
    if spec.type in ("bool", "choice"):
        for i, r in enumerate(rs):
            if _same(spec, r, value):
                return float(i)
        raise ValueError(f"knob '{spec.name}' takes no value {value!r}")
    v = float(value)
    if not float(spec.min) <= v <= float(spec.max):
        raise ValueError(f"knob '{spec.name}': {value!r} is outside [{spec.min}, {spec.max}]")
    i = bisect.bisect_left(rs, v)
    for j in (i - 1, i):
        if 0 <= j < len(rs) and _same(spec, rs[j], v):
            return float(j)
    return i - 0.5


def neighbour_values(spec: ParamSpec, value: Any) -> list[Any]:
    """The values one step from `value` on the knob's scale: the rung below and the rung
    above (one of them at an end of the range), the adjacent choices, the other bool."""
    rs, p = rungs(spec), _place(spec, value)
    return [rs[j] for j in (math.ceil(p) - 1, math.floor(p) + 1) if 0 <= j < len(rs)]


def knob_steps(spec: ParamSpec, old: Any, new: Any) -> int:
    """How many neighbour steps a move from `old` to `new` takes: 0 for the same value, else 1
    plus the rungs strictly between them. ValueError for a value the knob does not take."""
    if _same(spec, old, new):
        return 0
    a, b = sorted((_place(spec, old), _place(spec, new)))
    return 1 + sum(a < k < b for k in range(len(rungs(spec))))


def is_neighbour_step(spec: ParamSpec, old: Any, new: Any) -> bool:
    """Whether `new` is one step from `old`: what every edit option is."""
    return knob_steps(spec, old, new) == 1


def edit_steps(specs: Sequence[ParamSpec], old: dict[str, Any],
               new: dict[str, Any]) -> dict[str, int]:
    """Per knob named in both settings, the steps an edit from `old` to `new` moved it."""
    return {s.name: knob_steps(s, old[s.name], new[s.name]) for s in specs
            if s.name in old and s.name in new}


def _distance_to_easy(spec: ParamSpec, value: Any) -> float:
    """How far `value` is from the knob's easiest value: by value for numbers, by rank for
    choices, 0 or 1 for bools."""
    if spec.type in ("int", "float"):
        return abs(float(value) - float(spec.easiest))
    return abs(_place(spec, value) - _place(spec, spec.easiest))


def move_direction(spec: ParamSpec, old: Any, new: Any) -> str:
    """"easier" when `new` is nearer the knob's easiest value than `old`, "harder" when it is
    farther, "neither" when it is as far (the same value, or the other side of an `easy` that
    lies inside the range)."""
    before, after = _distance_to_easy(spec, old), _distance_to_easy(spec, new)
    if after < before:
        return "easier"
    return "harder" if after > before else "neither"
