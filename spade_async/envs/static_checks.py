"""The static checks of the validation pipeline: what the source text of a design must satisfy
before anything runs (size, parse, allow-listed imports, no interpreter internals, the
Environment class's shape, the knobs' schema and a proposed variant's values).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from spade_async.envs.contract import ALLOWED_IMPORTS, REQUIRED_METHODS, ContractError
from spade_async.envs.knobs import (
    COMPUTED,
    check_params_schema,
    class_params_literal,
    resolve_params,
)
from spade_async.envs.validation_report import Check

FORBIDDEN_NAMES = frozenset(
    "__import__ eval exec compile open input breakpoint globals locals vars memoryview help "
    "exit quit getattr setattr delattr __builtins__ __loader__ __spec__".split()
)
ALLOWED_DUNDERS = frozenset(
    "__init__ __repr__ __str__ __eq__ __lt__ __le__ __gt__ __ge__ __hash__ __len__ __iter__ "
    "__contains__ __post_init__ __name__".split()
)
_DUNDER_TEXT = re.compile(r"__\w+__")


def static_checks(code: str, max_bytes: int, params: dict[str, Any] | None = None) -> list[Check]:
    checks: list[Check] = []
    size = len(code.encode())
    checks.append(Check("static.size", size <= max_bytes,
                        "" if size <= max_bytes else f"{size} bytes, the limit is {max_bytes}"))
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        lines = code.count("\n") + 1
        before = max(0, min((exc.lineno or 1) - 1, lines)) / lines
        checks.append(Check("static.parse", False, f"SyntaxError: {exc.msg} (line {exc.lineno})",
                            credit=min(before, 0.99)))
        return checks
    checks.append(Check("static.parse", True))

    bad_imports = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad_imports += [a.name for a in node.names if a.name.split(".")[0] not in ALLOWED_IMPORTS]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level or mod.split(".")[0] not in ALLOWED_IMPORTS:
                bad_imports.append("." * node.level + mod)
    checks.append(Check("static.imports", not bad_imports, "" if not bad_imports else
                        f"imports outside the allow-list: {', '.join(sorted(set(bad_imports)))} "
                        f"(allowed: {', '.join(sorted(ALLOWED_IMPORTS))})"))

    bad: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            bad.append(f"line {node.lineno}: use of '{node.id}'")
        elif isinstance(node, ast.Name) and node.id.startswith("__") and node.id not in ALLOWED_DUNDERS:
            bad.append(f"line {node.lineno}: name '{node.id}'")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__") and (
            node.attr not in ALLOWED_DUNDERS or node.attr == "__name__"
        ):
            bad.append(f"line {node.lineno}: attribute '.{node.attr}'")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _DUNDER_TEXT.search(
            node.value
        ):
            bad.append(f"line {node.lineno}: string naming a dunder ({_DUNDER_TEXT.search(node.value)[0]})")
    checks.append(Check("static.names", not bad, "" if not bad else
                        "reaches interpreter internals: " + "; ".join(bad[:5])))

    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Environment"]
    if not classes:
        checks.append(Check("static.class", False, "no top-level class named Environment"))
    else:
        methods = {n.name for n in classes[0].body if isinstance(n, ast.FunctionDef)}
        missing = [m for m in REQUIRED_METHODS if m not in methods]
        checks.append(Check("static.class", not missing, "" if not missing else
                            f"Environment lacks {', '.join(m + '()' for m in missing)}"))
    checks.append(_static_params(classes[0] if classes else None, params))
    return checks


def _static_params(cls: ast.ClassDef | None, params: dict[str, Any] | None) -> Check:
    """The knobs' schema, and a proposed variant's values against it, before anything runs.
    The loaded environment's own `params` is checked again after load (it may be computed)."""
    raw = class_params_literal(cls)
    if raw is COMPUTED:
        return Check("static.params", True, "params is not a literal: checked after load")
    try:
        specs = check_params_schema(raw)
    except ContractError as exc:
        return Check("static.params", False, str(exc))
    if params is not None and (specs or raw is not None):
        try:
            resolve_params(specs, params)
        except ContractError as exc:
            return Check("static.params", False, variant_reason(params, exc))
    return Check("static.params", True, ", ".join(s.name for s in specs))


def variant_reason(params: Any, exc: ContractError) -> str:
    text = json.dumps(params, ensure_ascii=False, default=repr)
    return f"the proposed params {text[:200]} do not fit the environment: {exc}"
