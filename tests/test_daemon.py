"""The daemon end to end against a scripted fake endpoint, with the real sandbox, the real spool
and a corpus on disk: a known environment is proposed, validated, stored, played hinted and
unhinted; regret, advantages and the batch contents equal values computed by hand."""

from __future__ import annotations

import json

import anyio
import pytest

from spade_async.core.config import (
    DaemonConfig,
    EndpointConfig,
    PathsConfig,
    PoolConfig,
    RolloutConfig,
    SandboxConfig,
    SpadeConfig,
)
from spade_async.core.config.corpus import CorpusConfig, JsonlSourceConfig
from spade_async.core.spool.files import FileSpool
from spade_async.corpus.sampler import CorpusSampler
from spade_async.inference.pool import EndpointPool
from spade_async.loop.daemon import Daemon
from spade_async.sandbox.runtime import Sandbox
from spade_async.testing.daemon import run_daemon
from spade_async.testing.memory import DictMemory
from spade_async.testing.scripted import ENV_CODE, Script


def _config(tmp_path, server) -> SpadeConfig:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"id": "doc1", "text": "Countdown games train attention. " * 20})
                      + "\n")
    return SpadeConfig(
        paths=PathsConfig(data_dir=tmp_path / "data"),
        endpoints=[EndpointConfig(name="fake", base_url=server.base_url)],
        pool=PoolConfig(wait_for_endpoint_s=5),
        sandbox=SandboxConfig(slots=4, warm_workers=2),
        rollout=RolloutConfig(k_unhinted=3, k_hinted=2, max_tokens_per_turn=16),
        daemon=DaemonConfig(designs_per_document=2, examples_k=0, replay_probability=0.0),
        corpus=CorpusConfig(source=JsonlSourceConfig(path=corpus, id_field="id"), min_chars=10),
    )


