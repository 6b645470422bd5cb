"""The vllm-nccl backend's request sequence against the fake server (no GPU here), and the
publisher's retries, reports and current.json against fake endpoints."""

from __future__ import annotations

import json
import time

import pytest
from structlog.testing import capture_logs

from spade_async.core.config import EndpointConfig, PoolConfig, SpadeConfig, VllmNcclSwap
from spade_async.core.config.trainer import TrainerConfig
from spade_async.core.policy import current_version
from spade_async.inference.launch import free_port as _free_port
from spade_async.inference.pool import EndpointPool
from spade_async.testing.fake.server import FakeOpenAIServer
from spade_async.testing.fake.state import FakeState
from trainer.publish import Publisher, PublishError
from trainer.swap.base import SwapError, WedgedServer
from trainer.swap.factory import make_swapper
from trainer.swap.nccl import NcclSwapper

POOL = PoolConfig(max_attempts=1, backoff_initial_s=0.01, wait_for_endpoint_s=2)
TENSORS = [("model.embed_tokens.weight", "bfloat16", (256, 64)),
           ("model.layers.0.self_attn.q_proj.weight", "bfloat16", (64, 64)),
           ("model.norm.weight", "bfloat16", (64,))]


class FakeTransfer:
    """The trainer's side of the NCCL group, with the fake server's shared-memory 'wire'.
    Like a real rendezvous, `connect` and `send` only succeed while the server is inside the
    matching call, so a swapper that did not overlap them fails."""

    def __init__(self, state: FakeState, tensors=TENSORS) -> None:
        self.state, self.tensors = state, list(tensors)
        self.corrupt = False  # broadcast other dtypes than update_info announced
        self.events: list[str] = []
        self.announced: dict | None = None

    def _wait_for(self, request: str) -> None:
        deadline = time.monotonic() + 5
        while request not in self.state.request_log[self._mark:]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no peer: the server never entered {request}")
            time.sleep(0.002)

    def rendezvous(self, inference_world_size: int) -> dict:
        self.events.append(f"rendezvous({inference_world_size})")
        self._mark = len(self.state.request_log)
        return {"master_address": "10.0.0.1", "master_port": 29555, "rank_offset": 1,
                "world_size": 1 + inference_world_size, "packed": False}

    def connect(self) -> None:
        self._wait_for("POST /init_weight_transfer_engine")
        self.state.nccl_joined = True
        self.events.append("connect")

    def update_info(self) -> dict:
        self._mark = len(self.state.request_log)
        self.announced = {"names": [n for n, _, _ in self.tensors],
                          "dtype_names": [d for _, d, _ in self.tensors],
                          "shapes": [list(s) for _, _, s in self.tensors]}
        return self.announced

    def send(self) -> None:
        self._wait_for("POST /update_weights")
        sent = [(n, "float32", s) for n, _, s in self.tensors] if self.corrupt else self.tensors
        self.state.nccl_wire.extend(sent)
        self.events.append("send")

    def set_weights(self, state: dict) -> None:
        self.events.append("set_weights")

    def close(self) -> None:
        self.events.append("close")


def _endpoint(server: FakeOpenAIServer, name: str = "gpu") -> EndpointConfig:
    return EndpointConfig(name=name, base_url=server.base_url, request_timeout_s=10,
                          weight_swap=VllmNcclSwap(timeout_s=10))


ONE_UPDATE = ["POST /pause?mode=keep", "POST /start_weight_update", "POST /update_weights",
              "POST /finish_weight_update", "POST /reset_prefix_cache", "POST /resume"]


async def test_nccl_swap_request_sequence(tmp_path):
    with FakeOpenAIServer(FakeState(nccl_world_size=2)) as server:
        async with EndpointPool([_endpoint(server)], POOL) as pool:
            swapper = make_swapper(pool, "gpu", "policy")
            assert isinstance(swapper, NcclSwapper)
            transfer = FakeTransfer(server.state)
            swapper.attach(transfer)
            r1 = await swapper.swap(1, tmp_path)
            r2 = await swapper.swap(2, tmp_path)
    log = server.state.request_log
    assert log == ["GET /get_world_size?include_dp=true", "POST /init_weight_transfer_engine",
                   *ONE_UPDATE, *ONE_UPDATE]
    # trainer side: one rendezvous for 1 trainer + 2 workers, then one broadcast per version
    assert transfer.events == ["rendezvous(2)", "connect", "send", "send"]
    assert server.state.nccl_init["world_size"] == 3
    assert server.state.nccl_received == TENSORS
    assert server.state.weight_version == "2" and not server.state.paused
    assert r1.model == r2.model == "policy"


