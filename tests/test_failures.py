"""The failure ledger: every stage the daemon counts is a known one, an unknown one is a bug."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from spade_async.loop.failures import STAGES, Failures

SRC = Path(__file__).resolve().parents[1] / "spade_async"


def _stage_literals() -> set[str]:
    """First-argument string literals of every `failures.count/give_up/retrying(...)` call,
    both arms of a conditional expression included."""
    found: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in {"count", "give_up", "retrying"}
                    and isinstance(node.func.value, ast.Attribute)
                    and node.func.value.attr == "failures" and node.args):
                continue
            found |= _values(node.args[0])
    return found


def _values(expr: ast.expr) -> set[str]:
    if isinstance(expr, ast.IfExp):
        return _values(expr.body) | _values(expr.orelse)
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {expr.value}
    return set()


def test_every_stage_the_daemon_counts_is_known():
    used = _stage_literals()
    assert {"design", "edit", "episode", "document"} <= used  # the scan sees the calls
    assert used <= STAGES, used - STAGES


def test_unknown_stage_is_refused_by_name():
    f = Failures()
    with pytest.raises(ValueError, match="'desing'"):
        f.count("desing", "deadline")
    f.count("edit", "deadline")
    assert f.as_dict()["by_kind"] == {"edit.deadline": 1}
