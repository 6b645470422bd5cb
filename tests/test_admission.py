"""Admission by capacity (spade_async.loop.admission): the daemon keeps each endpoint at its
max_concurrency instead of at hand-set constants, without starving either role, and the
trainer's back-pressure still holds it."""

from __future__ import annotations

import json

import anyio

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
from spade_async.core.config.trainer import TrainerConfig
from spade_async.core.spool.files import FileSpool
from spade_async.corpus.sampler import CorpusSampler
from spade_async.inference.pool import EndpointPool
from spade_async.loop.admission import Admission
from spade_async.loop.daemon import Daemon
from spade_async.sandbox.runtime import Sandbox
from spade_async.testing.fake.server import FakeOpenAIServer
from spade_async.testing.memory import DictMemory
from spade_async.testing.scripted import Script

# ---- the rules, against a pool whose load the test sets -----------------------------------


class _Pool:
    def __init__(self, capacity: dict[str, int]) -> None:
        self.cap, self.load = capacity, dict.fromkeys(capacity, 0)

    def capacity(self, group: str) -> int:
        return self.cap[group]

    def busy(self, group: str) -> int:
        return self.load[group]


def test_rules_capacity_first_play_first_document_and_bounds():
    pool = _Pool({"default": 8})  # capacity 8, margin 2: room while demand < 10
    queued = [0]
    adm = Admission(pool, agent_group="default", designer_group="default", sandbox_slots=12,
                    plays_queued=lambda: queued[0])
    # Nothing in flight: the first document and the first play always go, whatever the load.
    pool.load["default"] = 50
    assert adm.can_design() and adm.can_play(10)
    pool.load["default"] = 0
    adm.documents += 1
    designs = adm.reserve("default", 4)
    # Admitted streams count before their first request reaches the pool...
    assert adm.demand("default") == 4 and adm.room("default") == 6 and adm.can_design()
    first = designs.take()
    first.started()
    pool.load["default"] = 1  # ...and then as the pool's (in flight or queued)
    assert adm.demand("default") == 4
    # Plays waiting for the shared endpoints go before another document.
    queued[0] = 1
    assert not adm.can_design()
    queued[0] = 0
    adm.plays += 1
    play = adm.reserve("default", 6, episodes=True)
    assert adm.room("default") == 0 and not adm.can_play(6) and not adm.can_design()
    # A stream between two requests (stepping its environment) is not demand: room comes
    # back to cover the gap.
    for s in [play.take() for _ in range(6)]:
        s.started()
    pool.load["default"] = 5  # 1 design + 4 of the 6 episodes sending, 2 between turns
    assert adm.demand("default") == 8 and adm.room("default") == 2 and adm.can_design()
    # ...but a play needs its episodes' sandbox slots too (6 alive + 7 > 12).
    assert not adm.can_play(7) and adm.can_play(6)
    # The pool's own count includes requests that are not ours (the evaluation's).
    pool.load["default"] = 11
    assert adm.room("default") < 0 and not adm.can_design()
    pool.load["default"] = 0
    play.close()
    designs.close()
    assert adm.streams["default"] == 0 and adm.episodes == 0 and adm.demand("default") == 0
    # The optional caps still bound.
    capped = Admission(pool, agent_group="default", designer_group="default", sandbox_slots=12,
                       max_documents=1, max_plays=1)
    capped.documents, capped.plays = 1, 1
    assert not capped.can_design() and not capped.can_play(1)


def test_rules_separate_groups_keep_the_designer_busy_up_to_a_full_queue():
    pool = _Pool({"designer": 2, "default": 4})
    queued = [3]
    adm = Admission(pool, agent_group="default", designer_group="designer", sandbox_slots=64,
                    queue_size=4, plays_queued=lambda: queued[0])
    adm.documents = 1
    pool.load["default"] = 6  # the agent's endpoints are full, plays wait: designs go on
    assert adm.can_design()
    queued[0] = 4  # until the queue of accepted environments is full
    assert not adm.can_design()
    queued[0] = 0
    pool.load["designer"] = 3  # and only while the designer's endpoints have room
    assert not adm.can_design()


# ---- the daemon against fake endpoints of different capacities ----------------------------


