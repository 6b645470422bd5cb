"""The fault-injection proxy in front of the in-process fake server: relaying, every fault kind
as a plain httpx client sees it (and as bytes on a raw socket), schedules and counters."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import anyio
import httpx
import pytest

from spade_async.inference.launch import free_port as _free_port
from spade_async.testing.fake.server import FakeOpenAIServer
from spade_async.testing.faults.plan import ALL_PATHS, Fault
from spade_async.testing.faults.proxy import FaultProxy

CHAT = "/v1/chat/completions"
BODY = {"model": "policy", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def proxy(upstream: FakeOpenAIServer) -> Iterator[FaultProxy]:
    with FaultProxy(upstream.base_url) as p:
        yield p


@pytest.fixture
def client(proxy: FaultProxy) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=proxy.base_url, timeout=5.0) as c:
        yield c


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


def chat(c: httpx.Client, **kw: object) -> httpx.Response:
    return c.post(CHAT, json=BODY, **kw)  # type: ignore[arg-type]


def stable(reply: dict) -> dict:
    return {k: v for k, v in reply.items() if k not in ("id", "created")}


def raw_exchange(port: int, request: bytes) -> bytes:
    """Sends raw bytes and reads until the proxy closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def raw_post(path: str, payload: dict) -> bytes:
    body = json.dumps(payload).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


# ---- relaying ----------------------------------------------------------------------------------


def test_pass_through_equals_direct_and_keeps_alive(upstream, proxy, client):
    big = {**BODY, "messages": [{"role": "user", "content": "x" * 70_000 + "end"}],
           "logprobs": True, "return_token_ids": True}
    with httpx.Client(base_url=upstream.base_url, timeout=5.0) as direct:
        want = direct.post(CHAT, json=big).json()
        want_models = direct.get("/v1/models").json()
    got = [client.post(CHAT, json=big) for _ in range(4)]
    assert all(r.status_code == 200 for r in got)
    assert all(stable(r.json()) == stable(want) for r in got)
    assert got[0].headers["content-type"] == "application/json"
    assert int(got[0].headers["content-length"]) == len(got[0].content)
    assert client.get("/v1/models").json() == want_models
    assert proxy.connections == 1  # five requests, one keep-alive connection
    assert proxy.requests_seen == proxy.requests_forwarded == 5
    assert proxy.faults_applied == Counter()
    assert [(r.path, r.outcome, r.status) for r in proxy.log] == \
        [(CHAT, "ok", 200)] * 4 + [("/v1/models", "ok", 200)]


async def test_concurrent_requests_from_an_async_client(proxy):
    async with httpx.AsyncClient(base_url=proxy.base_url, timeout=5.0) as c:
        replies: list[int] = []

        async def one(i: int) -> None:
            body = {**BODY, "messages": [{"role": "user", "content": f"q{i}"}]}
            replies.append((await c.post(CHAT, json=body)).status_code)

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
    assert replies == [200] * 8
    assert proxy.requests_forwarded == 8


def test_chunked_request_bodies_are_refused(proxy):
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
               b"\r\n2\r\n{}\r\n0\r\n\r\n")
    reply = raw_exchange(proxy.port, request)
    assert reply.startswith(b"HTTP/1.1 411 ")
    assert proxy.requests_forwarded == 0


def test_upstream_down_is_a_502(proxy):
    # The proxy stays up and answers for a dead upstream: the other side of `down`.
    with FaultProxy(f"http://127.0.0.1:{_free_port()}") as orphan:
        with httpx.Client(base_url=orphan.base_url, timeout=5.0) as c:
            resp = chat(c)
    assert resp.status_code == 502 and "upstream failed" in resp.json()["error"]["message"]
    assert orphan.log[0].outcome == "upstream-error"


def test_upstream_down_can_look_like_the_dead_server_itself(proxy):
    # upstream_failure="drop": the client's connection closes without an answer, as it would
    # talking to the dead server directly (a test that SIGKILLs vLLM behind the proxy).
    with FaultProxy(f"http://127.0.0.1:{_free_port()}", upstream_failure="drop") as orphan:
        with httpx.Client(base_url=orphan.base_url, timeout=5.0) as c:
            with pytest.raises(httpx.RemoteProtocolError):
                chat(c)
    assert orphan.log[0].outcome == "upstream-error" and orphan.log[0].status is None


# ---- each fault kind -------------------------------------------------------------------------


