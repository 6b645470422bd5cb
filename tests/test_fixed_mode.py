"""The fixed-environment baseline (`daemon.mode = "fixed"`): no designer, no corpus; the agent
plays the memory's environments through the same episode, regret and batch code, and the real
trainer (SmolLM2, LoRA, CPU) consumes those batches and publishes a version. Against the scripted
fake endpoint, whose agent solves unhinted episodes only for even starting numbers, so agent
groups have variance and carry advantages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio

from spade_async.core.config import load_config
from spade_async.core.spool.files import FileSpool
from spade_async.corpus.sampler import CorpusSampler
from spade_async.inference.pool import EndpointPool
from spade_async.loop.daemon import Daemon
from spade_async.reward.regret import DesignStatus
from spade_async.sandbox.runtime import Sandbox
from spade_async.testing.memory import DictMemory
from spade_async.testing.scripted import ENV_CODE, Script
from spade_async.testing.stack import one_endpoint_toml

REPO = Path(__file__).resolve().parents[1]


def test_fixed_mode_batches_are_agent_only_and_the_trainer_consumes_them(fake, checkpoint,
                                                                          tmp_path):
    server, chat = fake
    server.state.script = Script(chat, unhinted_solves_even=True)
    (tmp_path / "data" / "models").mkdir(parents=True)
    (tmp_path / "data" / "models" / "smollm2").symlink_to(checkpoint)
    cfg_file = tmp_path / "spade.toml"
    cfg_file.write_text(f"""
[paths]
data_dir = "{tmp_path / 'data'}"
[model]
checkpoint_name = "smollm2"
[[endpoints]]
name = "fake"
base_url = "{server.base_url}"
[pool]
wait_for_endpoint_s = 5
[sandbox]
slots = 8
warm_workers = 2
[rollout]
k_unhinted = 4
k_hinted = 2
max_tokens_per_turn = 16
[daemon]
mode = "fixed"
[trainer]
lr = 1e-4
samples_per_step = 4           # one play's unhinted episodes: a step per batch
micro_batch_tokens = 2048
publish_every_steps = 1
checkpoint_every_steps = 1
""")
    cfg = load_config(cfg_file, environ={})
    memory = DictMemory()

    async def main() -> Daemon:
        async with EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb:
            status, env_id, _ = await memory.add_design(
                ENV_CODE, _accepted_report(), doc_id="seed", chunk_id="seed", excerpt="",
                policy_version=0)
            assert status is DesignStatus.ACCEPTED and env_id
            spool = FileSpool(cfg.paths.data_dir / "spool", writer=True)
            # The corpus is never read in fixed mode: a sampler over nothing proves it.
            corpus = CorpusSampler.__new__(CorpusSampler)
            daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=memory, spool=spool,
                            corpus=corpus, chat=chat, run_dir=cfg.paths.data_dir / "run")
            await daemon.run(max_iterations=3)
            spool.close()
            return daemon

    daemon = anyio.run(main)
    assert daemon.counters["fixed_plays"] == 3 and daemon.iterations == 3
    assert not daemon.counters["designs"]
    assert not [p for p in server.state.completions
                if "Environment Designer" in chat.tok.decode(p["prompt"])]
    spool = FileSpool(cfg.paths.data_dir / "spool")
    batches = []
    while (b := spool.claim_next(batches[-1].seq if batches else 0)) is not None:
        batches.append(b)
    samples = [s for b in batches for s in b.samples()]
    assert batches and samples and {s.role for s in samples} == {"agent"}
    assert any(s.advantage > 0 for s in samples) and any(s.advantage < 0 for s in samples)
    assert len(memory.plays) == 3  # the memory's stats see the baseline's plays too

    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="2")
    res = subprocess.run([sys.executable, "-m", "trainer", "--config", str(cfg_file),
                          "--exit-when-idle", "3"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    steps = [json.loads(x) for x in (cfg.paths.data_dir / "trainer" / "metrics.jsonl")
             .read_text().splitlines() if '"step"' in x]
    steps = [s for s in steps if s["event"] == "step"]
    assert [s["seqs"] for s in steps] == [[b.seq, b.seq] for b in batches]
    assert all(s["samples"] > 0 for s in steps)
    current = json.loads((cfg.paths.data_dir / "weights" / "current.json").read_text())
    assert current["version"] == len(steps) and f"policy-v{len(steps)}" in server.state.adapters


def _accepted_report():
    """What DictMemory needs of a validation report to store an accepted environment."""

    class Report:
        accepted = True
        reason = ""

    return Report()


def test_daemon_evaluates_published_versions_in_the_background(fake, checkpoint, tmp_path):
    """eval.every_versions = 1: the base model (version 0) and each new version are scored on
    the held-out suite while the loop keeps playing; results land per version."""
    from spade_async.evals.base import load_results

    server, chat = fake
    server.state.script = Script(chat, unhinted_solves_even=True)
    cfg_file = tmp_path / "spade.toml"
    cfg_file.write_text(one_endpoint_toml(tmp_path / "data", checkpoint, "fake", server.base_url)
                       + """
