"""`FakeOpenAIServer`: the fake on 127.0.0.1 in a background thread of the test's own process,
started and stopped (a crash and a restart on the same port) by the test."""

from __future__ import annotations

import threading
import time

import uvicorn

from spade_async.inference.launch import free_port
from spade_async.testing.fake.app import build_app
from spade_async.testing.fake.state import FakeState


class FakeOpenAIServer:
    """A fake server on 127.0.0.1 in a background thread; `stop()`/`start()` emulate a crash and
    a restart on the same port. The state survives a restart unless `fresh=True`."""

    def __init__(self, state: FakeState | None = None, port: int = 0) -> None:
        self.state = state or FakeState()
        self.port = port or free_port()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, fresh: bool = False) -> FakeOpenAIServer:
        if fresh:
            self.state = FakeState(base_model=self.state.base_model)
        config = uvicorn.Config(
            build_app(self.state), host="127.0.0.1", port=self.port, log_level="error",
            lifespan="off", access_log=False,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=f"fake-openai-{self.port}",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"fake OpenAI server did not start on port {self.port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