async def test_nccl_failed_broadcast_holds_the_server_paused_until_the_next_publish(tmp_path):
    """Tensors that do not match what was announced fail the update after some may have
    landed: the server's weights are part old, part new, so it stays paused (it must not
    serve them), the session is ended, the group torn down; the next publish sets the group
    up again, replaces every weight and resumes it."""
    with FakeOpenAIServer(FakeState(nccl_world_size=1, nccl_wait_s=1.0)) as server:
        async with EndpointPool([_endpoint(server)], POOL) as pool:
            swapper = make_swapper(pool, "gpu", "policy")
            transfer = FakeTransfer(server.state)
            swapper.attach(transfer)
            transfer.corrupt = True
            with capture_logs() as logs:
                with pytest.raises(SwapError, match="does not match update_info"):
                    await swapper.swap(1, tmp_path)
            assert not swapper.connected and swapper.held_paused and server.state.paused
            assert "close" in transfer.events
            assert server.state.weight_version is None and not server.state.nccl_updating
            assert "nccl_partial_update_server_held_paused" in [e["event"] for e in logs]
            transfer.corrupt = False
            await swapper.swap(2, tmp_path)
            assert not swapper.held_paused and not server.state.paused
    log = server.state.request_log
    failed = log.index("POST /shutdown_weight_transfer_engine")
    # no resume after the failure; finish ends the session (the failed update already had:
    # vLLM answers 500, which is fine)
    assert log[:failed] == ["GET /get_world_size?include_dp=true",
                            "POST /init_weight_transfer_engine", *ONE_UPDATE[:3],
                            "POST /finish_weight_update"]
    # the next version sets the group up again before updating
    assert log[failed + 1:] == ["GET /get_world_size?include_dp=true", "POST /init_weight_transfer_engine",
                                *ONE_UPDATE]
    assert server.state.weight_version == "2"


async def test_nccl_trainer_dying_before_the_broadcast_ends_the_session_and_resumes(tmp_path):
    """The trainer side fails before sending a tensor (here: its broadcast raises at once):
    the server got nothing, so the session is ended and the server resumes on its weights;
    the next publish can start (a session left open would refuse it)."""
    with FakeOpenAIServer(FakeState(nccl_world_size=1, nccl_wait_s=1.0)) as server:
        async with EndpointPool([_endpoint(server)], POOL) as pool:
            swapper = make_swapper(pool, "gpu", "policy")
            transfer = FakeTransfer(server.state)
            swapper.attach(transfer)
            transfer.update_info = lambda: (_ for _ in ()).throw(RuntimeError("CUDA error"))
            with pytest.raises(RuntimeError, match="CUDA error"):
                await swapper.swap(1, tmp_path)
            assert not server.state.nccl_updating and not server.state.paused
            del transfer.update_info
            await swapper.swap(2, tmp_path)
    assert server.state.request_log.count("POST /start_weight_update") == 2
    assert server.state.weight_version == "2" and not server.state.paused


async def test_nccl_wedged_server_is_reported_with_its_remedy(tmp_path):
    """The trainer died mid-broadcast: the worker waits in NCCL for ever (no timeout in NCCL),
    so /update_weights and the session's end never answer. Every step has a deadline, nothing
    is sent twice, and the error names the one remedy."""
    state = FakeState(nccl_world_size=1, nccl_wait_s=1.0)
    with FakeOpenAIServer(state) as server:
        ep = EndpointConfig(name="gpu", base_url=server.base_url, request_timeout_s=1,
                            weight_swap=VllmNcclSwap(timeout_s=1.5))
        async with EndpointPool([ep], PoolConfig(max_attempts=4, backoff_initial_s=0.01,
                                                 wait_for_endpoint_s=2)) as pool:
            swapper = make_swapper(pool, "gpu", "policy")
            transfer = FakeTransfer(state)
            swapper.attach(transfer)
            await swapper.swap(1, tmp_path)  # the group is up
            state.nccl_stuck = True
            transfer.send = lambda: time.sleep(0.1)  # the trainer sends nothing, returns
            t0 = time.monotonic()
            with pytest.raises(WedgedServer, match="restart that inference server"):
                await swapper.swap(2, tmp_path)
            assert time.monotonic() - t0 < 60
    log = state.request_log
    # a collective or session call is never retried (max_attempts 4 for everything else)
    assert log.count("POST /update_weights") == 2 and log.count("POST /start_weight_update") == 2
    tail = log[log.index("POST /update_weights", len(ONE_UPDATE)):]
    # the session's end is asked once; the (idempotent) shutdown may be retried; no resume
    assert tail[1] == "POST /finish_weight_update" and tail.count("POST /finish_weight_update") == 1
    assert set(tail[2:]) == {"POST /shutdown_weight_transfer_engine"}
    assert swapper.held_paused