def _config(tmp_path, servers: list[tuple[FakeOpenAIServer, int]], **daemon) -> SpadeConfig:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"doc{i}", "text": f"Document {i}. " * 30})
                              + "\n" for i in range(40)))
    return SpadeConfig(
        paths=PathsConfig(data_dir=tmp_path / "data"),
        endpoints=[EndpointConfig(name=f"fake{i}", base_url=s.base_url, max_concurrency=c)
                   for i, (s, c) in enumerate(servers)],
        pool=PoolConfig(wait_for_endpoint_s=10),
        sandbox=SandboxConfig(slots=24, warm_workers=8),
        rollout=RolloutConfig(k_unhinted=3, k_hinted=2, max_tokens_per_turn=16),
        daemon=DaemonConfig(designs_per_document=2, examples_k=0, replay_probability=0.0,
                            status_interval_s=0.05, **daemon),
        trainer=TrainerConfig(max_staleness=daemon.get("max_staleness", 2)),
        corpus=CorpusConfig(source=JsonlSourceConfig(path=corpus, id_field="id"), min_chars=10),
    )


def _servers(chat, n: int, token_latency_s: float) -> list[FakeOpenAIServer]:
    script = Script(chat, per_document=True)  # one shared script: designs counted per document
    out = []
    for _ in range(n):
        s = FakeOpenAIServer()
        s.state.script = script
        s.state.decode, s.state.eos_token_id = chat.decode, chat.tok.eos_token_id
        s.state.token_latency_s, s.state.request_latency_s = token_latency_s, 0.02
        out.append(s.start())
    return out


async def _run_sampling(cfg, chat, tmp_path, tag: str, iterations: int):
    """Run the daemon for `iterations` documents; sample every endpoint's in-flight count
    (and the pool's queue) every 10 ms while both roles have work in flight."""
    memory = DictMemory()
    spool = FileSpool(tmp_path / f"spool-{tag}", writer=True)
    sampler = CorpusSampler.from_config(cfg.corpus, tmp_path / f"corpus-{tag}.json",
                                        autocommit=False)
    samples: dict[str, list[int]] = {e.name: [] for e in cfg.endpoints}
    peaks: dict[str, int] = dict.fromkeys(samples, 0)
    async with EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb:
        daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=memory, spool=spool, corpus=sampler,
                        chat=chat, run_dir=tmp_path / f"run-{tag}")

        async def watch() -> None:
            while True:
                now = {e["name"]: e["in_flight"] for e in pool.snapshot()}
                for name, n in now.items():
                    peaks[name] = max(peaks[name], n)
                # the steady state: past the first play, while documents are still admitted
                # (not the drain once the last one is in)
                started = daemon.iterations + daemon.admission.documents
                if daemon.counters["episodes"] and started < iterations:
                    for name, n in now.items():
                        samples[name].append(n)
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            with anyio.fail_after(240):
                await daemon.run(max_iterations=iterations)
            tg.cancel_scope.cancel()
        sat = {e.name: daemon.saturation_run(e.name) for e in cfg.endpoints}
    return daemon, memory, samples, peaks, sat


async def test_in_flight_per_endpoint_tracks_its_limit_and_both_roles_progress(
        fake, tmp_path):
    _, chat = fake
    servers = _servers(chat, 2, token_latency_s=0.01)
    try:
        caps = [6, 3]
        cfg = _config(tmp_path, list(zip(servers, caps, strict=True)))
        daemon, memory, samples, peaks, sat = await _run_sampling(cfg, chat, tmp_path, "cap", 30)
        # The old way, side by side: one document and one play at a time (the constants).
        tight = _config(tmp_path, list(zip(servers, caps, strict=True)),
                        documents_in_flight=1, envs_in_flight=1)
        _, _, tight_samples, _, _ = await _run_sampling(tight, chat, tmp_path, "tight", 8)
    finally:
        for s in servers:
            s.stop()
    assert daemon.iterations == 30
    # Both roles got through: every document designed, and its accepted env played.
    assert daemon.counters["designs"] >= 30 * 2 and len(memory.plays) == 30
    for (name, series), cap in zip(samples.items(), caps, strict=True):
        assert series, f"no steady-state samples of {name}"
        # never above its limit, at its limit most of the time
        assert peaks[name] == cap
        full = sum(n >= cap for n in series) / len(series)
        assert full >= 0.7, (name, full, series[:50])
        tight_full = sum(n >= cap for n in tight_samples[name]) / max(1, len(tight_samples[name]))
        assert full > tight_full + 0.2, (name, full, tight_full)
        assert sat[name] is not None and sat[name]["running"] is not None
    status = json.loads((tmp_path / "run-cap" / "status.json").read_text())
    assert status["admission"]["groups"]["default"]["capacity"] == 9
    assert status["admission"]["plays"] == 0 and status["admission"]["documents"] == 0


