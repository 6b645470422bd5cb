"""The vllm-nccl backend's request sequence against the fake server (no GPU here), and the
publisher's retries, reports and current.json against fake endpoints."""

from __future__ import annotations

import json
import time

import pytest
from structlog.testing import capture_logs

from spade_async.config import EndpointConfig, PoolConfig, SpadeConfig, VllmNcclSwap
from spade_async.endpoints.pool import EndpointPool
from spade_async.endpoints.swap import NcclSwapper, SwapError, make_swapper
from spade_async.testing.fake_openai import FakeOpenAIServer, FakeState, _free_port
from trainer.config import TrainerConfig
from trainer.publish import Publisher, PublishError, read_current

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


async def test_nccl_failed_update_tears_down_resumes_and_reconnects_next_time(tmp_path):
    with FakeOpenAIServer(FakeState(nccl_world_size=1, nccl_wait_s=1.0)) as server:
        async with EndpointPool([_endpoint(server)], POOL) as pool:
            swapper = make_swapper(pool, "gpu", "policy")
            transfer = FakeTransfer(server.state)
            swapper.attach(transfer)
            transfer.corrupt = True
            with pytest.raises(SwapError, match="does not match update_info"):
                await swapper.swap(1, tmp_path)
            assert not swapper.connected and not server.state.paused
            assert "close" in transfer.events
            assert server.state.weight_version is None
            transfer.corrupt = False
            await swapper.swap(2, tmp_path)
    log = server.state.request_log
    failed = log.index("POST /shutdown_weight_transfer_engine")
    assert log[:failed] == ["GET /get_world_size?include_dp=true", "POST /init_weight_transfer_engine",
                            *ONE_UPDATE[:3], "POST /resume"]
    # the next version sets the group up again before updating
    assert log[failed + 1:] == ["GET /get_world_size?include_dp=true", "POST /init_weight_transfer_engine",
                                *ONE_UPDATE]
    assert server.state.weight_version == "2"


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
        with Publisher(cfg, tcfg, transfer=FakeTransfer(gpu.state)) as pub:
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
    assert read_current(tmp_path / "weights") == 0  # ...but the daemon is not told


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
    assert read_current(tmp_path / "weights") == 2