async def test_nccl_finish_failing_is_sent_once_and_holds_the_server(tmp_path):
    state = FakeState(nccl_world_size=1, nccl_fail_finish=1)
    with FakeOpenAIServer(state) as server:
        async with EndpointPool([_endpoint(server)], PoolConfig(max_attempts=4,
                                backoff_initial_s=0.01, wait_for_endpoint_s=2)) as pool:
            swapper = make_swapper(pool, "gpu", "policy")
            swapper.attach(FakeTransfer(state))
            with pytest.raises(SwapError, match="injected finish failure"):
                await swapper.swap(1, tmp_path)
            # sent once by the swap, once more to end the session (which clears it here)
            assert state.request_log.count("POST /finish_weight_update") == 2
            assert swapper.held_paused and state.paused and not state.nccl_updating
            await swapper.swap(2, tmp_path)
    assert state.weight_version == "2" and not state.paused


@pytest.mark.parametrize("n", [1, 2, 4])
def test_publisher_one_nccl_group_per_endpoint(tmp_path, n):
    """N vllm-nccl servers: N transfers (own port, own group, rank_offset 1, world size 1 +
    that server's workers), published one after another, each receiving every tensor."""
    tcfg = TrainerConfig(mode="full", publish_attempts=1)
    version_dir = tmp_path / "weights" / "v1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.safetensors").write_bytes(b"not read")
    servers = [FakeOpenAIServer(FakeState(nccl_world_size=1 + i % 2)).start() for i in range(n)]
    try:
        eps = [_endpoint(s, f"gpu{i}") for i, s in enumerate(servers)]
        made: dict[str, FakeTransfer] = {}

        def make(e: EndpointConfig) -> FakeTransfer:
            made[e.name] = FakeTransfer(servers[int(e.name[3:])].state)
            return made[e.name]

        with Publisher(_cfg(tmp_path, *eps), tcfg, transfers=make) as pub:
            pub.set_weights({"w": None})
            report = pub.publish(1, version_dir)
            pub.publish(2, version_dir)
    finally:
        for s in servers:
            s.stop()
    assert set(report.swap_seconds) == {f"gpu{i}" for i in range(n)}
    assert len({id(t) for t in made.values()}) == n
    for i, s in enumerate(servers):
        assert s.state.nccl_init["rank_offset"] == 1
        assert s.state.nccl_init["world_size"] == 2 + i % 2
        assert s.state.nccl_received == TENSORS and s.state.weight_version == "2"
        assert made[f"gpu{i}"].events == ["set_weights", f"rendezvous({1 + i % 2})",
                                          "connect", "send", "send"]
    # one at a time: no two servers inside /update_weights at once
    spans = sorted((s.state.update_spans[0]) for s in servers)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


async def test_nccl_swapper_without_the_trainer_transfer_refuses(tmp_path):
    with FakeOpenAIServer() as server:
        async with EndpointPool([_endpoint(server)], POOL) as pool:
            with pytest.raises(SwapError, match="needs the trainer's weight transfer"):
                await make_swapper(pool, "gpu", "policy").swap(1, tmp_path)
    assert server.state.request_log == []


def _cfg(tmp_path, *endpoints: EndpointConfig) -> SpadeConfig:
    return SpadeConfig(paths={"data_dir": tmp_path}, endpoints=list(endpoints),
                       pool=PoolConfig(max_attempts=1, backoff_initial_s=0.01))


def test_publisher_pushes_every_endpoint_then_records_the_version(tmp_path):
    tcfg = TrainerConfig(mode="full", publish_attempts=2)
    version_dir = tmp_path / "weights" / "v3"
    version_dir.mkdir(parents=True)
    (version_dir / "model.safetensors").write_bytes(b"not read by the fakes")
    with FakeOpenAIServer(FakeState(nccl_world_size=1)) as gpu, FakeOpenAIServer() as cpu:
        reload_ep = EndpointConfig(name="cpu", base_url=cpu.base_url,
                                   weight_swap={"type": "vllm-reload"})
        cfg = _cfg(tmp_path, _endpoint(gpu), reload_ep)
        with Publisher(cfg, tcfg, transfers=lambda e: FakeTransfer(gpu.state)) as pub:
            report = pub.publish(3, version_dir)
    assert report.model == "policy" and set(report.swap_seconds) == {"gpu", "cpu"}
    assert gpu.state.weight_version == "3" and cpu.state.weight_version == "3"
    assert cpu.state.weights_path == str(version_dir.resolve())
    current = json.loads((tmp_path / "weights" / "current.json").read_text())
    assert current["version"] == 3 and current["model"] == "policy"