async def test_one_iteration_regret_advantages_and_batch_by_hand(fake, tmp_path):
    server, chat = fake
    cfg = _config(tmp_path, server)
    memory = DictMemory()
    daemon, spool = await run_daemon(cfg, chat, memory, tmp_path, iterations=1)
    # Stored: one accepted env (the known code), one rejected design with its reason.
    statuses = sorted(e["status"] for e in memory.envs.values())
    assert statuses == ["accepted", "rejected"]
    (accepted,) = [e for e in memory.envs.values() if e["status"] == "accepted"]
    assert accepted["code"].strip() == ENV_CODE.strip() and accepted["doc_id"] == "doc1"
    (rejected,) = [e for e in memory.envs.values() if e["status"] == "rejected"]
    # The scripted prose reply sits inside the prefilled ```python block: code that fails to
    # parse, not "no code".
    assert rejected["reason"].startswith("static.parse")
    # Played: 3 unhinted (all wrong: 0) and 2 hinted (all right: 1) -> regret 1.
    ((env_id, unhinted, hinted),) = memory.plays
    (play,) = [json.loads(x) for x in (tmp_path / "run" / "plays.jsonl").read_text().splitlines()]
    assert (unhinted, hinted, play["replayed"]) == ([0.0, 0.0, 0.0], [1.0, 1.0], False)
    assert (play["r_unhinted"], play["r_hinted"], play["regret"], play["feasible"]) == \
        (0, 1, 1, True)
    # Batch: agent groups have zero variance (dropped, counted); designer rewards [1, -1]
    # normalise to [+1, -1] (std 1).
    assert daemon.counters["agent_groups_zero_variance"] == 1
    batch = spool.claim_next(0)
    assert batch is not None and batch.seq == 1
    samples = batch.samples()
    assert [s.role for s in samples] == ["designer", "designer"]
    by_reward = sorted(samples, key=lambda s: s.reward)
    assert [s.reward for s in by_reward] == [-1.0, 1.0]
    assert [s.advantage for s in by_reward] == pytest.approx([-1.0, 1.0], abs=1e-5)
    good = by_reward[1]
    assert good.env_id == env_id
    # The designer sample is token-exact: prompt + the prefill that opens the code block
    # (mask 0), then the scripted reply + eos (mask 1).
    completion = [t for t, m in zip(good.token_ids, good.loss_mask, strict=True) if m]
    assert completion == chat.encode(f"{ENV_CODE}```") + [chat.tok.eos_token_id]
    prompt_part = good.token_ids[: len(good.token_ids) - len(completion)]
    assert list(prompt_part[-len(chat.encode("```python\n")):]) == chat.encode("```python\n")
    assert list(good.token_ids[: len(good.token_ids) - len(completion)]) == (
        server.state.completions[0]["prompt"] if "Designer" in chat.tok.decode(
            server.state.completions[0]["prompt"]) else server.state.completions[1]["prompt"])
    # Every episode was saved; the corpus cursor moved past the document; status was written.
    episodes = [json.loads(x) for x in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 5 and sorted(e["score"] for e in episodes) == [0, 0, 0, 1, 1]
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["iterations"] == 1 and status["counters"]["batches"] == 1
    assert status["stopped"] and status["regret"]["n"] == 1 and status["regret"]["p50"] == 1.0
    # The report's sources: one line per design and per played environment, timestamped.
    designs = [json.loads(x) for x in (tmp_path / "run" / "designs.jsonl").read_text().splitlines()]
    assert sorted(d["status"] for d in designs) == ["accepted", "invalid"]
    assert {d["reason"] for d in designs} == {"", "static.parse"}
    (play,) = [json.loads(x) for x in (tmp_path / "run" / "plays.jsonl").read_text().splitlines()]
    assert play["env_id"] == env_id and play["regret"] == 1.0 and not play["replayed"]
    assert all("time" in e for e in episodes + designs + [play])
    assert json.loads((tmp_path / "corpus.json").read_text())["consumed"] == 1
    # Prometheus metrics agree.
    reg = daemon.metrics.registry
    assert reg.get_sample_value("spade_designs_total", {"status": "accepted"}) == 1
    assert reg.get_sample_value("spade_designs_total", {"status": "invalid"}) == 1
    assert reg.get_sample_value("spade_rejections_total", {"reason": "static.parse"}) == 1
    assert reg.get_sample_value("spade_episodes_total", {"hinted": "true", "outcome": "ok"}) == 2
    assert reg.get_sample_value("spade_samples_total", {"role": "designer"}) == 2
    assert reg.get_sample_value("spade_env_regret_sum") == 1.0


async def test_endpoint_dying_mid_run_backs_off_and_continues(fake, tmp_path):
    server, chat = fake
    cfg = _config(tmp_path, server)
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"doc{i}", "text": f"Document {i}. " * 30}) + "\n"
                              for i in range(3)))
    cfg = cfg.model_copy(update={
        "pool": PoolConfig(wait_for_endpoint_s=30, backoff_initial_s=0.05, backoff_max_s=0.2,
                           health_interval_s=0.2, down_after_failures=1),
    })
    server.state.token_latency_s = 0.01
    memory = DictMemory()
    spool = FileSpool(tmp_path / "spool", writer=True)
    sampler = CorpusSampler.from_config(cfg.corpus, tmp_path / "corpus.json", autocommit=False)
    async with EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb:
        daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=memory, spool=spool, corpus=sampler,
                        chat=chat, run_dir=tmp_path / "run")
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)

            async def outage() -> None:
                # at the first agent turn: each episode still has turns to play, so the run
                # needs the endpoint after the outage (waiting for whole episodes raced the
                # run's end; an outage among the designs would cut the scripted designer's
                # one good reply)
                while not any("agent in an interactive" in chat.decode(c["prompt"][:200])
                              for c in list(server.state.completions)):
                    await anyio.sleep(0.01)
                await anyio.to_thread.run_sync(server.stop)
                served_before.append(len(server.state.completions))
                await anyio.sleep(1.5)
                assert not pool.is_up("fake")
                await anyio.to_thread.run_sync(server.start)

            served_before: list[int] = []

            tg.start_soon(outage)
            await daemon.run(max_iterations=2)
            tg.cancel_scope.cancel()
    assert daemon.iterations == 2
    assert pool.is_up("fake")
    assert len(server.state.completions) > served_before[0]  # the run went on after the outage
    # Waited out: no episode failed for good, no play was given up, nothing was dropped.
    assert daemon.counters["episode_errors"] == 0
    assert not daemon.failures.given_up
    assert spool.last_seq() >= 1


def _docs(tmp_path, cfg, n: int):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"doc{i}", "text": f"Document {i}. " * 30}) + "\n"
                              for i in range(n)))
    return cfg