def test_stall_holds_until_the_client_gives_up_then_clear_lets_requests_through(proxy, client):
    proxy.inject("stall")
    with pytest.raises(httpx.ReadTimeout):
        chat(client, timeout=0.3)
    # The proxy notices the hang-up and never forwards the abandoned request.
    wait_until(lambda: len(proxy.log) == 1)
    assert proxy.log[0][1:] == (CHAT, "stall", None)
    assert proxy.requests_forwarded == 0
    with pytest.raises(httpx.ReadTimeout):
        chat(client, timeout=0.3)  # still armed: no count, no duration
    proxy.clear()
    assert chat(client).status_code == 200
    assert proxy.faults_applied == Counter(stall=2)


def test_stall_for_seconds_then_forwards(proxy, client):
    proxy.inject("stall", seconds=0.3, count=1)
    t = time.monotonic()
    assert chat(client).status_code == 200
    assert time.monotonic() - t >= 0.3
    assert proxy.log[-1][1:] == (CHAT, "stall", 200)
    assert proxy.requests_forwarded == 1


def test_stall_without_seconds_is_released_when_the_fault_ends(proxy, client):
    proxy.inject("stall", duration=0.3)
    assert chat(client).status_code == 200  # held until the duration ran out, then forwarded
    assert chat(client).status_code == 200  # the fault is over
    assert [r.outcome for r in proxy.log] == ["stall", "ok"]


def test_clear_releases_a_held_request(proxy, client):
    proxy.inject("stall", count=1)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(chat, client)
        wait_until(lambda: proxy.requests_seen == 1)
        assert not pending.done()
        proxy.clear()
        assert pending.result(timeout=5).status_code == 200


def test_drop_closes_without_a_response(proxy, client):
    assert chat(client).status_code == 200  # a keep-alive connection to reuse
    proxy.inject("drop", count=2)
    with pytest.raises(httpx.RemoteProtocolError):
        chat(client)
    assert raw_exchange(proxy.port, raw_post(CHAT, BODY)) == b""  # not one byte back
    assert chat(client).status_code == 200  # httpx reconnects
    assert [(r.outcome, r.status) for r in proxy.log] == \
        [("ok", 200), ("drop", None), ("drop", None), ("ok", 200)]
    assert proxy.requests_forwarded == 2


def test_status_faults_answer_openai_style_errors(proxy, client):
    proxy.inject("status", status=500, count=1)
    proxy.inject("status", status=429, count=1)
    first, second = chat(client), chat(client)
    assert first.status_code == 500
    assert first.json()["error"]["code"] == 500
    assert first.json()["error"]["message"].startswith("injected fault")
    assert "retry-after" not in first.headers
    assert second.status_code == 429 and second.headers["retry-after"] == "1"
    assert second.json()["error"]["code"] == 429
    assert chat(client).status_code == 200
    assert proxy.connections == 1  # an error status is a whole response: the connection lives
    assert proxy.requests_forwarded == 1
    assert [r.status for r in proxy.log] == [500, 429, 200]


def test_truncate_sends_half_the_body(proxy, client):
    proxy.inject("truncate", count=2)
    with pytest.raises(httpx.RemoteProtocolError):
        chat(client)
    reply = raw_exchange(proxy.port, raw_post(CHAT, BODY))
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    assert length > 0 and len(body) == length // 2
    assert chat(client).status_code == 200
    assert proxy.requests_forwarded == 3  # a truncated reply was forwarded first
    assert proxy.faults_applied == Counter(truncate=2)


def test_garbage_is_a_200_that_is_not_json(proxy, client):
    proxy.inject("garbage", count=1)
    resp = chat(client)
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    with pytest.raises(ValueError):
        resp.json()
    assert chat(client).json()["choices"]
    assert proxy.connections == 1


def test_down_refuses_connects_until_up(proxy, client):
    port = proxy.port
    assert chat(client).status_code == 200  # leaves an idle keep-alive connection
    proxy.down()
    assert proxy.is_down
    with pytest.raises(httpx.ConnectError):
        chat(client)
    with pytest.raises(httpx.ConnectError):
        client.get("/health")
    proxy.up()
    assert not proxy.is_down and proxy.port == port
    assert chat(client).status_code == 200

    proxy.inject("die", duration=0.3)  # the alias; comes back by itself
    with pytest.raises(httpx.ConnectError):
        chat(client)

    def answers() -> bool:
        try:
            return chat(client).status_code == 200
        except httpx.ConnectError:
            return False

    wait_until(answers)
    assert proxy.port == port
    assert proxy.faults_applied == Counter(down=2)
    assert proxy.requests_seen == 3  # refused connects never reach the proxy


