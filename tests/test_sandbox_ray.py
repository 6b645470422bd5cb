"""Sandbox nodes placed by Ray (`sandbox.placement = "ray"`) on a real two-node Ray cluster on
this machine (`ray.cluster_utils.Cluster`: the head and one more raylet, each offering the
`spade_sandbox` resource): the same sessions, errors and validation as the local sandbox, with
the same isolation chosen on each node; then the real daemon over that cluster while one node
is killed mid-run. The killed node's episodes fail as `sandbox_node_lost`, are played again on
the other node and never scored, and the run goes on to its end."""

from __future__ import annotations

import json
import os
import signal
import time

import anyio
import pytest
from structlog.testing import capture_logs

ray = pytest.importorskip("ray", reason="the Ray extra: pip install 'spade-async[ray]'")

from ray.cluster_utils import Cluster  # noqa: E402

from spade_async.core.config import (  # noqa: E402
    DaemonConfig,
    EndpointConfig,
    PathsConfig,
    PoolConfig,
    RolloutConfig,
    SandboxConfig,
    SpadeConfig,
)
from spade_async.core.spool.files import FileSpool  # noqa: E402
from spade_async.corpus.sampler import CorpusSampler  # noqa: E402
from spade_async.envs.validate import validate  # noqa: E402
from spade_async.inference.pool import EndpointPool  # noqa: E402
from spade_async.loop.daemon import Daemon  # noqa: E402
from spade_async.loop.failures import failure_kind  # noqa: E402
from spade_async.reward.regret import DesignStatus  # noqa: E402
from spade_async.sandbox.errors import EnvException, SandboxError, SandboxNodeLost  # noqa: E402
from spade_async.sandbox.isolation import choose_isolation  # noqa: E402
from spade_async.sandbox.placement import make_sandbox  # noqa: E402
from spade_async.sandbox.runtime import Sandbox  # noqa: E402
from spade_async.testing.memory import DictMemory  # noqa: E402
from spade_async.testing.scripted import ENV_CODE, Script  # noqa: E402

NODE = {"num_cpus": 1, "resources": {"spade_sandbox": 1}, "object_store_memory": 80 << 20}
# A killed raylet is declared dead after ~1 s instead of Ray's default ~30 s.
HEALTH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
          "health_check_failure_threshold": 2}

FAULTY = ENV_CODE.replace(
    "        self.turn += 1\n",
    "        self.turn += 1\n"
    "        if action == 'boom':\n"
    "            raise ValueError('boom')\n"
    "        while action == 'spin':\n"
    "            pass\n")


@pytest.fixture(scope="module")
def cluster():
    """The head node and a second node, both sandbox nodes; (cluster, second node)."""
    c = Cluster(initialize_head=True,
                head_node_args={**NODE, "include_dashboard": False, "_system_config": HEALTH})
    try:
        second = c.add_node(**NODE)
        c.wait_for_nodes()
        yield c, second
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


def _ray_cfg(c: Cluster, **kw) -> SandboxConfig:
    return SandboxConfig(placement="ray", ray={"address": c.address}, **kw)


async def test_remote_sessions_speak_the_local_protocol_on_every_node(cluster):
    c, second = cluster
    cfg = _ray_cfg(c, slots=2, warm_workers=1, call_timeout_s=1.0)
    local_iso = choose_isolation(SandboxConfig())
    async with make_sandbox(cfg) as sb:
        # one actor per node, each with the isolation this host chooses for a local sandbox
        assert {m.node for m in sb.members} == {c.head_node.node_id, second.node_id}
        assert {m.info["isolation"] for m in sb.members} == {local_iso.name}
        assert all(m.info["layers"]["namespaces"] == local_iso.layers().namespaces
                   for m in sb.members)
        assert sb.capacity == 4
        # two sessions at once go to the two nodes (least loaded), and answer as a local one
        async with sb.open(ENV_CODE) as one, sb.open(ENV_CODE) as two, \
                Sandbox(SandboxConfig(slots=1, warm_workers=0)) as local, \
                local.open(ENV_CODE) as here:
            assert {one.node, two.node} == {c.head_node.node_id, second.node_id}
            assert here.node is None and one.meta == here.meta
            for env in (one, two, here):
                assert (await env.reset(7)).observation == (await here.reset(7)).observation
            steps = [[await env.step(a) for a in ("5", "x", "3")] for env in (one, here)]
            assert steps[0] == steps[1] and steps[0][-1].terminated
            assert await two.hint() == await here.hint() == "count down by one"
        # the environment's own failures come back as the same errors, with their kinds
        async with sb.open(FAULTY) as env:
            await env.reset(1)
            with pytest.raises(EnvException, match="boom") as err:
                await env.step("boom")
            assert err.value.kind == "exception" and "ValueError" in err.value.traceback
            with pytest.raises(SandboxError, match="deadline") as err:
                await env.step("spin")  # the node kills the worker at call_timeout_s
            assert err.value.kind == "timeout" and failure_kind(err.value) == "sandbox_timeout"
        with pytest.raises(SandboxError) as err:
            async with sb.open("class Environment:\n    pass\n"):
                pass
        assert failure_kind(err.value) == f"sandbox_{err.value.kind}" != "sandbox_node_lost"
        # the validator runs through the same interface
        report = await validate(ENV_CODE, sb)
        assert report.accepted, report.reason
        assert sum(sb.opened_by_node.values()) == 5 and not sb.lost