async def test_trainer_back_pressure_holds_new_documents_until_batches_are_taken(fake, tmp_path):
    server, chat = fake
    server.state.script = Script(chat, per_document=True)  # every document makes a batch
    cfg = _docs(tmp_path, _config(tmp_path, server), 3)
    cfg = cfg.model_copy(update={"daemon": cfg.daemon.model_copy(update={
        "max_batches_ahead": 1, "documents_in_flight": 1, "status_interval_s": 0.05})})
    spool = FileSpool(tmp_path / "spool", writer=True)
    trainer_side = FileSpool(tmp_path / "spool")
    sampler = CorpusSampler.from_config(cfg.corpus, tmp_path / "corpus.json", autocommit=False)

    async def until(cond, what: str) -> None:
        with anyio.fail_after(60):
            while not cond():
                await anyio.sleep(0.02)

    async with EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb:
        daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=DictMemory(), spool=spool,
                        corpus=sampler, chat=chat, run_dir=tmp_path / "run")
        async with anyio.create_task_group() as tg:
            tg.start_soon(daemon.run, 3)
            for seq in (1, 2):
                await until(lambda: daemon.waiting_for_trainer, "waiting")
                await anyio.sleep(0.5)  # it really holds: nothing new is started or written
                assert spool.last_seq() == seq and daemon.iterations == seq
                status = json.loads((tmp_path / "run" / "status.json").read_text())
                assert status["waiting_for_trainer"] is True
                trainer_side.mark_taken(seq)  # what the trainer does after each batch
                await until(lambda: spool.last_seq() > seq, "next batch")  # noqa: B023
    assert daemon.iterations == 3 and spool.last_seq() == 3
    assert daemon.counters["trainer_waits"] == 2 and trainer_side.taken_seq() == 2
    # Saturation over the run is split by phase: the held seconds (>= 2 x 0.5 s here, with
    # nothing in flight) count as waiting for the trainer, not against the endpoint.
    run = daemon.saturation_run("fake")
    assert run is not None and run["seconds"] > 1.0
    assert run["trainer_wait_share"] > 0.1 and run["trainer_wait"] < 0.2
    assert run["running"] is not None and run["running"] > run["trainer_wait"]
    reg = daemon.metrics.registry
    assert reg.get_sample_value("spade_endpoint_saturation",
                                {"endpoint": "fake", "phase": "trainer_wait"}) is not None


async def test_document_whose_designs_all_failed_is_designed_again_not_used_up(fake, tmp_path):
    server, chat = fake
    cfg = _config(tmp_path, server)
    cfg = cfg.model_copy(update={"pool": PoolConfig(
        max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.02, wait_for_endpoint_s=5,
        down_after_failures=100)})
    server.state.fail_next = 4  # both designs, both attempts each: the first try fails whole
    spool = FileSpool(tmp_path / "spool", writer=True)
    sampler = CorpusSampler.from_config(cfg.corpus, tmp_path / "corpus.json", autocommit=False)
    async with EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb:
        daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=DictMemory(), spool=spool,
                        corpus=sampler, chat=chat, run_dir=tmp_path / "run")
        with anyio.fail_after(60):
            await daemon.run(max_iterations=1)
    assert daemon.failures.counts == {"design.http_5xx": 2}
    assert daemon.counters["documents_retried"] == 1
    assert daemon.counters["designs"] == 2 and daemon.counters["designs_accepted"] == 1
    assert spool.last_seq() == 1  # the same document, designed again, made its batch
    assert json.loads((tmp_path / "corpus.json").read_text())["consumed"] == 1


async def test_episode_retried_after_a_restart_samples_with_the_newest_version(fake, tmp_path):
    """A restarted server holds only the newest adapter the trainer put back: an episode
    that failed on an older one is tried again with the newest policy, not waited on forever
    (it would never come back)."""
    server, chat = fake
    cfg = _config(tmp_path, server)
    cfg = cfg.model_copy(update={"pool": PoolConfig(
        wait_for_endpoint_s=5, backoff_initial_s=0.01, backoff_max_s=0.02,
        health_interval_s=0.2)})
    weights = tmp_path / "data" / "weights"
    weights.mkdir(parents=True)
    server.state.adapters["policy-v1"] = "/tmp/v1"
    (weights / "current.json").write_text(json.dumps({"version": 1, "model": "policy-v1"}))
    server.state.token_latency_s = 0.005
    memory = DictMemory()
    spool = FileSpool(tmp_path / "spool", writer=True)
    sampler = CorpusSampler.from_config(cfg.corpus, tmp_path / "corpus.json", autocommit=False)

    async def restart_after_the_first_agent_turn() -> None:
        while not any(m == "policy-v1" and "agent in an interactive" in chat.decode(
                c["prompt"][:200]) for m, c in zip(server.state.models_seen,
                                                   server.state.completions, strict=False)):
            await anyio.sleep(0.01)
        server.state.adapters.clear()  # the restart: v1 is gone, the trainer loads v2
        server.state.adapters["policy-v2"] = "/tmp/v2"
        (weights / "current.json").write_text(json.dumps({"version": 2, "model": "policy-v2"}))

    async with EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb:
        daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=memory, spool=spool, corpus=sampler,
                        chat=chat, run_dir=tmp_path / "run")
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                await tg.start(pool.run)
                tg.start_soon(restart_after_the_first_agent_turn)
                await daemon.run(max_iterations=1)
                tg.cancel_scope.cancel()
    episodes = [json.loads(x) for x in (tmp_path / "run" / "episodes.jsonl").read_text()
                .splitlines()]
    assert all(e["error"] is None for e in episodes), episodes
    assert max(e["policy_version"] for e in episodes) == 2
    assert any(k.endswith("model_not_served") for k in daemon.failures.counts), \
        daemon.failures.counts
    assert not daemon.failures.given_up and len(memory.plays) == 1


