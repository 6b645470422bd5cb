"""Difficulty knobs (`Environment.params`): checking a declared schema, resolving an episode's
values against it, the easiest and the extreme settings, and reading a module's literal knobs
from its source without running it.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
from typing import Any

from spade_async.envs.contract import ContractError, ParamSpec

# Small on purpose: an edit move decodes a choice of values under structured outputs, and
# validation runs at every knob's extremes.
PARAM_TYPES = ("int", "float", "bool", "choice")
PARAM_NAME = re.compile(r"[a-z_][a-z0-9_]*")
MAX_PARAMS = 8
MAX_PARAM_NAME = 32
MAX_CHOICES = 32
MAX_PARAM_DESCRIPTION = 200


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    """An int or a finite float that converts to a finite float (a 400-digit int does not:
    float() of it would raise OverflowError past the contract's checks)."""
    if _is_int(v):
        try:
            return math.isfinite(float(v))
        except OverflowError:
            return False
    return isinstance(v, float) and math.isfinite(v)


_SPEC_KEYS = {
    "int": {"type", "min", "max", "default", "description", "easy"},
    "float": {"type", "min", "max", "default", "description", "easy"},
    "bool": {"type", "default", "description", "easy"},
    "choice": {"type", "choices", "default", "description", "easy"},
}


def _check_spec(name: Any, spec: Any) -> ParamSpec:
    checked = _check_spec_values(name, spec)
    if spec.get("easy") is None:
        return checked
    try:  # the easiest value must be a value the knob takes
        easy = resolve_params((checked,), {checked.name: spec["easy"]})[checked.name]
    except ContractError as exc:
        raise ContractError(f"Environment.params: knob '{name}': easy: {exc}") from None
    return dataclasses.replace(checked, easy=easy)


def _check_spec_values(name: Any, spec: Any) -> ParamSpec:
    if not isinstance(name, str) or len(name) > MAX_PARAM_NAME or not PARAM_NAME.fullmatch(name):
        raise ContractError(f"Environment.params: knob name {name!r} must be an identifier "
                            f"[a-z_][a-z0-9_]* of at most {MAX_PARAM_NAME} characters")

    def bad(what: str) -> ContractError:
        return ContractError(f"Environment.params: knob '{name}': {what}")

    if not isinstance(spec, dict):
        raise bad(f"the spec must be a dict like {{\"type\": \"int\", \"min\": 1, \"max\": 5, "
                  f"\"default\": 2}}, got {type(spec).__name__}")
    kind = spec.get("type")
    if kind not in PARAM_TYPES:
        raise bad(f"type must be one of {', '.join(PARAM_TYPES)}, got {kind!r}")
    unknown = sorted(map(str, set(spec) - _SPEC_KEYS[kind]))
    if unknown:
        raise bad(f"unknown key(s) {', '.join(unknown)} for {'an' if kind == 'int' else 'a'} "
                  f"{kind} knob "
                  f"(allowed: {', '.join(sorted(_SPEC_KEYS[kind]))})")
    if "default" not in spec:
        raise bad("a default is required")
    desc = spec.get("description", "")
    if not isinstance(desc, str) or "\n" in desc or len(desc) > MAX_PARAM_DESCRIPTION:
        raise bad(f"description must be one line of at most {MAX_PARAM_DESCRIPTION} characters")
    default = spec["default"]
    if kind in ("int", "float"):
        ok = _is_int if kind == "int" else _is_number
        words = "an int" if kind == "int" else "a finite number"
        for key in ("min", "max", "default"):
            if key not in spec:
                raise bad(f"{key} is required for a {kind} knob")
            if not ok(spec[key]):
                raise bad(f"{key} must be {words}, got {spec[key]!r}")
        lo, hi = spec["min"], spec["max"]
        if kind == "float":
            lo, hi, default = float(lo), float(hi), float(default)
        if lo > hi:
            raise bad(f"min {lo} is greater than max {hi}")
        if not lo <= default <= hi:
            raise bad(f"needs min <= default <= max, got min={lo}, default={default}, max={hi}")
        return ParamSpec(name, kind, lo, hi, None, default, desc)
    if kind == "bool":
        if not isinstance(default, bool):
            raise bad(f"default must be true or false, got {default!r}")
        return ParamSpec(name, kind, default=default, description=desc)
    choices = spec.get("choices")
    if not isinstance(choices, (list, tuple)) or not 1 <= len(choices) <= MAX_CHOICES:
        raise bad(f"choices must be a list of 1 to {MAX_CHOICES} values, got {choices!r:.80}")
    for c in choices:
        if not (isinstance(c, str) or _is_number(c)):
            raise bad(f"choice {c!r} is not a string, int or finite float")
    choices = list(choices)
    for i, c in enumerate(choices):
        if c in choices[:i]:
            raise bad(f"choice {c!r} appears twice")
    if isinstance(default, bool) or default not in choices:
        raise bad(f"default {default!r} is not one of the choices {choices!r:.120}")
    return ParamSpec(name, kind, choices=tuple(choices), default=choices[choices.index(default)],
                     description=desc)


def easiest_point(specs: tuple[ParamSpec, ...] | list[ParamSpec]) -> dict[str, Any]:
    """Every knob at its easiest value (`ParamSpec.easiest`), resolved: where the edit move
    starts an environment never played (as ACCEL starts from simple levels) and the default
    probe set's easy rung."""
    return resolve_params(tuple(specs), {s.name: s.easiest for s in specs})


def check_params_schema(raw: Any) -> tuple[ParamSpec, ...]:
    """Check an environment's declared knobs (`Environment.params`, as the worker sent them).
    None or {} means no knobs. Every error names the knob and what is wrong with it."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ContractError("Environment.params must be a dict of knob name -> spec, got "
                            f"{type(raw).__name__}")
    if len(raw) > MAX_PARAMS:
        raise ContractError(f"Environment.params declares {len(raw)} knobs; at most {MAX_PARAMS}")
    return tuple(_check_spec(name, spec) for name, spec in raw.items())


def resolve_params(specs: tuple[ParamSpec, ...], given: dict[str, Any] | None) -> dict[str, Any]:
    """Every knob's value for one episode: `given` with the defaults filled in, in the
    declared order. An unknown name, a wrong type or a value out of range raises ContractError
    naming the knob and what it allows; {} for an environment without knobs."""
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise ContractError(f"params must be a dict of knob name -> value, got "
                            f"{type(given).__name__}")
    known = {s.name: s for s in specs}
    unknown = [k for k in given if k not in known]
    if unknown:
        declared = ", ".join(known) if known else "none"
        raise ContractError(f"unknown param {unknown[0]!r} (this environment's params: "
                            f"{declared})")
    out: dict[str, Any] = {}
    for s in specs:
        value = given.get(s.name, s.default)
        ok = False
        if s.type == "int":
            ok = _is_int(value) and s.min <= value <= s.max
        elif s.type == "float":
            ok = _is_number(value) and s.min <= value <= s.max
            value = float(value) if ok else value
        elif s.type == "bool":
            ok = isinstance(value, bool)
        elif not isinstance(value, bool) and value in (s.choices or ()):
            value, ok = s.choices[s.choices.index(value)], True  # the declared spelling
        if not ok:
            raise ContractError(f"param '{s.name}' must be {s.allowed()}, got "
                                f"{json.dumps(value, default=repr)[:80]}")
        out[s.name] = value
    return out


def extreme_points(specs: tuple[ParamSpec, ...]) -> list[dict[str, Any]]:
    """The knob settings validation runs at: the defaults first, then each knob at its ends
    (min and max, first and last choice, both bools) with the others at their defaults.
    Duplicates are dropped, the order is stable."""
    base = resolve_params(specs, None)
    points = [base]
    for s in specs:
        if s.type in ("int", "float"):
            ends = (s.min, s.max)
        elif s.type == "bool":
            ends = (False, True)
        else:
            ends = (s.choices[0], s.choices[-1])
        for v in ends:
            point = base | {s.name: v}
            if point not in points:
                points.append(point)
    return points


# ---- reading the knobs without running the module ---------------------------------------

COMPUTED = object()


def class_params_literal(cls: ast.ClassDef | None) -> Any:
    """The class body's `params = {...}` as a value: None when there is none, COMPUTED when it
    is not a literal (then only the loaded environment can tell)."""
    value = None
    for node in cls.body if cls is not None else ():
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else [])
        if any(isinstance(t, ast.Name) and t.id == "params" for t in targets):
            value = node.value
    if value is None:
        return None
    try:
        return ast.literal_eval(value)
    except Exception:  # any non-literal (or absurdly nested) expression
        return COMPUTED


def declared_params(code: str) -> tuple[ParamSpec, ...]:
    """The knobs a module's Environment declares as a literal, read without running it (the
    daemon never imports environment code, seeds included). ContractError when the module does
    not parse, has no Environment class, or its `params` is not a literal or not a valid
    schema; () when it declares none."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise ContractError(f"the module does not parse: {exc.msg} (line {exc.lineno})") from None
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Environment"]
    if not classes:
        raise ContractError("no top-level class named Environment")
    raw = class_params_literal(classes[0])
    if raw is COMPUTED:
        raise ContractError("Environment.params is not a literal: only the loaded environment "
                            "can tell its knobs")
    return check_params_schema(raw)