async def test_a_hungry_trainer_gets_replays_first_and_the_designer_still_progresses(
        fake, tmp_path):
    server, chat = fake
    server.state.script = Script(chat, per_document=True)
    server.state.token_latency_s = 0.002
    cfg = _config(tmp_path, [(server, 4)], max_batches_ahead=2, max_staleness=3,
                  documents_in_flight=2)
    spool = FileSpool(tmp_path / "spool", writer=True)
    trainer_side = FileSpool(tmp_path / "spool")
    sampler = CorpusSampler.from_config(cfg.corpus, tmp_path / "corpus.json", autocommit=False)
    memory = DictMemory()
    async with EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb:
        daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=memory, spool=spool, corpus=sampler,
                        chat=chat, run_dir=tmp_path / "run")

        async def trainer() -> None:  # takes every batch at once: the spool is always hungry
            while True:
                trainer_side.mark_taken(spool.last_seq())
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as tg:
            tg.start_soon(trainer)
            with anyio.fail_after(240):
                await daemon.run(max_iterations=8)
            tg.cancel_scope.cancel()
    # Played variants were replayed first while a document was in flight; the documents still
    # all went through.
    assert daemon.counters["replays_for_hungry_trainer"] > 0
    assert daemon.iterations == 8
    plays = [json.loads(x) for x in (tmp_path / "run" / "plays.jsonl").read_text().splitlines()]
    assert len(plays) == len(memory.plays)
    assert sum(1 for p in plays if not p["replayed"]) == 8  # each document's env was played
    assert not daemon.waiting_for_trainer


async def test_trainer_back_pressure_holds_capacity_admission(fake, tmp_path):
    """No cap on documents: the endpoints have room for many, the trainer for one batch."""
    server, chat = fake
    server.state.script = Script(chat, per_document=True)
    cfg = _config(tmp_path, [(server, 16)], max_batches_ahead=1)
    spool = FileSpool(tmp_path / "spool", writer=True)
    trainer_side = FileSpool(tmp_path / "spool")
    sampler = CorpusSampler.from_config(cfg.corpus, tmp_path / "corpus.json", autocommit=False)
    async with EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb:
        daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=DictMemory(), spool=spool,
                        corpus=sampler, chat=chat, run_dir=tmp_path / "run")
        async with anyio.create_task_group() as tg:
            # (a budget well past the hold: on a loaded host every document admitted before
            # the first batch lands, 40 once, runs first, and the hold comes after them)
            tg.start_soon(daemon.run, 1000)
            with anyio.fail_after(180):
                while not (daemon.waiting_for_trainer and daemon.admission.documents == 0):
                    await anyio.sleep(0.02)
            held = (spool.last_seq(), daemon.iterations, daemon.counters["designs"])
            await anyio.sleep(0.5)  # it really holds: nothing new started, designed or written
            assert (spool.last_seq(), daemon.iterations, daemon.counters["designs"]) == held
            assert pool.busy("default") == 0
            status = json.loads((tmp_path / "run" / "status.json").read_text())
            assert status["waiting_for_trainer"] is True
            trainer_side.mark_taken(spool.last_seq())
            with anyio.fail_after(60):
                while daemon.counters["designs"] == held[2]:
                    await anyio.sleep(0.02)
            daemon.stop("test")
    # more than one document was in flight at once before the hold (capacity, not a constant)
    assert held[1] > 1
    run = daemon.saturation_run("fake0")
    # the hold was accounted as its own phase: at least half the 0.5 s it surely lasted (the
    # share of the run it is depends on how long the run before it took)
    assert run is not None and run["trainer_wait_share"] * run["seconds"] > 0.25, run