async def test_failed_episodes_stay_out_of_regret_and_memory_and_are_counted(fake, tmp_path):
    """Requests failing on the endpoint (503, no retries left) fail their episodes: those are
    counted (status, failures ledger) and never enter R_u / R_h or the memory's statistics, so
    an outage does not read as a hard environment."""
    server, chat = fake
    cfg = _docs(tmp_path, _config(tmp_path, server), 3)
    cfg = cfg.model_copy(update={
        "pool": PoolConfig(wait_for_endpoint_s=5, max_attempts=1),
        "rollout": RolloutConfig(k_unhinted=4, k_hinted=3, max_tokens_per_turn=16,
                                 episode_attempts=1),
    })
    memory = DictMemory()
    spool = FileSpool(tmp_path / "spool", writer=True)
    sampler = CorpusSampler.from_config(cfg.corpus, tmp_path / "corpus.json", autocommit=False)
    async with EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb:
        daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=memory, spool=spool, corpus=sampler,
                        chat=chat, run_dir=tmp_path / "run")
        async with anyio.create_task_group() as tg:
            async def inject() -> None:  # one failure at a time while episodes run, 4 in all
                for _ in range(4):
                    while not daemon.in_flight["episodes"] or server.state.fail_next:
                        await anyio.sleep(0.01)
                    server.state.fail_next = 1
                    await anyio.sleep(0.2)

            tg.start_soon(inject)
            await daemon.run(max_iterations=3)
            tg.cancel_scope.cancel()
    episodes = [json.loads(x) for x in (tmp_path / "run" / "episodes.jsonl").read_text()
                .splitlines()]
    failed = [e for e in episodes if e["error"]]
    assert failed and daemon.counters["episode_errors"] == len(failed)
    assert all(e["error_kind"] == "http_5xx" for e in failed)
    assert memory.plays, "every play failed: the injection is too strong for this test"
    plays = [json.loads(x) for x in (tmp_path / "run" / "plays.jsonl").read_text().splitlines()]
    assert sorted(map(str, memory.plays)) == sorted(
        str((p["env_id"], p["unhinted"], p["hinted"])) for p in plays)
    for regret in plays:
        env_id, unhinted, hinted = regret["env_id"], regret["unhinted"], regret["hinted"]
        ok = [e for e in episodes if e["env_id"] == env_id and not e["error"]]
        # only finished episodes are scores, and the regret is computed from them alone
        assert len(unhinted) == sum(not e["hinted"] for e in ok) < 4 + 1
        assert len(hinted) == sum(e["hinted"] for e in ok)
        assert regret["r_unhinted"] == pytest.approx(sum(unhinted) / len(unhinted))
        assert regret["r_hinted"] == pytest.approx(sum(hinted) / len(hinted))
    assert sum(len(u) + len(h) for _, u, h in memory.plays) < len(episodes)
    assert memory.sandbox_failures == [0] * len(memory.plays)  # the endpoint's fault, not theirs
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["counters"]["episode_errors"] == len(failed)
    assert status["failures"]["by_kind"]["episode.http_5xx"] == len(failed)
    # the sample ledger: every episode written or dropped, the failed ones as failed
    agent = status["ledger"]["agent"]
    assert agent["played"] == len(episodes) and agent["dropped"]["failed"] == len(failed)
    assert agent["played"] == agent["written"] + sum(agent["dropped"].values())


def test_the_status_regret_distribution_is_the_sorted_windows_order_statistics():
    """regret_distribution (vectorised, any order) gives what the definition on the sorted
    window gives: the value at index int(p * n), the max, the mean, a 5-bin histogram over
    [0, 1] with negatives in the first bin."""
    import random

    from spade_async.loop.telemetry import regret_distribution

    rng = random.Random(7)
    for n in (1, 2, 5, 11, 1000):
        window = [round(rng.uniform(-0.4, 1.0), 3) for _ in range(n)]
        s = sorted(window)
        got = regret_distribution(window)
        assert got["n"] == n and got["max"] == s[-1]
        assert [got["p10"], got["p50"], got["p90"]] == [s[min(n - 1, int(p * n))]
                                                        for p in (0.1, 0.5, 0.9)]
        assert got["mean"] == round(sum(s) / n, 4)
        assert got["histogram"] == [sum(1 for r in s if min(4, max(0, int(r * 5))) == b)
                                    for b in range(5)]
    assert regret_distribution([])["n"] == 0
