"""A SPADE environment as a `gymnasium.Env` with text spaces, running in the real sandbox.

The environment's code never runs in this process: a background thread holds an anyio event
loop (a blocking portal) with a one-slot `Sandbox`, and every gymnasium call is forwarded to the
sandboxed session. Observations longer than `max_obs_chars` are cut; the action space samples
plain text (tool calls are the canonical JSON text of `contract.tool_call_action`). gymnasium's
reset `options` carry the environment's difficulty knobs. `max_turns` is enforced here, as
gymnasium's TimeLimit wrapper does and the episode runner does in play: the step that uses the
last turn is truncated if the environment did not end the episode itself.
"""

from __future__ import annotations

import queue
import string
import threading
from typing import Any

import anyio
import gymnasium as gym
from anyio.from_thread import BlockingPortal
from gymnasium import spaces

from spade_async.core.config import SandboxConfig
from spade_async.sandbox.runtime import Sandbox
from spade_async.sandbox.session import EnvSession

# Text spaces need an explicit alphabet: printable ASCII plus the Latin-1 and general
# punctuation ranges environments actually print. Other characters are shown as U+FFFD.
CHARSET = frozenset(string.printable) | frozenset(map(chr, range(0xA0, 0x180))) | frozenset(
    map(chr, range(0x2010, 0x2070))) | {"\ufffd"}


GYM_ID = "spade/Sandboxed-v0"


def _start_portal() -> tuple[BlockingPortal, threading.Thread]:
    """An event loop in a daemon thread: a forgotten close() cannot hang interpreter exit."""
    ready: queue.Queue[BlockingPortal] = queue.Queue()

    async def loop() -> None:
        async with BlockingPortal() as portal:
            ready.put(portal)
            await portal.sleep_until_stopped()

    thread = threading.Thread(target=anyio.run, args=(loop,), daemon=True, name="spade-gym")
    thread.start()
    return ready.get(timeout=30), thread


def register() -> str:
    """Register the adapter with gymnasium: `gymnasium.make(GYM_ID, code=...)`."""
    if GYM_ID not in gym.registry:
        gym.register(GYM_ID, entry_point="spade_async.envs.gym_adapter:SpadeGymEnv")
    return GYM_ID


class SpadeGymEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, code: str, sandbox: SandboxConfig | None = None, *,
                 max_obs_chars: int = 16_384, max_action_chars: int = 1024) -> None:
        cfg = (sandbox or SandboxConfig()).model_copy(update={"slots": 1, "warm_workers": 0})
        self._closed = False
        self._portal, self._thread = _start_portal()
        self._sandbox_cm = Sandbox(cfg)
        try:
            sb = self._portal.call(self._sandbox_cm.__aenter__)
            self._session_cm = sb.open(code)
            self._session: EnvSession = self._portal.call(self._session_cm.__aenter__)
        except BaseException:
            self.close()
            raise
        self.meta = self._session.meta
        self._turns = 0
        self.max_obs_chars = max_obs_chars
        self.observation_space = spaces.Text(max_length=max_obs_chars, charset=CHARSET)
        self.action_space = spaces.Text(max_length=max_action_chars, charset=string.printable)

    def _text(self, s: str) -> str:
        return "".join(c if c in CHARSET else "\ufffd" for c in s[: self.max_obs_chars])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """`options` are the environment's knobs (`Environment.params`): missing ones take their
        defaults, a bad one raises `ContractError` (a ValueError) naming it."""
        super().reset(seed=seed)
        episode_seed = int(self.np_random.integers(0, 2**31 - 1))
        res = self._portal.call(self._session.reset, episode_seed, options)
        self._turns = 0
        return self._text(res.observation), dict(res.info, episode_seed=episode_seed)

    def step(self, action: str):
        res = self._portal.call(self._session.step, str(action))
        self._turns += 1
        truncated = res.truncated or (not res.terminated and self._turns >= self.meta.max_turns)
        return self._text(res.observation), res.reward, res.terminated, truncated, res.info

    def hint(self) -> str:
        return self._portal.call(self._session.hint)

    def solution(self) -> list[str]:
        """The environment's `solution()` actions (a SandboxError when it has none)."""
        return self._portal.call(self._session.solution)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if hasattr(self, "_session"):
                self._portal.call(self._session_cm.__aexit__, None, None, None)
            self._portal.call(self._sandbox_cm.__aexit__, None, None, None)
        finally:
            self._portal.call(self._portal.stop)
            self._thread.join(timeout=10)