[sandbox]
slots = 8
warm_workers = 2
[rollout]
k_unhinted = 2
k_hinted = 1
max_tokens_per_turn = 16
[daemon]
mode = "fixed"
status_interval_s = 0.2
[eval]
every_versions = 1
suites = ["reasoning-gym"]
reasoning_gym_per_generator = 1
max_tokens = 32
""")
    cfg = load_config(cfg_file, environ={})
    memory = DictMemory()
    data = cfg.paths.data_dir

    async def main() -> Daemon:
        async with EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb:
            await memory.add_design(ENV_CODE, _accepted_report(), doc_id="seed",
                                    chunk_id="seed", excerpt="", policy_version=0)
            spool = FileSpool(data / "spool", writer=True)
            daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=memory, spool=spool,
                            corpus=CorpusSampler.__new__(CorpusSampler), chat=chat,
                            run_dir=data / "run")
            async with anyio.create_task_group() as tg:
                tg.start_soon(daemon.run)
                with anyio.fail_after(120):
                    while len(load_results(data)) < 1:
                        await anyio.sleep(0.1)
                    # A new version is published (a full-weight backend keeps the base name).
                    (data / "weights").mkdir(parents=True, exist_ok=True)
                    (data / "weights" / "current.json").write_text(
                        json.dumps({"version": 1, "model": "policy"}))
                    while len(load_results(data)) < 2:
                        await anyio.sleep(0.1)
                daemon.stop()
            spool.close()
            return daemon

    daemon = anyio.run(main)
    rows = load_results(data)
    assert [(r["suite"], r["version"], r["n"]) for r in rows] == [
        ("reasoning-gym", 0, 6), ("reasoning-gym", 1, 6)]
    assert daemon.counters["evals"] == 2 and not daemon.counters["eval_failures"]
    assert daemon.counters["fixed_plays"] >= 1  # the loop kept playing meanwhile
    assert (data / "eval" / "v1" / "reasoning-gym.jsonl").is_file()


def test_fixed_rungs_play_each_environment_at_its_defaults_and_its_easiest_point(
        fake, checkpoint, tmp_path):
    """daemon.fixed_rungs = ["default", "easiest"]: a seed with knobs is played at both points
    (the easiest resolved from its own knob declarations), one without knobs once."""
    from spade_async.envs.knobs import declared_params, easiest_point

    server, chat = fake
    server.state.script = Script(chat, unhinted_solves_even=True)
    cfg_file = tmp_path / "spade.toml"
    cfg_file.write_text(one_endpoint_toml(tmp_path / "data", checkpoint, "fake", server.base_url)
                        + """
[sandbox]
slots = 8
warm_workers = 2
[rollout]
k_unhinted = 2
k_hinted = 1
max_tokens_per_turn = 16
[daemon]
mode = "fixed"
fixed_rungs = ["default", "easiest"]
""")
    cfg = load_config(cfg_file, environ={})
    memory = DictMemory()
    arithmetic = (REPO / "spade_async" / "envs" / "seeds" / "arithmetic.py").read_text()

    async def main() -> None:
        async with EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb:
            for code in (arithmetic, ENV_CODE):
                await memory.add_design(code, _accepted_report(), doc_id="seed",
                                        chunk_id="seed", excerpt="", policy_version=0)
            spool = FileSpool(cfg.paths.data_dir / "spool", writer=True)
            daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=memory, spool=spool,
                            corpus=CorpusSampler.__new__(CorpusSampler), chat=chat,
                            run_dir=cfg.paths.data_dir / "run")
            await daemon.run(max_iterations=3)  # one pass over the three variants
            spool.close()

    anyio.run(main)
    plays = [json.loads(x) for x in (cfg.paths.data_dir / "run" / "plays.jsonl").read_text()
             .splitlines()]
    easiest = easiest_point(declared_params(arithmetic))
    by_name = sorted((p["name"], json.dumps(p["params"], sort_keys=True)) for p in plays)
    defaults = next(p["params"] for p in plays if p["name"] == "arithmetic"
                    and p["params"] != easiest)
    assert by_name == sorted([("arithmetic", json.dumps(easiest, sort_keys=True)),
                              ("arithmetic", json.dumps(defaults, sort_keys=True)),
                              ("countdown", "{}")])