async def test_a_killed_node_fails_its_episodes_as_retryable_and_the_run_goes_on(
        cluster, fake, tmp_path):
    c, second = cluster
    server, chat = fake
    server.state.script = Script(chat, unhinted_solves_even=True)
    server.state.request_latency_s = 0.15  # turns take a while: sessions stay open on a node
    plays, k_u, k_h = 6, 4, 2
    cfg = SpadeConfig(
        paths=PathsConfig(data_dir=tmp_path / "data"),
        endpoints=[EndpointConfig(name="fake", base_url=server.base_url)],
        pool=PoolConfig(wait_for_endpoint_s=5),
        sandbox=_ray_cfg(c, slots=6, warm_workers=2),
        rollout=RolloutConfig(k_unhinted=k_u, k_hinted=k_h, max_tokens_per_turn=16),
        daemon=DaemonConfig(mode="fixed"),
    )
    memory = DictMemory()
    status, env_id, _ = await memory.add_design(ENV_CODE, _Accepted(), doc_id="seed",
                                                chunk_id="seed", excerpt="", policy_version=0)
    assert status is DesignStatus.ACCEPTED
    run_dir = tmp_path / "run"
    killed: dict[str, float] = {}

    async with EndpointPool(cfg.endpoints, cfg.pool) as pool, make_sandbox(cfg.sandbox) as sb:
        assert sb.capacity == 12
        spool = FileSpool(tmp_path / "spool", writer=True)
        corpus = CorpusSampler.__new__(CorpusSampler)  # never read in fixed mode
        daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=memory, spool=spool, corpus=corpus,
                        chat=chat, run_dir=run_dir)

        async def kill_mid_run() -> None:
            """Once a play has finished and two episodes are open on the second node, the
            node dies at once, as a crashed machine does: its sandbox actor (with its
            workers, which die with their parent) and its raylet."""
            (m,) = [m for m in sb.members if m.node == second.node_id]
            while not (daemon.counters["episodes"] >= k_u + k_h and m.sessions >= 2):
                await anyio.sleep(0.01)
            killed["sessions"], killed["time"] = m.sessions, time.time()
            os.kill(m.info["pid"], signal.SIGKILL)
            await anyio.to_thread.run_sync(c.remove_node, second, False)

        with capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(kill_mid_run)
                with anyio.fail_after(150):
                    await daemon.run(max_iterations=plays)
                tg.cancel_scope.cancel()  # a run that ended before the kill fails below
        spool.close()
        assert [m.node for m in sb.lost] == [second.node_id]
        assert [m.node for m in sb.members] == [c.head_node.node_id]

    episodes = _records(run_dir / "episodes.jsonl")  # each episode's last try
    played = _records(run_dir / "plays.jsonl")
    failed = [e for e in logs if e["event"] == "episode_failed"]  # every failed try
    # the killed node's episodes failed as lost-node errors naming it; nothing else failed
    assert killed, "the run ended before the node was killed"
    assert failed, "the node was killed with episodes open on it: their tries failed"
    assert {(e["kind"], e["sandbox_node"]) for e in failed} == \
        {("sandbox_node_lost", second.node_id)}
    assert [e["node"] for e in logs if e["event"] == "sandbox_node_lost"] == [second.node_id]
    assert daemon.ctx.failures.counts == {"episode.sandbox_node_lost": len(failed)}
    assert not daemon.ctx.failures.given_up
    # the run went on: every play finished whole, its failed episodes played again elsewhere
    assert daemon.counters["fixed_plays"] == plays == len(played) == len(memory.plays)
    assert all(len(p["unhinted"]) == k_u and len(p["hinted"]) == k_h for p in played)
    assert [(len(u), len(h)) for _, u, h in memory.plays] == [(k_u, k_h)] * plays
    assert all(e["error"] is None for e in episodes)
    assert len(episodes) == plays * (k_u + k_h)
    assert any(e["sandbox_node"] == c.head_node.node_id and e["time"] > killed["time"]
               for e in episodes)
    # never scored: the plays' scores are the recorded episodes' and no others, no sample
    # comes from a failed try, and the environment is not blamed for the node
    failed_ids = {e["episode_id"] for e in failed}
    assert not failed_ids & {e["episode_id"] for e in episodes}
    sample_episodes = _sample_episode_ids(tmp_path / "spool")
    assert sample_episodes and sample_episodes <= {e["episode_id"] for e in episodes}
    assert not sample_episodes & failed_ids
    assert memory.sandbox_failures == [0] * plays


async def test_no_sandbox_node_is_a_refusal_to_start(cluster):
    c, _ = cluster
    cfg = SandboxConfig(placement="ray", ray={"address": c.address,
                                              "node_resource": "no_such_resource"})
    with pytest.raises(Exception, match="no node of the Ray cluster offers") as err:
        async with make_sandbox(cfg):
            pass
    assert type(err.value).__name__ == "SandboxUnavailable"
    assert not ray.is_initialized()  # it left the cluster it joined
    assert failure_kind(SandboxNodeLost("gone", "n1")) == "sandbox_node_lost"


class _Accepted:
    accepted = True
    reason = ""


def _records(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x]


def _sample_episode_ids(spool_dir) -> set[str]:
    spool, batches, seq = FileSpool(spool_dir), [], 0
    while (b := spool.claim_next(seq)) is not None:
        batches.append(b)
        seq = b.seq
    return {s.episode_id for b in batches for s in b.samples()}
