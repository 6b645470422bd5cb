"""The pool's one error contract: every way a request can fail leaves as an EndpointError
subclass that names the endpoint, the attempts and the elapsed time, and attempt timeouts sized
by the request and the endpoint's measured speed."""

from __future__ import annotations

import json

import anyio
import httpx
import pytest

from spade_async.core.config import EndpointConfig, PoolConfig
from spade_async.inference.endpoint import Endpoint as _Endpoint
from spade_async.inference.errors import (
    EndpointConnectionError,
    EndpointDeadlineExceeded,
    EndpointError,
    EndpointMalformedResponse,
    EndpointServerError,
    EndpointTimeout,
    NoEndpointUp,
)
from spade_async.inference.pool import EndpointPool
from spade_async.inference.speed import SpeedMeter, Work
from spade_async.testing.fake.server import FakeOpenAIServer

FAST = PoolConfig(max_attempts=3, backoff_initial_s=0.01, backoff_max_s=0.02,
                  health_interval_s=0.1, health_timeout_s=1.0, down_after_failures=100,
                  wait_for_endpoint_s=2.0)
MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture
def server():
    s = FakeOpenAIServer().start()
    yield s
    s.stop()


def _ep(base_url: str, **kw) -> EndpointConfig:
    return EndpointConfig(name="a", base_url=base_url, **{"request_timeout_s": 5.0, **kw})


def _contract(exc: EndpointError, attempts: int) -> None:
    assert exc.endpoint == "a" and exc.attempts == attempts and exc.elapsed_s >= 0
    assert "a:" in str(exc) or "'a'" in str(exc)


async def test_request_deadline_is_an_endpoint_error_not_a_bare_timeout(server):
    server.state.request_latency_s = 5
    async with EndpointPool([_ep(server.base_url)], FAST) as pool:
        with anyio.fail_after(3), pytest.raises(EndpointDeadlineExceeded) as info:
            await pool.chat(MSG, model="policy", max_tokens=2, deadline_s=0.3)
    assert info.value.kind == "deadline" and 0.25 < info.value.elapsed_s < 2
    _contract(info.value, 1)
    assert "deadline of 0.3s passed" in str(info.value)


async def test_every_attempt_timing_out_is_an_endpoint_timeout(server):
    server.state.request_latency_s = 5
    cfg = _ep(server.base_url, request_timeout_s=0.1, min_tokens_per_s=1000.0)
    async with EndpointPool([cfg], FAST) as pool:
        with pytest.raises(EndpointTimeout, match="no answer within") as info:
            await pool.chat(MSG, model="policy", max_tokens=2)
    assert info.value.kind == "timeout"
    _contract(info.value, 3)


@pytest.mark.parametrize(("status", "kind"), [(500, "http_5xx"), (503, "http_5xx"),
                                              (429, "http_429")])
async def test_server_errors_name_their_status(server, status, kind):
    server.state.fail_next, server.state.fail_status = 10, status
    async with EndpointPool([_ep(server.base_url)], FAST) as pool:
        with pytest.raises(EndpointServerError, match=f"HTTP {status}") as info:
            await pool.chat(MSG, model="policy", max_tokens=2)
    assert info.value.status == status and info.value.kind == kind
    _contract(info.value, 3)


async def test_refused_connections_are_a_connection_error(server):
    url = server.base_url
    server.stop()
    async with EndpointPool([_ep(url)], FAST) as pool:
        with pytest.raises(EndpointConnectionError, match="ConnectError") as info:
            await pool.chat(MSG, model="policy", max_tokens=2)
    assert info.value.kind == "connection"
    _contract(info.value, 3)


async def test_no_endpoint_up_names_the_wait(server):
    url = server.base_url
    server.stop()
    cfg = FAST.model_copy(update={"down_after_failures": 1, "wait_for_endpoint_s": 0.2,
                                  "health_interval_s": 60})
    async with EndpointPool([_ep(url)], cfg) as pool:
        with pytest.raises(NoEndpointUp, match="no endpoint up after 0.2s") as info:
            await pool.chat(MSG, model="policy", max_tokens=2)
    assert info.value.kind == "no_endpoint" and info.value.attempts == 1


def _completion_body(n: int = 3) -> dict:
    return {"model": "policy", "choices": [{
        "text": "abc", "token_ids": list(range(n)), "prompt_token_ids": [1, 2],
        "logprobs": {"token_logprobs": [-0.5] * n}, "finish_reason": "length"}]}


