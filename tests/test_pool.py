"""Endpoint pool against in-process fake OpenAI-compatible servers: routing, failover, recovery."""

from __future__ import annotations

import anyio
import pytest

from spade_async.core.config import EndpointConfig, PoolConfig
from spade_async.inference.errors import EndpointRequestError, EndpointUnavailable
from spade_async.inference.pool import EndpointPool
from spade_async.testing.fake.server import FakeOpenAIServer

FAST = PoolConfig(
    max_attempts=4,
    backoff_initial_s=0.01,
    backoff_max_s=0.05,
    health_interval_s=0.1,
    health_timeout_s=1.0,
    down_after_failures=1,
    wait_for_endpoint_s=5.0,
)
MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture
def servers():
    started = [FakeOpenAIServer().start() for _ in range(2)]
    yield started
    for s in started:
        s.stop()


def _cfg(server: FakeOpenAIServer, name: str, limit: int = 4, timeout: float = 5.0) -> EndpointConfig:
    return EndpointConfig(
        name=name, base_url=server.base_url, max_concurrency=limit, request_timeout_s=timeout
    )


async def test_chat_returns_token_ids_and_logprobs(servers):
    async with EndpointPool([_cfg(servers[0], "a")], FAST) as pool:
        out = await pool.chat(MSG, model="policy", max_tokens=7)
    assert len(out.token_ids) == 7 and len(out.logprobs) == 7
    assert all(lp <= 0 for lp in out.logprobs)
    assert out.prompt_token_ids and out.endpoint == "a" and out.finish_reason == "length"


async def test_least_in_flight_routing_respects_each_limit(servers):
    for s in servers:
        s.state.request_latency_s = 0.2
    cfgs = [_cfg(servers[0], "a", limit=3), _cfg(servers[1], "b", limit=5)]
    async with EndpointPool(cfgs, FAST) as pool:
        seen: list[str] = []

        async def one() -> None:
            seen.append((await pool.chat(MSG, model="policy", max_tokens=2)).endpoint)

        async with anyio.create_task_group() as tg:
            for _ in range(16):
                tg.start_soon(one)
    assert servers[0].state.max_in_flight <= 3
    assert servers[1].state.max_in_flight <= 5
    # Both were used, in proportion to capacity (b has more slots, so it takes more).
    assert seen.count("a") >= 3 and seen.count("b") >= seen.count("a")
    assert len(seen) == 16


async def test_episodes_stay_on_their_server_while_it_can_take_them(servers):
    """Many concurrent multi-turn "episodes", each turn preferring the episode's server (its
    prefix cache): with room on it no turn switches, and load still spreads over both; a
    preferred server with no free slot is left for the least loaded one."""
    for s in servers:
        s.state.request_latency_s = 0.02
    cfgs = [_cfg(servers[0], "a", limit=8), _cfg(servers[1], "b", limit=8)]
    async with EndpointPool(cfgs, FAST) as pool:
        switches: list[int] = []
        homes: list[str] = []

        async def episode(turns: int) -> None:
            where, moved = None, 0
            for _ in range(turns):
                out = await pool.chat(MSG, model="policy", max_tokens=2, prefer=where)
                moved += where is not None and out.endpoint != where
                where = where or out.endpoint
            switches.append(moved)
            homes.append(where)

        async with anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(episode, 5)
        assert switches == [0] * 12 and set(homes) == {"a", "b"}

        # "a" full (8 slow requests pinned there by preference): the next turn goes to "b"
        servers[0].state.request_latency_s = 0.5

        async def on_a() -> None:
            await pool.chat(MSG, model="policy", max_tokens=2, prefer="a")

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(on_a)
            await anyio.sleep(0.1)
            out = await pool.chat(MSG, model="policy", max_tokens=2, prefer="a")
        assert out.endpoint == "b" and servers[0].state.max_in_flight == 8


