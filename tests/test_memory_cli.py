"""`spade memory ...` end to end: the 18 seed environments added through the real sandbox and
the real MiniLM embedder, then search / list / show / stats / export, with and without --json;
and `spade bench memory` on a small synthetic set. The commands are mounted on a throwaway typer
app exactly as spade_async/cli/ mounts them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from spade_async.cli.bench.memory import bench_memory
from spade_async.cli.memory import memory_app

SEEDS = sorted(p for p in (Path(__file__).resolve().parents[1] / "spade_async" / "envs" /
                           "seeds").glob("*.py") if p.name != "__init__.py")
BROKEN = '''
class Environment:
    name = "broken"
    description = "Its hint is empty."
    def reset(self, seed):
        return "go", {}
    def step(self, action):
        return "done", 0.0, True, False, {}
    def hint(self):
        return "   "
'''

root = typer.Typer()
root.add_typer(memory_app, name="memory")
bench = typer.Typer()
bench.command("memory")(bench_memory)
root.add_typer(bench, name="bench")


@pytest.fixture(scope="module")
def memory_cli(tmp_path_factory):
    """A config whose data_dir is private to this module, and a runner bound to it."""
    base = tmp_path_factory.mktemp("memory-cli")
    cfg = base / "spade.toml"
    cfg.write_text(f'[paths]\ndata_dir = "{base / "data"}"\n\n[sandbox]\nslots = 2\n'
                   'warm_workers = 2\n')

    def run(*args: str, code: int | None = 0):
        res = CliRunner().invoke(root, [*args, "--config", str(cfg)])
        if code is not None:
            assert res.exit_code == code, (res.stdout, res.stderr, res.exception)
        return res

    run.base = base
    # every test of this module reads the memory these two adds build
    run.added = run("memory", "add", *map(str, SEEDS), "--json")
    (base / "broken.py").write_text(BROKEN)
    run.broken = run("memory", "add", str(base / "broken.py"), "--json", code=1)
    return run


def test_seed_environments_are_added_through_the_sandbox(memory_cli):
    assert len(SEEDS) == 18
    res = memory_cli.added
    out = json.loads(res.stdout)
    assert [o["status"] for o in out] == ["accepted"] * 18, [o["reason"] for o in out]
    assert all(o["validation"] and not o["existed"] for o in out)
    assert "validating 18 file(s) in the sandbox" in res.stderr

    again = memory_cli("memory", "add", str(SEEDS[0]))
    assert "already stored as accepted" in again.stdout

    (row,) = json.loads(memory_cli.broken.stdout)
    assert row["status"] == "rejected" and row["reason"].startswith("hint:")


def test_search_list_show_stats_export(memory_cli):
    hits = json.loads(memory_cli("memory", "search", "walk through a maze to the goal", "-k", "3",
                                 "--json").stdout)
    assert hits[0]["name"] == "grid_maze" and [h["rank"] for h in hits] == [1, 2, 3]
    plain = json.loads(memory_cli("memory", "search", "walk through a maze to the goal", "-k",
                                  "3", "--no-diverse", "--json").stdout)
    assert plain[0]["id"] == hits[0]["id"]
    sims = [h["similarity"] for h in plain]
    assert sims == sorted(sims, reverse=True)
    text = memory_cli("memory", "search", "a calendar of meetings", "-k", "2").stdout
    assert "calendar_booking" in text and "MMR" in text

    listed = json.loads(memory_cli("memory", "list", "--limit", "50", "--json").stdout)
    assert len(listed) == 19 and {r["status"] for r in listed} == {"accepted", "rejected"}
    assert listed[0]["name"] == "broken"  # newest first
    accepted = json.loads(memory_cli("memory", "list", "--status", "accepted", "--sort", "regret",
                                     "--limit", "5", "--json").stdout)
    assert len(accepted) == 5 and all(r["status"] == "accepted" for r in accepted)
    assert "grid_maze" in memory_cli("memory", "list", "--limit", "50").stdout
    assert memory_cli("memory", "list", "--sort", "bogus", code=2).stderr.startswith("error:")

    maze = next(r for r in listed if r["name"] == "grid_maze")
    shown = json.loads(memory_cli("memory", "show", maze["id"][:8], "--code", "--json").stdout)
    assert shown["id"] == maze["id"] and "class Environment" in shown["code"]
    assert shown["source_doc_id"] == "file:grid_maze.py" and shown["tags"] == ["hand-written"]
    human = memory_cli("memory", "show", maze["id"]).stdout
    assert "grid_maze" in human and "class Environment" not in human
    assert "no environment" in memory_cli("memory", "show", "ffffffffffffffff", code=1).stderr

    stats = json.loads(memory_cli("memory", "stats", "--json").stdout)
    assert stats["counts"] == {"accepted": 18, "rejected": 1, "total": 19}
    assert stats["reasons"] == {"hint": 1}
    d = stats["diversity"]["mean_pairwise_cosine_distance"]
    assert stats["diversity"]["n"] == 18 and 0.3 < d < 1.2
    assert "mean pairwise cosine distance" in memory_cli("memory", "stats").stdout

    path = memory_cli.base / "export.jsonl"
    res = memory_cli("memory", "export", str(path), "--json")
    assert json.loads(res.stdout) == {"path": str(path), "rows": 19}
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 19 and all("code" in r and "stats" in r for r in rows)
    assert "wrote 19 environments" in memory_cli("memory", "export", str(path)).stdout


def test_missing_memory_and_bad_config_are_clear_errors(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[paths]\ndata_dir = "{tmp_path / "data"}"\n')
    res = CliRunner().invoke(root, ["memory", "stats", "--config", str(cfg)])
    assert res.exit_code == 1 and "no environment memory here yet" in res.stderr
    res = CliRunner().invoke(root, ["memory", "list", "--config", str(tmp_path / "nope.toml")])
    assert res.exit_code == 2 and res.stderr.startswith("error:")


def test_bench_memory_reports_ratios_recall_and_insert_rates(tmp_path):
    res = CliRunner().invoke(root, ["bench", "memory", "--rows", "2000", "--queries", "10",
                                    "--novelty-rows", "20", "--keep", str(tmp_path), "--json"])
    assert res.exit_code == 0, (res.stdout, res.stderr, res.exception)
    r = json.loads(res.stdout)
    assert r["rows"] == 2000 and r["index"]["type"] == "IVF_PQ"
    assert r["ratio_lancedb_over_numpy"] > 0 and 0.0 <= r["recall_at_k"] <= 1.0
    assert r["insert"]["rows_per_s"] > 0 and r["insert_with_novelty"]["rows"] == 20
    assert "[bench]" in res.stderr
