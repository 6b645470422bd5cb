"""gymnasium's own environment checker, through the adapter, on a sandboxed environment."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from test_validate import GOOD, SEED_FILES

from spade_async.envs.gym_adapter import register


def test_check_env_passes_through_gym_make():
    env = gym.make(register(), code=GOOD)
    try:
        check_env(env.unwrapped)
        obs, info = env.reset(seed=7)
        again, _ = env.reset(seed=7)
        assert obs == again and isinstance(info["episode_seed"], int)
        _, reward, terminated, truncated, _ = env.step(env.unwrapped.solution()[0])
        assert (reward, terminated, truncated) == (1.0, True, False)
    finally:
        env.close()


@pytest.mark.parametrize("path", [p for p in SEED_FILES if p.stem in {
    "mastermind", "kv_store", "file_system", "number_guess"}] or SEED_FILES[:3],
    ids=lambda p: p.stem)
def test_check_env_passes_on_seed_environments(path):
    env = gym.make(register(), code=path.read_text())
    try:
        check_env(env.unwrapped)
    finally:
        env.close()