async def test_5xx_is_retried_on_another_endpoint(servers):
    servers[0].state.fail_next = 100
    async with EndpointPool([_cfg(servers[0], "a"), _cfg(servers[1], "b")], FAST) as pool:
        outs = [await pool.chat(MSG, model="policy", max_tokens=3) for _ in range(5)]
        assert not pool.is_up("a")
    assert {o.endpoint for o in outs} == {"b"}


async def test_dead_endpoint_leaves_rotation_and_comes_back(servers):
    async with EndpointPool([_cfg(servers[0], "a"), _cfg(servers[1], "b")], FAST) as pool:
        async with anyio.create_task_group() as tg:
            await tg.start(pool.run)
            servers[0].stop()
            outs = [await pool.chat(MSG, model="policy", max_tokens=2) for _ in range(6)]
            assert {o.endpoint for o in outs} == {"b"}
            assert not pool.is_up("a")
            servers[0].start()
            with anyio.fail_after(5):
                while not pool.is_up("a"):
                    await anyio.sleep(0.05)
            servers[1].stop()
            outs = [await pool.chat(MSG, model="policy", max_tokens=2) for _ in range(3)]
            assert {o.endpoint for o in outs} == {"a"}
            tg.cancel_scope.cancel()


async def test_request_waits_for_a_restart_without_health_loop(servers):
    async with EndpointPool([_cfg(servers[0], "a")], FAST) as pool:
        servers[0].stop()

        async def restart_later() -> None:
            await anyio.sleep(0.3)
            servers[0].start()

        async with anyio.create_task_group() as tg:
            tg.start_soon(restart_later)
            out = await pool.chat(MSG, model="policy", max_tokens=2)
    assert out.endpoint == "a"


async def test_all_down_raises_naming_each_failure(servers):
    pool_cfg = FAST.model_copy(update={"max_attempts": 2, "wait_for_endpoint_s": 0.2})
    servers[0].stop()
    async with EndpointPool([_cfg(servers[0], "a")], pool_cfg) as pool:
        with pytest.raises(EndpointUnavailable, match="a: ConnectError"):
            await pool.chat(MSG, model="policy")


async def test_4xx_is_raised_at_once_with_server_message(servers):
    async with EndpointPool([_cfg(servers[0], "a"), _cfg(servers[1], "b")], FAST) as pool:
        # The server's 404 makes the pool list the models again, then name what is served.
        with pytest.raises(EndpointRequestError, match="'no-such-model' is not served by any "
                           r"endpoint \(served: policy\)") as info:
            await pool.chat(MSG, model="no-such-model")
    assert info.value.status == 404
    assert servers[0].state.requests + servers[1].state.requests == 0  # refused before counting
    assert pool.is_up("a") and pool.is_up("b")


async def test_timeout_counts_as_failure_and_fails_over(servers):
    servers[0].state.request_latency_s = 5
    cfgs = [_cfg(servers[0], "a", timeout=0.2), _cfg(servers[1], "b")]
    async with EndpointPool(cfgs, FAST) as pool:
        outs = [await pool.chat(MSG, model="policy", max_tokens=2) for _ in range(3)]
    assert outs[-1].endpoint == "b"


async def test_adapter_routing_goes_where_the_adapter_is(servers):
    servers[1].state.adapters["policy-v3"] = "/tmp/adapter"
    async with EndpointPool([_cfg(servers[0], "a"), _cfg(servers[1], "b")], FAST) as pool:
        health = {h.name: h for h in await pool.check()}
        assert health["b"].adapters == ("policy-v3",) and health["a"].adapters == ()
        assert pool.serves("policy-v3") == ["b"]
        outs = [await pool.chat(MSG, model="policy-v3", max_tokens=2) for _ in range(4)]
        base = await pool.chat(MSG, model="policy", max_tokens=2)
        adapted = await pool.chat(MSG, model="policy-v3", max_tokens=2)
    assert {o.endpoint for o in outs} == {"b"}
    assert base.token_ids != adapted.token_ids


