"""The dependency rules of the code base (DESIGN §1), read from the imports themselves: no import
cycles; memory_db imports neither side; the shared core imports nothing of ours; the trainer
never imports the daemon's internals; `spade --help` loads neither LanceDB nor torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("spade_async", "trainer", "memory_db")
# What the trainer process may use of spade_async: the shared core (config roots, logs, IO, the
# spool, the policy-version file) and the inference client it publishes weights through. Never
# the daemon's stages.
TRAINER_MAY_IMPORT = ("spade_async.core", "spade_async.inference")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


def _graph() -> dict[str, set[str]]:
    """Module -> our modules it imports, anywhere in it (a function's import is a dependency
    too), except under `if TYPE_CHECKING:` (annotations only)."""
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = defaultdict(set)
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for node in ast.walk(tree)
                       if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                       for n in ast.walk(node)}
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                if t.split(".")[0] in PACKAGES:
                    r = resolve(t)
                    if r and r != mod:
                        graph[mod].add(r)
    for mod in mods:
        graph.setdefault(mod, set())
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_memory_db_imports_neither_side_and_the_core_nothing_of_ours():
    graph = _graph()
    for mod, deps in graph.items():
        if mod.startswith("memory_db"):
            assert not [d for d in deps if not d.startswith("memory_db")], mod
        if mod.startswith("spade_async.core"):  # shared by both processes: memory_db at most
            assert not [d for d in deps if not d.startswith(("spade_async.core", "memory_db"))], mod


def test_the_trainer_never_imports_the_daemons_internals():
    bad = {mod: sorted(d for d in deps if d.startswith("spade_async")
                       and not d.startswith(TRAINER_MAY_IMPORT))
           for mod, deps in _graph().items() if mod.startswith("trainer")}
    assert not {m: d for m, d in bad.items() if d}


def test_no_module_imports_another_ones_private_names():
    """A helper two modules need is public where it lives (a test's fakes are not a library)."""
    found = []
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.ImportFrom) and not node.level
                    and (node.module or "").split(".")[0] in PACKAGES
                    and node.module != mod):
                found += [f"{mod}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found


def test_spade_help_loads_neither_lancedb_nor_torch():
    code = ("import sys\nfrom spade_async.cli import app\ntry:\n    app(['--help'])\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in ('lancedb', 'torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