def test_publisher_retries_reports_and_never_records_a_partial_publish(tmp_path):
    tcfg = TrainerConfig(mode="full", publish_attempts=3, publish_timeout_s=5)
    version_dir = tmp_path / "weights" / "v1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.safetensors").write_bytes(b"x")
    with FakeOpenAIServer() as up:
        down = EndpointConfig(name="down", base_url=f"http://127.0.0.1:{_free_port()}",
                              request_timeout_s=2, weight_swap={"type": "vllm-reload"})
        ok = EndpointConfig(name="up", base_url=up.base_url, weight_swap={"type": "vllm-reload"})
        with Publisher(_cfg(tmp_path, ok, down), tcfg) as pub, capture_logs() as logs:
            with pytest.raises(PublishError, match="down") as exc:
                pub.publish(1, version_dir)
    assert set(exc.value.failures) == {"down"}
    attempts = [e for e in logs if e["event"] == "publish_attempt_failed"]
    assert [e["attempt"] for e in attempts] == [1, 2, 3]
    assert all(e["endpoint"] == "down" for e in attempts)
    assert up.state.weight_version == "1"  # the healthy one was updated...
    assert current_version(tmp_path) == 0  # ...but the daemon is not told


@pytest.mark.parametrize("swap", ["vllm-lora", "vllm-reload"])
def test_a_restarted_server_gets_the_published_version_back(tmp_path, swap):
    """vLLM killed and started again serves the base weights and no adapters: the trainer's
    periodic check (`restore_lost`) pushes its current version into it again, and leaves a
    server that still serves it alone."""
    tcfg = TrainerConfig(mode="lora" if swap == "vllm-lora" else "full", publish_attempts=1)
    version_dir = tmp_path / "weights" / "v2"
    version_dir.mkdir(parents=True)
    (version_dir / "adapter_config.json").write_text("{}")
    (version_dir / "model.safetensors").write_bytes(b"not read by the fake")
    with FakeOpenAIServer() as server:
        ep = EndpointConfig(name="cpu", base_url=server.base_url, weight_swap={"type": swap})
        with Publisher(_cfg(tmp_path, ep), tcfg) as pub:
            pub.publish(2, version_dir)
            calls = len(server.state.calls)
            assert pub.restore_lost(2) == []  # served: nothing pushed
            assert len(server.state.calls) == calls
            server.stop()
            server.start(fresh=True)  # the restart: no adapter, no weight version
            assert server.state.adapters == {} and server.state.weight_version is None
            with capture_logs() as logs:
                assert pub.restore_lost(2) == ["cpu"]
            assert pub.restore_lost(2) == []
    assert server.state.weight_version == "2"
    if swap == "vllm-lora":
        assert list(server.state.adapters) == ["policy-v2"]
    else:
        assert server.state.weights_path == str(version_dir.resolve())
    assert [e["event"] for e in logs if e["log_level"] != "debug"][:1] == ["endpoint_lost_version"]
    assert current_version(tmp_path) == 2


def test_master_address_port_range_and_version_checks(monkeypatch):
    from trainer import nccl_transfer as nt

    # A server on another host and a hostname that resolves to loopback (Debian's 127.0.1.1):
    # the workers would dial themselves. Refused, naming the field to set.
    monkeypatch.setattr(nt.socket, "gethostbyname", lambda _h: "127.0.1.1")
    with pytest.raises(nt.NcclTransferError, match="set weight_swap.master_address"):
        nt.resolve_master_address(None, "gpu1", "http://10.0.0.7:8000")
    assert nt.resolve_master_address(None, "local", "http://127.0.0.1:8000") == "127.0.1.1"
    assert nt.resolve_master_address("10.0.0.2", "gpu1", "http://10.0.0.7:8000") == "10.0.0.2"
    # Ports: within the configured range, skipping taken ones.
    lo = _free_port()
    assert nt.pick_port("127.0.0.1", (lo, lo)) == lo
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", lo))
        with pytest.raises(nt.NcclTransferError, match="no free port in weight_swap.port_range"):
            nt.pick_port("127.0.0.1", (lo, lo))
    # One vLLM on both sides of the wire.
    nt.check_vllm_version("0.32.0", "gpu0", trainer="0.32.0+cu128")
    with pytest.raises(nt.NcclTransferError, match="runs vLLM 0.34.0 but the trainer has vLLM "
                       "0.32.0"):
        nt.check_vllm_version("0.34.0", "gpu0", trainer="0.32.0")
    with pytest.raises(ValueError, match="port_range"):
        VllmNcclSwap(port_range=(30000, 20000))


