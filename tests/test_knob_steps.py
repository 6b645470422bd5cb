"""A knob's neighbours (envs/knob_steps.py) on every knob type, the seeds' own knobs among them,
and the edit options drawn toward the frontier by the parent's solve rate (design/edit.py)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import spade_async.envs.seeds as seeds
from spade_async.design.edit import candidate_params, frontier_options, wanted_direction
from spade_async.envs.knob_steps import (
    edit_steps,
    is_neighbour_step,
    knob_steps,
    move_direction,
    neighbour_values,
    rungs,
)
from spade_async.envs.knobs import check_params_schema, declared_params, easiest_point

SEEDS = Path(seeds.__file__).parent


def _seed_knobs(name: str) -> dict:
    return {s.name: s for s in declared_params((SEEDS / f"{name}.py").read_text())}


def _knob(**spec):
    return check_params_schema({"k": spec})[0]


def test_a_narrow_int_knob_steps_by_one():
    digits = _seed_knobs("arithmetic")["digits"]  # 1..4
    assert rungs(digits) == (1, 2, 3, 4)
    assert neighbour_values(digits, 1) == [2]
    assert neighbour_values(digits, 2) == [1, 3]
    assert neighbour_values(digits, 4) == [3]
    assert knob_steps(digits, 2, 1) == 1 and knob_steps(digits, 1, 4) == 3
    assert knob_steps(digits, 3, 3) == 0
    # 17 values are still narrow; 18 are not
    assert rungs(_knob(type="int", min=0, max=16, default=0)) == tuple(range(17))
    assert rungs(_knob(type="int", min=0, max=17, default=0)) == (0, 1, 2, 4, 8, 17)


def test_a_wide_int_knob_steps_on_a_doubling_scale():
    span = _seed_knobs("number_guess")["span_max"]  # 5..2000, default 2000
    assert rungs(span) == (5, 10, 20, 40, 80, 160, 320, 640, 1280, 2000)
    assert neighbour_values(span, 2000) == [1280]
    assert neighbour_values(span, 5) == [10]
    assert neighbour_values(span, 6) == [5, 10]  # off the scale: the rungs either side
    assert neighbour_values(span, 320) == [160, 640]
    # the edit 6 -> 503 crosses six rungs: seven steps, not a neighbour
    assert knob_steps(span, 6, 503) == 7 and not is_neighbour_step(span, 6, 503)
    assert knob_steps(span, 503, 6) == 7
    for v in range(span.min, span.max + 1):  # every value: at least ±1, at most ×/÷ 2.83
        for n in neighbour_values(span, v):
            assert is_neighbour_step(span, v, n) and n != v
            assert max(n, v) / min(n, v) < 2 * 2 ** 0.5
            assert n in (span.min, span.max) or n in rungs(span)
        assert len(neighbour_values(span, v)) == (1 if v in (span.min, span.max) else 2)
    # a range through 0 doubles in magnitude on each side; one below 0 mirrors one above
    through = _knob(type="int", min=-40, max=100, default=0)
    assert rungs(through) == (-40, -16, -8, -4, -2, -1, 0, 1, 2, 4, 8, 16, 32, 64, 100)
    assert neighbour_values(through, 0) == [-1, 1]
    below = _knob(type="int", min=-100, max=-20, default=-20)
    assert rungs(below) == (-100, -40, -20)


def test_float_knobs_step_linearly_or_on_a_log_scale():
    walls = _seed_knobs("grid_maze")["walls"]  # 0.0..0.4, default 0.3 (off the scale)
    assert rungs(walls) == (0.0, 0.04, 0.08, 0.12, 0.16, 0.2, 0.24, 0.28, 0.32, 0.36, 0.4)
    assert neighbour_values(walls, 0.3) == [0.28, 0.32]
    assert neighbour_values(walls, 0.0) == [0.04]
    assert neighbour_values(walls, 0.12) == [0.08, 0.16]
    assert knob_steps(walls, 0.1 + 0.02, 0.16) == 1  # float noise still lands on the rung
    assert knob_steps(walls, 0.3, 0.31) == 1 and knob_steps(walls, 0.0, 0.4) == 10
    rate = _knob(type="float", min=0.001, max=1.0, default=0.01)  # positive, a factor 1000
    assert rungs(rate)[:4] == (0.001, 0.002, 0.004, 0.008) and rungs(rate)[-1] == 1.0
    assert neighbour_values(rate, 0.01) == [0.008, 0.016]
    fixed = _knob(type="float", min=0.5, max=0.5, default=0.5)
    assert rungs(fixed) == (0.5,) and neighbour_values(fixed, 0.5) == []


def test_choice_knobs_step_one_rank_and_bools_flip():
    ops = _seed_knobs("arithmetic")["operations"]  # "+", "+-", "+-*"
    assert neighbour_values(ops, "+") == ["+-"]
    assert neighbour_values(ops, "+-") == ["+", "+-*"]
    assert knob_steps(ops, "+", "+-*") == 2
    submit = _seed_knobs("kv_store")["submit"]
    assert neighbour_values(submit, True) == [False] and knob_steps(submit, False, True) == 1
    with pytest.raises(ValueError):
        knob_steps(ops, "+", "*")
    with pytest.raises(ValueError):
        neighbour_values(_seed_knobs("arithmetic")["digits"], 9)


def test_move_direction_reads_the_easy_end():
    knobs = _seed_knobs("number_guess")
    guesses, span = knobs["guesses"], knobs["span_max"]  # guesses: "easy": 12 (its max)
    assert move_direction(guesses, 11, 12) == "easier"
    assert move_direction(guesses, 11, 10) == "harder"
    assert move_direction(span, 10, 5) == "easier" and move_direction(span, 10, 20) == "harder"
    show = _seed_knobs("kv_store")["show_format"]  # "easy": true
    assert move_direction(show, False, True) == "easier"
    middle = _knob(type="int", min=0, max=10, default=5, easy=5)
    assert move_direction(middle, 5, 4) == "harder" and move_direction(middle, 5, 6) == "harder"
    assert move_direction(middle, 4, 6) == "neither"


def test_wanted_direction_by_the_parents_solve_rate():
    assert wanted_direction(0.0, 4, 2) == "easier"
    assert wanted_direction(1.0, 4, 2) == "harder"
    assert wanted_direction(0.25, 4, 2) == "either"
    assert wanted_direction(0.0, 1, 2) == "either"  # too few episodes: not measured
    assert wanted_direction(None, 0, 2) == "either"
    # a band: below its low end easier, above its high end harder, inside both ways
    band = (0.2, 0.8)
    assert wanted_direction(0.125, 8, 4, band) == "easier"
    assert wanted_direction(0.2, 8, 4, band) == wanted_direction(0.8, 8, 4, band) == "either"
    assert wanted_direction(0.875, 8, 4, band) == "harder"
    assert wanted_direction(0.0, 8, 4, band) == "easier"
    assert wanted_direction(1.0, 8, 4, band) == "harder"
    assert wanted_direction(0.125, 2, 4, band) == "either"  # too few episodes: not measured


def _changed(specs, current, option) -> list[tuple[str, str]]:
    return [(s.name, move_direction(s, current[s.name], option[s.name])) for s in specs
            if option[s.name] != current[s.name]]


def test_frontier_options_move_toward_the_frontier():
    specs = declared_params((SEEDS / "number_guess.py").read_text())
    middle = {"span_max": 160, "guesses": 6}
    # in the band (or not measured): every neighbour and the parent's own setting
    both, drawn = frontier_options(specs, middle, random.Random(0), 8, "either")
    assert drawn == "either" and len(both) == 5 and middle in both
    assert sorted(both, key=str) == sorted(
        candidate_params(specs, middle, random.Random(1), 8) + [middle], key=str)
    # the parent's setting counts toward the limit
    few, drawn = frontier_options(specs, middle, random.Random(0), 3, "either")
    assert len(few) == 3 and middle in few
    easier, drawn = frontier_options(specs, middle, random.Random(0), 8, "easier")
    assert drawn == "easier"
    assert sorted(o["span_max"] for o in easier) == [80, 160]
    assert sorted(o["guesses"] for o in easier) == [6, 7]
    assert all(_changed(specs, middle, o) in ([("span_max", "easier")],
                                              [("guesses", "easier")]) for o in easier)
    harder, drawn = frontier_options(specs, middle, random.Random(0), 8, "harder")
    assert drawn == "harder" and {(o["span_max"], o["guesses"]) for o in harder} == {
        (320, 6), (160, 5)}
    assert middle not in easier and middle not in harder  # off the band: only moves
    for options in (both, easier, harder):  # every option is one neighbour step or none
        assert all(max(edit_steps(specs, middle, o).values()) <= 1 for o in options)


def test_frontier_options_at_the_end_fall_back_or_add_the_parent():
    specs = declared_params((SEEDS / "number_guess.py").read_text())
    easiest = easiest_point(specs)  # span 5, guesses 12
    # never solved at the easiest point: nothing is easier; both ways and the parent again
    options, drawn = frontier_options(specs, easiest, random.Random(0), 8, "easier")
    assert drawn == "fallback" and easiest in options
    assert {(o["span_max"], o["guesses"]) for o in options} == {(5, 12), (10, 12), (5, 11)}
    # always solved at the easiest point: only harder moves
    options, drawn = frontier_options(specs, easiest, random.Random(0), 8, "harder")
    assert drawn == "harder" and easiest not in options and len(options) == 2
    # one knob one step from its end: the single move and the parent's own setting
    one = check_params_schema({"level": {"type": "int", "min": 0, "max": 12, "default": 1}})
    options, drawn = frontier_options(one, {"level": 1}, random.Random(0), 8, "easier")
    assert drawn == "easier" and sorted(o["level"] for o in options) == [0, 1]
    # the limit holds in the fallback too, the parent's setting included
    options, drawn = frontier_options(specs, easiest, random.Random(0), 2, "easier")
    assert drawn == "fallback" and len(options) == 2 and easiest in options