def test_down_cuts_open_connections(proxy):
    proxy.inject("stall", count=1)
    with httpx.Client(base_url=proxy.base_url, timeout=5.0) as c, ThreadPoolExecutor(1) as pool:
        pending = pool.submit(chat, c)
        wait_until(lambda: proxy.requests_seen == 1)
        proxy.down()
        with pytest.raises(httpx.TransportError):
            pending.result(timeout=5)
    assert proxy.log[-1][1:] == (CHAT, "down", None)
    proxy.up()


# ---- arming ----------------------------------------------------------------------------------


def test_count_limited_faults_apply_to_exactly_n_requests_in_order(proxy, client):
    proxy.inject("drop", count=1)
    proxy.inject("status", status=503, count=2)
    outcomes: list[str] = []
    for _ in range(5):
        try:
            outcomes.append(str(chat(client).status_code))
        except httpx.TransportError:
            outcomes.append("dropped")
    assert outcomes == ["dropped", "503", "503", "200", "200"]
    assert proxy.faults_applied == Counter(drop=1, status=2)
    assert proxy.requests_seen == 5 and proxy.requests_forwarded == 2


def test_duration_limited_fault_expires(proxy, client):
    proxy.inject("status", status=503, duration=0.3)
    assert chat(client).status_code == 503
    wait_until(lambda: chat(client).status_code == 200)


def test_paths_choose_which_requests_fail(proxy, client):
    proxy.inject("status", status=503)  # default: health checks are spared
    assert client.get("/health").status_code == 200
    assert client.get("/v1/models").status_code == 200
    assert chat(client).status_code == 503
    proxy.clear()
    proxy.inject("status", status=503, paths=ALL_PATHS)
    assert client.get("/health").status_code == 503
    proxy.clear()
    proxy.inject("status", status=503, paths=["/v1/models"])
    assert client.get("/v1/models").status_code == 503
    assert chat(client).status_code == 200
    assert client.get("/health").status_code == 200
    assert proxy.faults_applied == Counter(status=3)


def test_schedule_plays_phases_in_order(proxy, client):
    done = proxy.schedule([
        (0.0, Fault("status", status=503)),
        (0.5, Fault("garbage")),
        (1.0, Fault("down", duration=0.5)),
    ])
    seen: list[str] = []
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        finished = done.done()
        try:
            resp = chat(client)
            try:
                resp.json()
                outcome = str(resp.status_code)
            except ValueError:
                outcome = "garbage"
        except httpx.TransportError:
            outcome = "down"
            time.sleep(0.01)
        if not seen or seen[-1] != outcome:
            seen.append(outcome)
        if finished and outcome == "200":
            break
    done.result(timeout=0)
    assert seen == ["503", "garbage", "down", "200"]
    assert not proxy.is_down
    applied = proxy.faults_applied
    assert applied["down"] == 1 and applied["status"] >= 1 and applied["garbage"] >= 1


def test_clear_cancels_a_schedule(proxy, client):
    done = proxy.schedule([(0.0, Fault("down")), (30.0, Fault("drop"))])
    wait_until(lambda: proxy.is_down)
    proxy.clear()
    assert done.cancelled()
    assert chat(client).status_code == 200


def test_fault_parameters_are_checked():
    assert Fault("die").kind == "down"  # type: ignore[arg-type]
    assert Fault("status").status == 500
    for bad in (dict(kind="nope"), dict(kind="drop", seconds=1.0), dict(kind="drop", count=0),
                dict(kind="down", count=1), dict(kind="garbage", status=500),
                dict(kind="status", status=99)):
        with pytest.raises(ValueError):
            Fault(**bad)  # type: ignore[arg-type]


# ---- from a shell ------------------------------------------------------------------------------


def test_command_line_prints_one_line_per_request(upstream):
    port = _free_port()
    cmd = [sys.executable, "-m", "spade_async.testing.faults", "--upstream", upstream.base_url,
           "--port", str(port), "--fault", "status:503", "--count", "1"]
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env) as proc:
        try:
            assert proc.stdout is not None
            banner = proc.stdout.readline()
            assert f"127.0.0.1:{port}" in banner, banner + (proc.stderr.read() if proc.stderr
                                                           else "")
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5.0) as c:
                statuses = [chat(c).status_code for _ in range(2)]
            lines: list[str] = []
            reader = threading.Thread(target=lambda: lines.extend(
                proc.stdout.readline() for _ in range(2)))  # type: ignore[union-attr]
            reader.start()
            reader.join(timeout=5)
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=10)
    assert statuses == [503, 200]
    assert [line.split()[1:3] for line in lines] == [["status", "503"], ["ok", "200"]]
    assert proc.returncode == 0, err