def test_publisher_refuses_a_server_on_another_vllm_version(tmp_path):
    """The start-up check reads each vllm-nccl server's /version (vLLM's own route, via the
    capability probe) and refuses a mismatch in one line, before any publish."""
    from trainer.nccl_transfer import NcclTransferError, check_vllm_version

    with FakeOpenAIServer(FakeState(nccl_world_size=1)) as gpu:
        app_routes = gpu.state  # the fake answers GET /version as vLLM does
        cfg = _cfg(tmp_path, _endpoint(gpu))
        tcfg = TrainerConfig(mode="full")
        gpu.state.version = "0.34.0"
        with pytest.raises(NcclTransferError, match="endpoint 'gpu' runs vLLM 0.34.0 but the "
                           "trainer has vLLM 0.32.0"):
            with Publisher(cfg, tcfg, transfers=lambda e: FakeTransfer(app_routes),
                           server_version_check=lambda v, name: check_vllm_version(
                               v, name, trainer="0.32.0")):
                pass
        gpu.state.version = "0.32.0"
        with Publisher(cfg, tcfg, transfers=lambda e: FakeTransfer(app_routes),
                       server_version_check=lambda v, name: check_vllm_version(
                           v, name, trainer="0.32.0")) as pub:
            assert list(pub.transfers) == ["gpu"]


def test_inference_script_starts_nccl_servers_with_weight_transfer(tmp_path, checkpoint):
    """scripts/inference.sh passes --weight-transfer-config for a vllm-nccl endpoint (vLLM
    answers /init_weight_transfer_engine with 500 "not configured" without it), and not for
    others. A stub interpreter prints the command line instead of starting vLLM."""
    import os
    import subprocess

    from spade_async.inference.launch import REPO

    stub = tmp_path / "python"
    stub.write_text("#!/bin/sh\necho \"$@\"\n")
    stub.chmod(0o755)
    out = {}
    for cfg in ("gpu-node.toml", "embedded.toml", "experiment.toml"):
        env = dict(os.environ, SPADE_CONFIG=f"configs/{cfg}", SPADE_VLLM_PYTHON=str(stub),
                   SPADE_VLLM_DEVICE="gpu", SPADE_MODEL_DIR=str(checkpoint))
        proc = subprocess.run(["bash", "scripts/inference.sh"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        out[cfg] = proc.stdout
    assert '--weight-transfer-config {"backend": "nccl"}' in out["gpu-node.toml"]
    assert "--weight-transfer-config" not in out["embedded.toml"]
    # the embedded default publishes by full reload (LoRA merged): no LoRA layers to slow decode
    assert "--enable-lora" not in out["embedded.toml"]
    assert "--enable-lora" in out["experiment.toml"]


def test_restore_lost_pushes_into_a_server_held_paused_by_a_partial_update(tmp_path):
    """A failed broadcast leaves the server paused on mixed weights while its weight_version
    still names the last good version: the trainer's periodic check pushes that version
    again (it does not wait for the next training step) and the server resumes."""
    tcfg = TrainerConfig(mode="full", publish_attempts=1)
    v1 = tmp_path / "weights" / "v1"
    v1.mkdir(parents=True)
    (v1 / "model.safetensors").write_bytes(b"x")
    state = FakeState(nccl_world_size=1, nccl_wait_s=1.0)
    with FakeOpenAIServer(state) as gpu:
        transfer = FakeTransfer(state)
        with Publisher(_cfg(tmp_path, _endpoint(gpu)), tcfg, transfers=lambda e: transfer) as pub:
            pub.publish(1, v1)
            transfer.corrupt = True
            v2 = tmp_path / "weights" / "v2"
            v2.mkdir()
            (v2 / "model.safetensors").write_bytes(b"x")
            with pytest.raises(PublishError):
                pub.publish(2, v2)
            assert state.paused and state.weight_version == "1"
            transfer.corrupt = False
            assert pub.restore_lost(1) == ["gpu"]
    assert not state.paused and state.weight_version == "1"
    assert current_version(tmp_path) == 1
