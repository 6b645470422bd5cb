"""The Procfile's `daemon` and `trainer` lines under honcho, as `bash scripts/run.sh` starts
them, against a scripted OpenAI-compatible endpoint that serves LoRA adapters by name:
the trainer consumes the batches the daemon writes (every one, in order, once), publishes
versions through the vllm-lora backend, and the daemon then samples with them (its requests
name `policy-vN` and its later batches carry policy_version N). The real SmolLM2 checkpoint is
trained; the real sandbox, spool and LanceDB memory run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from spade_async.testing.scripted import Script
from spade_async.testing.stack import scripted_stack_toml

REPO = Path(__file__).resolve().parents[1]


def _config(tmp: Path, base_url: str, checkpoint: Path) -> Path:
    (tmp / "data" / "models").mkdir(parents=True)
    (tmp / "data" / "models" / "smollm2").symlink_to(checkpoint)
    cfg = tmp / "spade.toml"
    cfg.write_text(f'[paths]\ndata_dir = "{tmp / "data"}"\n' + scripted_stack_toml(tmp, base_url))
    return cfg


def _steps(metrics: Path) -> list[dict]:
    if not metrics.exists():
        return []
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def test_procfile_trainer_consumes_daemon_batches_and_daemon_samples_new_versions(
        fake, checkpoint, tmp_path):
    scripted, chat = fake
    scripted.state.script = Script(chat, per_document=True)  # every document makes a batch
    scripted.state.token_latency_s = 0.002
    cfg = _config(tmp_path, scripted.base_url, checkpoint)
    data = tmp_path / "data"
    env = dict(os.environ, HF_HUB_OFFLINE="1", SPADE_CONFIG=str(cfg),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    log = tmp_path / "honcho.log"
    with open(log, "wb") as out:
        stack = subprocess.Popen(
            [str(Path(sys.executable).with_name("honcho")), "start", "daemon", "trainer"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    sampled_with: set[str] = set()
    try:
        deadline = time.monotonic() + 600
        while True:
            assert stack.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            steps = [s for s in _steps(data / "trainer" / "metrics.jsonl")
                     if s["event"] == "step"]
            sampled_with = {m for m in scripted.state.models_seen if m.startswith("policy-v")}
            # Two versions published, and the daemon has sent requests to the second.
            if len(steps) >= 3 and "policy-v2" in sampled_with:
                break
            time.sleep(0.5)
    finally:
        if stack.poll() is None:
            os.killpg(stack.pid, signal.SIGTERM)  # honcho stops both; each drains and exits
        try:
            stack.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(stack.pid, signal.SIGKILL)
            stack.wait()
    lines = _steps(data / "trainer" / "metrics.jsonl")
    trained = [s for s in lines if s["event"] in ("step", "skipped")]
    ranges = [s["seqs"] for s in trained]  # the first and last batch each step drew from
    # The batches in order from the first (every row once is tests/test_trainer_buffer.py's);
    # every publish went through.
    assert ranges[0][0] == 1 and ranges == sorted(ranges), ranges
    seqs = [r[1] for r in ranges]
    published = [s["publish"] for s in lines if "publish" in s]
    assert published and all(p["ok"] for p in published), published
    assert [p["version"] for p in published] == list(range(1, len(published) + 1))
    assert {"policy-v1", "policy-v2"} <= sampled_with
    assert {p["model"] for p in published} >= {"policy-v1", "policy-v2"}
    # The trainer recorded where the daemon reads it; the daemon moved to it.
    current = json.loads((data / "weights" / "current.json").read_text())
    assert current["version"] == len(published) and current["model"] == f"policy-v{len(published)}"
    status = json.loads((data / "run" / "status.json").read_text())
    assert status["policy_version"] >= 2, status
    # The daemon's later batches hold samples drawn with a published version: the trainer
    # trained on them (staleness below its own version means policy_version >= 1).
    assert any(s["event"] == "step" and s["version"] >= 1
               and s["staleness_max"] < s["version"] for s in trained), trained
    # `spade status` shows the trainer as the files show it.
    res = subprocess.run([sys.executable, "-m", "spade_async.cli", "status", "-c", str(cfg),
                          "--json"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    t = json.loads(res.stdout)["trainer"]
    assert t["taken_seq"] >= seqs[-1] and t["published_version"] == len(published)
    assert t["step"] == max(s["step"] for s in trained) and t["last_seq"] >= seqs[-1]
    res = subprocess.run([sys.executable, "-m", "spade_async.cli", "status", "-c", str(cfg)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert f"taken {t['taken_seq']} of" in res.stdout and "trainer    step" in res.stdout, \
        res.stdout
