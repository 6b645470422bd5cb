"""Exactly-once under kill -9: a trainer killed mid-step and mid-checkpoint, restarted, ends with
every sample trained once, the same step count, the same weights and the same published
versions as a run that was never interrupted. Steps are sample budgets that straddle spool
batches (6 agent samples a step, 4 in a batch), so partly trained batches cross the kills."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spade_async.core.spool.files import FileSpool
from spade_async.testing.fake.server import FakeOpenAIServer
from trainer.testing import tiny_llama, write_batches, write_config, write_trainer_config

REPO = Path(__file__).resolve().parents[1]
N_BATCHES = 10  # 4 agent and 2 designer samples each
SAMPLES_PER_STEP = 6
STEPS = 6  # 36 of the 40 agent samples
PUBLISH_EVERY = 2


def start(d: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    with open(d / "trainer.log", "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "trainer", "--config", str(d / "cfg.toml"),
             "--trainer-config", str(d / "trainer.toml"), *args],
            cwd=REPO, env=env, stdout=log, stderr=log)


def finish(proc: subprocess.Popen, d: Path, timeout: float = 120) -> None:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    assert rc == 0, (d / "trainer.log").read_text()[-4000:]


def kill_when(proc: subprocess.Popen, d: Path, condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"trainer exited ({proc.returncode}) before {what}:\n"
                        + (d / "trainer.log").read_text()[-3000:])
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {what} within {timeout}s")
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def step_lines(d: Path) -> list[dict]:
    f = d / "trainer" / "metrics.jsonl"
    if not f.exists():
        return []
    lines = []
    for raw in f.read_text().splitlines():
        try:
            line = json.loads(raw)
        except json.JSONDecodeError:  # a line torn by the kill
            continue
        if line["event"] == "step":
            lines.append(line)
    return lines


def setup_run(tmp: Path, name: str, model: Path, server: FakeOpenAIServer,
              **trainer: object) -> Path:
    d = tmp / name
    (d / "models").mkdir(parents=True)
    (d / "models" / "tiny").symlink_to(model)
    write_config(d / "cfg.toml", d, checkpoint_name="tiny",
                 endpoints=[("fake", server.base_url, "vllm-lora")],
                 swap_options="max_loaded_adapters = 2\n")
    write_trainer_config(d / "trainer.toml", mode="lora", lora_rank=4, lora_alpha=8.0,
                         lr=5e-3, micro_batch_tokens=64,
                         publish_every_steps=PUBLISH_EVERY, max_staleness=100,
                         publish_timeout_s=20.0,
                         **{"samples_per_step": SAMPLES_PER_STEP, "checkpoint_every_steps": 3,
                            **trainer})
    return d


def final_state(d: Path) -> dict:
    ckpts = d / "trainer" / "checkpoints"
    latest = json.loads((ckpts / "latest.json").read_text())["dir"]
    return json.loads((ckpts / latest / "trainer_state.json").read_text())


def test_kill_9_mid_run_then_restart_trains_every_sample_exactly_once(tmp_path):
    model = tiny_llama(tmp_path / "tiny")
    with FakeOpenAIServer() as ref_server, FakeOpenAIServer() as server:
        # The run nobody interrupts.
        ref = setup_run(tmp_path, "reference", model, ref_server)
        write_batches(ref / "spool", N_BATCHES, seed=11)
        finish(start(ref, "--max-steps", str(STEPS)), ref)

        run = setup_run(tmp_path, "killed", model, server)
        write_batches(run / "spool", 8, seed=11)  # the same batches, the rest come later

        # 1. kill -9 right after step 5 is logged: it is in no checkpoint (steps 3 and 6
        #    checkpoint; a publish does not force one), v2 was published at step 4 after
        #    the checkpoint, and batch 8 is half trained.
        kill_when(start(run), run, lambda: len(step_lines(run)) >= 5, "step 5")
        # 2. restart; kill -9 as soon as a checkpoint directory is being written.
        ckpts = run / "trainer" / "checkpoints"
        before = {p.name for p in ckpts.iterdir()}
        write_batches(run / "spool", N_BATCHES - 8, skip=8, seed=11)
        kill_when(start(run), run,
                  lambda: any(p.name.endswith(".tmp") and p.name not in before
                              for p in ckpts.iterdir()), "a checkpoint being written")
        # 3. restart and run to the end.
        finish(start(run, "--max-steps", str(STEPS)), run)

    attempts = [line["step"] for line in step_lines(run)]
    # The restarts resumed behind the published version: the retrained publish steps did not
    # publish their versions again (the servers had them), the later ones did.
    skipped = [line["step"] for line in step_lines(run)
               if (line.get("publish") or {}).get("skipped")]
    assert 4 in skipped, step_lines(run)
    state, ref_state = final_state(run), final_state(ref)
    assert state["step"] == ref_state["step"] == STEPS
    assert state["samples"] == ref_state["samples"] and state["tokens"] == ref_state["tokens"]
    assert state["dropped"] == ref_state["dropped"]
    assert (state["last_seq"], state["open"]) == (ref_state["last_seq"], ref_state["open"])
    assert state["open"]  # a partly trained batch is where both stopped
    # The kills cost work (a step trained after the last checkpoint was trained again)...
    assert len(attempts) > STEPS and sorted(set(attempts)) == list(range(1, STEPS + 1))
    # ...but none of it reached the weights twice: they equal the uninterrupted run's.
    last = STEPS // PUBLISH_EVERY
    ours = load_file(run / "weights" / f"v{last}" / "adapter_model.safetensors")
    theirs = load_file(ref / "weights" / f"v{last}" / "adapter_model.safetensors")
    assert set(ours) == set(theirs) and ours
    for k in ours:
        torch.testing.assert_close(ours[k], theirs[k], atol=1e-7, rtol=1e-6, msg=k)
    # Publishing survived the kills too: the last version is current, the server holds the
    # newest two adapters (the restarted trainer retired the older ones it had loaded).
    current = json.loads((run / "weights" / "current.json").read_text())
    assert current["version"] == last and current["model"] == f"policy-v{last}"
    assert set(server.state.adapters) == {f"policy-v{last - 1}", f"policy-v{last}"}
    assert set(ref_server.state.adapters) == set(server.state.adapters)
    # The spool is acknowledged up to the last batch a checkpoint holds wholly, no further.
    assert FileSpool(run / "spool").acked_seq() == ref_state["last_seq"] < N_BATCHES


def test_sigterm_mid_step_abandons_the_step_and_restart_trains_the_batch(tmp_path):
    """honcho SIGKILLs 5 s after its SIGTERM, and a CPU step takes longer: a step with nothing
    unsaved before it is dropped at once, unacknowledged, and trained on the next start."""
    model = tiny_llama(tmp_path / "tiny")
    with FakeOpenAIServer() as server:
        run = setup_run(tmp_path, "term", model, server, samples_per_step=2000,
                        designer_max_share=0.5)  # the whole batch is one step
        # One batch big enough that its step (hundreds of micro-batches) is surely under way
        # when the signal comes; the trainer starts on it as soon as it is up.
        write_batches(run / "spool", 1, seed=3, samples_per_batch=3000)
        proc = start(run)
        log = run / "trainer.log"
        deadline = time.monotonic() + 120
        while "trainer_started" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        finish(proc, run)
        text = log.read_text()
        assert "trainer_step_abandoned" in text and step_lines(run) == [], text[-3000:]
        assert FileSpool(run / "spool").acked_seq() == 0
        finish(start(run, "--max-steps", "1"), run, timeout=300)
    assert [line["step"] for line in step_lines(run)] == [1]
    state = final_state(run)
    assert state["step"] == 1 and state["last_seq"] == 1


def test_a_stop_mid_step_keeps_the_steps_before_it(tmp_path):
    """Checkpoints are not per step: a SIGTERM during a step drops that step (its weights are
    not yet changed) and checkpoints the steps trained since the last checkpoint, inside
    honcho's 5 s; the dropped step's batch is trained on the next start."""
    model = tiny_llama(tmp_path / "tiny")
    with FakeOpenAIServer() as server:
        run = setup_run(tmp_path, "term-dirty", model, server, samples_per_step=2000,
                        designer_max_share=0.5, step_wait_s=1.0, checkpoint_every_steps=100,
                        checkpoint_every_minutes=0.0)
        write_batches(run / "spool", 1, seed=5)  # 4 agent samples: a step after step_wait_s
        proc = start(run)
        log = run / "trainer.log"
        deadline = time.monotonic() + 120
        while len(step_lines(run)) < 1:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        assert not (run / "trainer" / "checkpoints" / "latest.json").exists()  # not per step
        write_batches(run / "spool", 1, skip=1, seed=5, samples_per_batch=3000)  # a long step
        time.sleep(1.0)  # claimed and under way (hundreds of micro-batches)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        finish(proc, run)
        # Not a wall-clock assertion (a loaded CI host stretches any): the step under way was
        # left, not finished (it is hundreds of micro-batches: no step 2 below), and the exit
        # was the trainer's own, clean.
        print(f"stopped {time.monotonic() - t0:.1f} s after SIGTERM")
        text = log.read_text()
        assert "trainer_step_abandoned" in text, text[-3000:]
        assert [line["step"] for line in step_lines(run)] == [1]
        state = final_state(run)
        assert state["step"] == 1 and state["last_seq"] == 1  # step 1 kept, batch 2 not
        assert FileSpool(run / "spool").acked_seq() == 1
        finish(start(run, "--max-steps", "2"), run, timeout=300)
    assert [line["step"] for line in step_lines(run)] == [1, 2]
    assert final_state(run)["last_seq"] == 2