async def test_model_nobody_serves_fails_at_once_naming_what_is_served(servers):
    async with EndpointPool([_cfg(servers[0], "a")], FAST) as pool:
        await pool.check()
        with anyio.fail_after(1.0):  # not after wait_for_endpoint_s
            with pytest.raises(EndpointRequestError, match=r"'policy-v9'.*served: policy"):
                await pool.chat(MSG, model="policy-v9", max_tokens=2)
        servers[0].state.adapters["policy-v9"] = "/tmp/adapter"
        pool.note_model("a", "policy-v9", served=True)  # what a LoRA swap does
        assert (await pool.chat(MSG, model="policy-v9", max_tokens=2)).endpoint == "a"



async def test_adapter_loaded_by_another_process_is_found_before_the_next_health_probe(servers):
    slow = FAST.model_copy(update={"health_interval_s": 3600.0})
    async with EndpointPool([_cfg(servers[0], "a"), _cfg(servers[1], "b")], slow) as pool:
        await pool.check()
        # The trainer, in its own process, loads the adapter and records the version; the
        # daemon's pool has not probed since.
        servers[1].state.adapters["policy-v1"] = "/tmp/adapter"
        probes = servers[1].state.requests
        with anyio.fail_after(2.0):
            outs = await _gather(
                *[lambda: pool.chat(MSG, model="policy-v1", max_tokens=2)] * 6)
        assert {o.endpoint for o in outs} == {"b"}
        assert pool.serves("policy-v1") == ["b"]
        assert servers[1].state.requests - probes == 6  # chats only: /v1/models is not counted
        with pytest.raises(EndpointRequestError, match=r"'policy-v2'.*served: policy, policy-v1"):
            await pool.chat(MSG, model="policy-v2", max_tokens=2)


async def _gather(*calls):
    out: list = [None] * len(calls)

    async def one(i: int) -> None:
        out[i] = await calls[i]()

    async with anyio.create_task_group() as tg:
        for i in range(len(calls)):
            tg.start_soon(one, i)
    return out

async def test_check_reports_down_and_weight_version(servers):
    servers[0].state.weight_version = "7"
    servers[1].stop()
    async with EndpointPool([_cfg(servers[0], "a"), _cfg(servers[1], "b")], FAST) as pool:
        health = {h.name: h for h in await pool.check()}
    assert health["a"].up and health["a"].weight_version == "7" and health["a"].models == ("policy",)
    assert health["a"].latency_ms is not None
    assert not health["b"].up and "ConnectError" in health["b"].error


def test_config_mistakes_are_named():
    with pytest.raises(Exception, match="no endpoints configured"):
        EndpointPool([], FAST)
    cfg = EndpointConfig(name="x", base_url="http://127.0.0.1:1")
    with pytest.raises(Exception, match="unique"):
        EndpointPool([cfg, cfg], FAST)


async def test_saturation_area_integrates_in_flight_over_time():
    """The pool's saturation integral: 4 requests of ~0.4 s on a limit of 4 fill it (area ~0.4
    saturation-seconds), 2 at once half of it; idle time adds nothing."""
    import time

    with FakeOpenAIServer() as server:
        server.state.request_latency_s = 0.4
        async with EndpointPool([_cfg(server, "a", limit=4)], FAST) as pool:
            msg = [{"role": "user", "content": "x"}]

            async def burst(n: int) -> float:
                a0, t0 = pool.saturation_area("a"), time.monotonic()
                async with anyio.create_task_group() as tg:
                    for _ in range(n):
                        tg.start_soon(lambda: pool.chat(msg, model="policy", max_tokens=1))
                return (pool.saturation_area("a") - a0) / (time.monotonic() - t0)

            full = await burst(4)
            await anyio.sleep(0.3)
            idle0 = pool.saturation_area("a")
            await anyio.sleep(0.3)
            assert pool.saturation_area("a") == pytest.approx(idle0, abs=1e-6)
            half = await burst(2)
    assert 0.85 <= full <= 1.0 and 0.4 <= half <= 0.5
