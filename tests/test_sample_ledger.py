"""Every sample the daemon plays is accounted for (DESIGN §8): a run against the scripted fake
endpoint, where a new policy version lands while the document's episodes play, so the
designer's samples are stale by the time their batch is written. Each finished episode and
each answered design is written or dropped with its reason, in status.json and Prometheus;
the tokens of every request are counted per role."""

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
from spade_async.loop.ledger import SampleLedger
from spade_async.loop.metrics import Metrics
from spade_async.sandbox.runtime import Sandbox
from spade_async.testing.memory import DictMemory


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
        daemon=DaemonConfig(designs_per_document=2, examples_k=0, replay_probability=0.0,
                            max_staleness=2, status_interval_s=0.05),
        corpus=CorpusConfig(source=JsonlSourceConfig(path=corpus, id_field="id"), min_chars=10),
    )


async def test_every_played_sample_is_written_or_dropped_with_a_reason(fake, tmp_path):
    server, chat = fake
    cfg = _config(tmp_path, server)
    weights = tmp_path / "data" / "weights"
    weights.mkdir(parents=True)
    server.state.adapters["policy-v5"] = "/tmp/v5"
    spool = FileSpool(tmp_path / "spool", writer=True)
    sampler = CorpusSampler.from_config(cfg.corpus, tmp_path / "corpus.json", autocommit=False)

    async def publish_at_the_first_agent_turn() -> None:
        # the designs were sampled on v0; v5 is more than max_staleness (2) newer
        while not any("agent in an interactive" in chat.decode(c["prompt"][:200])
                      for c in list(server.state.completions)):
            await anyio.sleep(0.01)
        (weights / "current.json").write_text(json.dumps({"version": 5, "model": "policy-v5"}))

    async with EndpointPool(cfg.endpoints, cfg.pool) as pool, Sandbox(cfg.sandbox) as sb:
        daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=DictMemory(), spool=spool,
                        corpus=sampler, chat=chat, run_dir=tmp_path / "run")
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(publish_at_the_first_agent_turn)
                await daemon.run(max_iterations=1)
                tg.cancel_scope.cancel()

    ledger = json.loads((tmp_path / "run" / "status.json").read_text())["ledger"]
    episodes = (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()
    designs = (tmp_path / "run" / "designs.jsonl").read_text().splitlines()
    # played = written + dropped, nothing left in flight once the run is over
    for role, n_played in (("agent", len(episodes)), ("designer", len(designs))):
        row = ledger[role]
        assert row["played"] == n_played > 0
        assert row["played"] == row["written"] + sum(row["dropped"].values())
        assert row["in_flight"] == 0
    # 3 unhinted episodes all scored 0 (no variance), 2 hinted ones (never trained by
    # default); the two designs (rewards 1 and -1) were on v0 when v5 was out: stale
    assert ledger["agent"]["dropped"] == {"hinted": 2, "zero_variance": 3}
    assert ledger["designer"] == {"played": 2, "written": 0, "dropped": {"stale": 2},
                                  "in_flight": 0}
    assert spool.last_seq() == 0 and daemon.counters["samples_stale_dropped"] == 2
    reg = daemon.metrics.registry
    assert reg.get_sample_value("spade_samples_dropped_total",
                                {"role": "designer", "reason": "stale"}) == 2
    assert reg.get_sample_value("spade_samples_dropped_total",
                                {"role": "agent", "reason": "hinted"}) == 2
    assert reg.get_sample_value("spade_samples_played_total", {"role": "agent"}) == 5

    # Tokens: every request the endpoint answered, per role, prompt and sampled.
    tokens = json.loads((tmp_path / "run" / "status.json").read_text())["tokens"]
    served = server.state.completions
    assert tokens["roles"]["designer"]["requests"] == 2
    assert (tokens["roles"]["agent"]["requests"] + tokens["roles"]["designer"]["requests"]
            == len(served))
    assert tokens["prompt"] == sum(len(c["prompt"]) for c in served)
    assert tokens["roles"]["agent"]["sampled"] == daemon.counters["tokens_sampled"] > 0
    assert tokens["sampled"] == tokens["roles"]["agent"]["sampled"] + \
        tokens["roles"]["designer"]["sampled"]
    assert tokens["sampled_per_s"] > 0


def test_a_drop_needs_a_known_reason():
    ledger = SampleLedger(Metrics())
    ledger.play("agent", 3)
    ledger.drop("agent", "zero_variance", 2)
    ledger.write("agent", 1)
    assert ledger.as_dict()["agent"] == {"played": 3, "written": 1,
                                         "dropped": {"zero_variance": 2}, "in_flight": 0}
    with pytest.raises(ValueError, match="no drop reason 'bored' for agent"):
        ledger.drop("agent", "bored")


def test_token_rates_over_the_last_minute_and_the_run():
    from types import SimpleNamespace

    from spade_async.loop.usage import TokenUsage

    usage = TokenUsage(Metrics())
    t0 = usage.started

    def completion(sampled: int, prompt: int) -> SimpleNamespace:
        return SimpleNamespace(completion_tokens=sampled, prompt_token_ids=(1,) * prompt,
                               usage={})

    usage.tick(t0)
    usage.add("agent", completion(300, 1000))
    usage.tick(t0 + 30)
    d = usage.as_dict(t0 + 30)
    assert d["window"] == {"seconds": 30.0, "sampled_per_s": 10.0, "prompt_per_s": 33.33}
    assert d["sampled_per_s"] == 10.0 and d["roles"]["agent"]["requests"] == 1
    # a chat-path completion: no prompt ids, the server's usage says how many
    usage.add("designer", SimpleNamespace(completion_tokens=600, prompt_token_ids=(),
                                          usage={"prompt_tokens": 50}))
    usage.tick(t0 + 90)  # the reading at t0 is over a minute old now: out of the window
    d = usage.as_dict(t0 + 90)
    assert d["window"]["seconds"] == 60.0 and d["window"]["sampled_per_s"] == 10.0
    assert d["roles"]["designer"] == {"requests": 1, "sampled": 600, "prompt": 50}
    assert d["sampled_per_s"] == 10.0 and d["prompt"] == 1050