def _scripted(replies: list) -> tuple[httpx.MockTransport, list[str]]:
    """A transport answering /v1/completions with `replies` in turn (bytes or a dict)."""
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        reply = replies.pop(0) if replies else _completion_body()
        if isinstance(reply, bytes):
            return httpx.Response(200, content=reply,
                                  headers={"content-type": "application/json"})
        return httpx.Response(200, json=reply)

    return httpx.MockTransport(handle), seen


async def test_malformed_bodies_are_retried_then_named():
    transport, seen = _scripted([b'{"choices": [', {"choices": []}, b"<html>oops"])
    async with EndpointPool([_ep("http://mock")], FAST, transport=transport) as pool:
        with pytest.raises(EndpointMalformedResponse) as info:
            await pool.complete([1, 2], model="policy", max_tokens=3)
    assert len(seen) == 3 and info.value.kind == "malformed"
    assert "not JSON" in str(info.value) and "malformed completion" in str(info.value)
    _contract(info.value, 3)


async def test_one_malformed_body_then_a_good_one_succeeds():
    transport, seen = _scripted([b"{truncated", _completion_body(4)])
    async with EndpointPool([_ep("http://mock")], FAST, transport=transport) as pool:
        out = await pool.complete([1, 2], model="policy", max_tokens=4)
    assert out.token_ids == (0, 1, 2, 3) and len(seen) == 2


async def test_a_body_without_token_ids_is_a_capability_error_at_once():
    body = {"choices": [{"text": "hi", "logprobs": None, "finish_reason": "stop"}]}
    transport, seen = _scripted([body])
    async with EndpointPool([_ep("http://mock")], FAST, transport=transport) as pool:
        with pytest.raises(EndpointError, match="return_token_ids") as info:
            await pool.complete([1], model="policy", max_tokens=3)
    assert info.value.kind == "capability" and len(seen) == 1


def test_attempt_timeout_fits_the_request_and_the_measured_speed():
    cfg = _ep("http://x", request_timeout_s=30.0, min_tokens_per_s=2.0)
    ep = _Endpoint(cfg, client=None, window=16)  # type: ignore[arg-type]
    # Before any measurement: the tokens asked at the slowest speed waited for, >= the floor.
    assert ep.attempt_timeout(Work(100, 768), margin=4) == 384.0
    assert ep.attempt_timeout(Work(100, 10), margin=4) == 30.0
    assert ep.attempt_timeout(None, margin=4) == 30.0  # an admin call: the floor
    # Measured: 0.5 s per 100-token request alone -> 0.005 s per token per request.
    for _ in range(8):
        ep.speed.observe(seconds=2.0, units=100.0, load=4)
    ep.in_flight = 8
    work = Work(prompt_tokens=2000, max_tokens=768)
    expected = 4 * 0.005 * (768 + 0.05 * 2000) * 8
    assert ep.attempt_timeout(work, margin=4) == pytest.approx(expected)
    ep.in_flight = 1  # alone, the same request needs far less, but never below the floor
    assert ep.attempt_timeout(work, margin=4) == 30.0


def test_speed_meter_takes_a_high_quantile_of_recent_requests():
    meter = SpeedMeter(window=10)
    assert meter.quantile() is None
    for s in [1.0] * 9 + [10.0]:
        meter.observe(seconds=s, units=1.0, load=1)
    assert meter.quantile(0.5) == 1.0 and meter.quantile(0.95) == 10.0
    for _ in range(10):  # the window forgets the slow one
        meter.observe(seconds=2.0, units=1.0, load=1)
    assert meter.quantile(0.95) == 2.0


async def test_successful_generations_feed_the_speed_estimate(server):
    server.state.token_latency_s = 0.01
    async with EndpointPool([_ep(server.base_url)], FAST) as pool:
        for _ in range(5):
            await pool.chat(MSG, model="policy", max_tokens=10)
        snap = pool.snapshot()[0]
    # ~0.01 s a token (plus overhead), one request at a time
    assert 0.005 < snap["s_per_token_p90"] < 0.2
    json.dumps(snap)  # status.json carries it


async def test_a_busy_endpoint_queues_requests_it_is_not_an_outage(server):
    # One slot, 1 s a request, and wait_for_endpoint_s far below the queueing time: the
    # endpoint is up, so the queued requests wait their turn instead of failing as no_endpoint.
    server.state.request_latency_s = 1.0
    cfg = PoolConfig(**{**FAST.model_dump(), "wait_for_endpoint_s": 0.3})
    async with EndpointPool([_ep(server.base_url, max_concurrency=1)], cfg) as pool:
        done: list[str] = []

        async def one() -> None:
            await pool.chat(MSG, model="policy", max_tokens=2)
            done.append("ok")

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(one)
    assert done == ["ok"] * 3 and server.state.max_in_flight == 1
