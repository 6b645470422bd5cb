"""`spade report`'s frontier numbers (report/frontier.py): the neighbour steps each edit moved
each knob, their maximum over the run, and the median unhinted solve rate of the played
variants, from a small synthetic run directory."""

from __future__ import annotations

import json
import time
from pathlib import Path

from typer.testing import CliRunner

from spade_async.cli import app
from spade_async.report.frontier import frontier_summary, frontier_text


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _edit(t: float, steps: dict | None, direction: str = "either",
          status: str = "accepted") -> dict:
    return {"time": t, "design_id": f"x{t}", "move": "edit", "status": status,
            "family": "number_guess", "params": {"span_max": 10, "guesses": 12},
            "parent_params": {"span_max": 5, "guesses": 12}, "direction": direction,
            "parent_solve": 1.0 if direction == "harder" else None, "knob_steps": steps}


def _play(t: float, unhinted: list[float], move: str = "edit") -> dict:
    return {"time": t, "name": "number_guess", "move": move, "params": {"span_max": 10},
            "env_id": "e" * 16, "unhinted": unhinted, "hinted": [1.0], "regret": 0.0}


def _records(t0: float) -> tuple[list[dict], list[dict]]:
    designs = [
        {"time": t0, "design_id": "w1", "move": "write", "status": "accepted", "params": None},
        _edit(t0 + 60, {"span_max": 1, "guesses": 0}, "harder"),
        _edit(t0 + 120, {"span_max": 0, "guesses": 1}, "easier", status="invalid"),
        _edit(t0 + 180, {"span_max": 3, "guesses": 0}),  # a jump: three steps
        {**_edit(t0 + 240, None), "knob_steps": None, "params": None,
         "status": "invalid"},  # the answer broke the constraint: no params, not an edit move
        {k: v for k, v in _edit(t0 + 300, None).items() if k != "knob_steps"},  # older record
    ]
    plays = [
        _play(t0 + 30, [0.0, 0.0, 0.0, 0.0], move="write"),  # 0
        _play(t0 + 90, [1.0, 0.0, 0.0, 0.0]),  # 0.25
        _play(t0 + 150, [1.0, 1.0, 0.0, 0.0]),  # 0.5
        _play(t0 + 210, [1.0, 1.0, 1.0, 0.5]),  # 0.75: 0.5 is no solve at solved_at 1
        _play(t0 + 270, [1.0, 1.0, 1.0, 1.0], move="replay"),  # 1
        _play(t0 + 280, []),  # every episode failed: no rate
    ]
    return designs, plays


def test_frontier_summary_counts_steps_and_solve_rates():
    t0 = 1000.0
    f = frontier_summary(*_records(t0), t0, solved_at=1.0)
    assert f["edits_measured"] == 3 and f["edits_unmeasured"] == 1
    assert [r["max_steps"] for r in f["edit_steps"]] == [1, 1, 3]
    assert f["edit_steps"][0] == {"minute": 1.0, "family": "number_guess",
                                  "status": "accepted", "direction": "harder",
                                  "parent_solve": 1.0, "steps": {"span_max": 1, "guesses": 0},
                                  "max_steps": 1}
    assert f["max_knob_steps"] == 3 and f["edits_over_one_step"] == 1
    assert f["directions"] == {"harder": 1, "easier": 1, "either": 1}
    assert f["plays"] == 5 and f["solve_median"] == 0.5
    assert f["solve_between_share"] == 0.6 and f["solve_in_band_share"] == 0.6
    assert f["by_move"]["edit"] == {"plays": 3, "solve_median": 0.5,
                                    "solve_between_share": 1.0, "solve_in_band_share": 1.0}
    assert f["by_move"]["write"]["solve_median"] == 0.0
    assert f["by_move"]["replay"]["solve_median"] == 1.0
    text = frontier_text(f)
    assert text.startswith("median unhinted solve rate 0.50 over 5 plays (60% strictly")
    assert "at most 3 neighbour step(s) per knob (1 over one step)" in text
    assert "1 recorded without knob steps" in text


def test_frontier_summary_of_a_run_without_plays_or_edits():
    f = frontier_summary([], [], 0.0, solved_at=1.0)
    assert f["plays"] == 0 and f["solve_median"] is None and f["max_knob_steps"] is None
    assert f["edits_over_one_step"] == 0 and f["by_move"] == {}
    assert frontier_text(f) == "no play scored yet; no edit measured"


def test_spade_report_json_and_page_show_the_frontier(tmp_path):
    cfg = tmp_path / "spade.toml"
    cfg.write_text(f'[paths]\ndata_dir = "{tmp_path / "data"}"\n[memory]\n'
                   f'embedding_model = "hash-384"\n')
    designs, plays = _records(time.time() - 600)
    _write_jsonl(tmp_path / "data" / "run" / "designs.jsonl", designs)
    _write_jsonl(tmp_path / "data" / "run" / "plays.jsonl", plays)
    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["report", "--config", str(cfg), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    f = json.loads(res.stdout)["frontier"]
    assert f["max_knob_steps"] == 3 and f["edits_over_one_step"] == 1
    assert f["solve_median"] == 0.5 and len(f["edit_steps"]) == 3
    page = (out / "index.html").read_text()
    assert "<tr><th>frontier</th><td>median unhinted solve rate 0.50 over 5 plays" in page
