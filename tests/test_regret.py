"""Regret and advantage arithmetic against values computed by hand."""

from __future__ import annotations

import math

import pytest

from spade_async.core.config import RegretConfig
from spade_async.reward.regret import DesignStatus, design_reward, env_regret, group_advantages

CFG = RegretConfig(feasibility_threshold=0.2, invalid_penalty=-1.0, duplicate_penalty=-0.5)


def test_regret_is_hinted_minus_unhinted_clipped_at_zero():
    r = env_regret([0.0, 1.0, 0.0, 0.0], [1.0, 0.5], CFG)
    assert (r.r_unhinted, r.r_hinted, r.regret, r.feasible) == (0.25, 0.75, 0.5, True)
    assert r.designer_reward == 0.5
    assert r.learnability == pytest.approx(0.25 * 0.75)
    assert env_regret([1.0, 1.0], [0.5, 0.5], CFG).regret == 0.0


def test_infeasible_env_gives_no_positive_designer_reward():
    r = env_regret([0.0, 0.0], [0.1, 0.2], CFG)
    assert r.regret == pytest.approx(0.15) and not r.feasible and r.designer_reward == 0.0


def test_design_rewards_by_status():
    r = env_regret([0.0], [1.0], CFG)
    assert design_reward(DesignStatus.ACCEPTED, r, CFG) == 1.0
    assert design_reward(DesignStatus.INVALID, None, CFG) == -1.0
    assert design_reward(DesignStatus.DUPLICATE, None, CFG) == -0.5


def test_group_advantages_normalise_and_drop_zero_variance():
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], 1e-6)
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert group_advantages([0.5, 0.5, 0.5], 1e-6) is None
    assert group_advantages([1.0], 1e-6) is None
    adv = group_advantages([0.5, -1.0, -0.5], 1e-6)  # G designs of one document
    mean, std = -1 / 3, math.sqrt(((0.5 + 1 / 3) ** 2 + (-1 + 1 / 3) ** 2 + (-0.5 + 1 / 3) ** 2) / 3)
    assert adv == pytest.approx([(x - mean) / std for x in (0.5, -1.0, -0.5)], rel=1e-5)


def test_partial_credit_scales_the_invalid_penalty():
    cfg = CFG.model_copy(update={"invalid_partial_credit": True})
    assert design_reward(DesignStatus.INVALID, None, cfg, checks_passed=0.75) == -0.25
    assert design_reward(DesignStatus.INVALID, None, cfg) == -1.0
    assert design_reward(DesignStatus.INVALID, None, CFG, checks_passed=0.75) == -1.0
