"""`spade bench report`: `spade report` on a run whose transcripts total N GB, its peak RSS.

A synthetic run dir: `run/episodes.jsonl` rolled into `episodes.rolled/` segments (plain JSON
lines, as a crash between a roll's rename and its compression leaves them, so generating is
cheap) of episodes that carry transcripts of realistic size (turns of a few hundred characters),
plus plays, designs and a trainer metrics file of matching counts. Then `spade report --json` on
it in a child process; its peak resident memory (the child's ru_maxrss) and wall time are the
figures. The issue-32 bar: under 1 GB for 5 GB of transcripts.
"""

from __future__ import annotations

import json
import random
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SEGMENT_BYTES = 64 << 20


def _episode(i: int, rng: random.Random, t0: float) -> dict[str, Any]:
    turns = [{"action": "GUESS: " + str(rng.randint(100, 900)) + " because " + "x" * 120,
              "observation": "The secret is higher than " + str(rng.randint(100, 900))
              + ". " + "y" * 240, "reward": 0.0} for _ in range(rng.randint(2, 8))]
    return {"time": t0 + i * 0.05, "episode_id": f"ep-{i:012x}", "env_id": f"env{i % 97}",
            "seed": i, "hinted": i % 5 < 2, "policy_version": i // 2000, "model": "policy",
            "prompt_len": 300, "first_observation": "I am thinking of an integer " + "z" * 200,
            "turns": turns, "score": float(rng.random() < 0.3), "terminated": True,
            "truncated": False, "error": None, "error_kind": None, "seconds": 1.5,
            "sampled_tokens": 40 * len(turns), "sequence_tokens": 300 + 120 * len(turns)}


def generate(run_dir: Path, gb: float, progress: Callable[[str], None]) -> dict[str, Any]:
    """Episodes until their JSON lines total `gb` GB, in 64 MB rolled segments."""
    rng = random.Random(0)
    rolled = run_dir / "episodes.rolled"
    rolled.mkdir(parents=True, exist_ok=True)
    target, written, n, seq = int(gb * (1 << 30)), 0, 0, 0
    t0 = time.time() - 7 * 86400
    while written < target:
        seq += 1
        seg = rolled / f"{seq:08d}-20260101T000000Z.jsonl"
        size = 0
        with open(seg, "w", encoding="utf-8") as f:
            while size < SEGMENT_BYTES and written + size < target:
                line = json.dumps(_episode(n, rng, t0)) + "\n"
                f.write(line)
                size += len(line)
                n += 1
        written += size
        if seq % 10 == 0:
            progress(f"generated {written / (1 << 30):.2f} of {gb} GB ({n} episodes)")
    with open(run_dir / "plays.jsonl", "w") as f:
        for i in range(n // 10):
            f.write(json.dumps({"time": t0 + i * 0.5, "env_id": f"env{i % 97}",
                                "variant_id": f"env{i % 97}.v{i % 7}", "name": "fam",
                                "move": "edit", "unhinted": [0.0, 1.0] * 4, "hinted": [1.0, 1.0],
                                "regret": 0.25, "r_unhinted": 0.5, "r_hinted": 1.0}) + "\n")
    with open(run_dir / "designs.jsonl", "w") as f:
        for i in range(n // 40):
            f.write(json.dumps({"time": t0 + i * 2.0, "status": "accepted" if i % 3 else
                                "invalid", "reason": "" if i % 3 else "static.parse",
                                "move": "write", "policy_version": i // 500}) + "\n")
    return {"episodes": n, "segments": seq, "bytes": written}


def run_report_bench(workdir: Path, *, gb: float = 5.0, keep: bool = False,
                     progress: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    import shutil

    data = workdir / "data"
    run_dir = data / "run"
    if (run_dir / "episodes.rolled").is_dir() and keep:
        progress(f"reusing the run at {run_dir}")
        made = {"reused": True}
    else:
        shutil.rmtree(data, ignore_errors=True)
        made = generate(run_dir, gb, progress)
    cfg = workdir / "report-bench.toml"
    cfg.write_text(f'extends = "{Path(__file__).resolve().parents[2] / "configs" / "embedded.toml"}"\n'
                   f'[paths]\ndata_dir = "{data}"\n')
    transcripts = sum(p.stat().st_size for p in (run_dir / "episodes.rolled").iterdir())
    progress(f"spade report on {transcripts / (1 << 30):.2f} GB of transcripts")
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "spade_async.cli", "report", "-c", str(cfg),
                          "--json"], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if res.returncode != 0:
        raise RuntimeError(f"spade report failed ({res.returncode}): {res.stderr[-2000:]}")
    summary = json.loads(res.stdout)
    out = {"transcripts_gb": round(transcripts / (1 << 30), 3), **made,
           "report_seconds": round(seconds, 1),
           # the largest of this process's children: the report is the only one
           "report_peak_rss_mb": round(peak_kb / 1024, 1),
           "episodes_reported": summary.get("episodes")}
    if not keep:
        shutil.rmtree(data, ignore_errors=True)
    return out
