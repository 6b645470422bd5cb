"""Regret, rewards and advantages (DESIGN §6), as plain functions over numbers.

Per environment: R_u, R_h are the mean scores of its K_u unhinted and K_h hinted episodes;
regret = max(0, R_h - R_u). An environment whose R_h stays below the feasibility threshold is
infeasible: its designer gets no positive reward. Designer rewards (regret, or a penalty for an
invalid or duplicate design) are normalised over the G designs drawn from one document; agent
rewards (episode scores) over the K_u unhinted episodes of one environment. A group with zero
variance carries no gradient and is dropped (and counted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from spade_async.core.config import RegretConfig


class DesignStatus(StrEnum):
    ACCEPTED = "accepted"
    INVALID = "invalid"      # no code, or failed validation
    DUPLICATE = "duplicate"  # rejected by the novelty filter


@dataclass(frozen=True)
class EnvRegret:
    r_unhinted: float
    r_hinted: float
    regret: float
    feasible: bool
    designer_reward: float
    learnability: float  # p(1 - p) of the unhinted solve rate
    signal: str = "hint_gap"  # what designer_reward pays (RegretConfig.signal)
    # the share of hinted episodes won by copying the hint (mean of Episode.hint_copy);
    # designer_reward is already discounted by (1 - hint_leak)
    hint_leak: float = 0.0
    leak_flagged: bool = False  # hint_leak >= RegretConfig.leak_threshold
    leak_reason: str = ""  # how hinted play was judged to copy the hint ("" when it was not)

    def as_dict(self) -> dict[str, float | bool]:
        return dict(self.__dict__)


def _mean(xs: list[float]) -> float:
    if not xs:
        raise ValueError("no episode scores")
    return math.fsum(xs) / len(xs)


def env_regret(unhinted: list[float], hinted: list[float], cfg: RegretConfig,
               hint_copies: list[float] | None = None, leak_reason: str = "") -> EnvRegret:
    """Both targeting signals, whichever pays: the hint gap (regret, gated by feasibility) and
    learnability p(1 - p), scaled by 4 into [0, 1] when it is the reward so the two compare.
    `hint_copies` (one per hinted episode, Episode.hint_copy): how far hinted play won by
    copying the hint; their mean discounts the designer's reward, whatever the signal, and
    flags the environment at `cfg.leak_threshold`."""
    r_u, r_h = _mean(unhinted), _mean(hinted)
    regret = max(0.0, r_h - r_u)
    feasible = r_h >= cfg.feasibility_threshold
    solved = _mean([1.0 if s >= 1.0 else 0.0 for s in unhinted])
    learnability = solved * (1.0 - solved)
    gap = regret if feasible else 0.0
    reward = {"hint_gap": gap, "learnability": 4.0 * learnability,
              "both": 0.5 * (gap + 4.0 * learnability)}[cfg.signal]
    leak = _mean(hint_copies) if hint_copies else 0.0
    if not 0.0 <= leak <= 1.0:
        raise ValueError(f"hint copy scores must lie in [0, 1], got mean {leak}")
    return EnvRegret(r_u, r_h, regret, feasible, reward * (1.0 - leak), learnability,
                     cfg.signal, leak, leak >= cfg.leak_threshold, leak_reason if leak else "")


def unreached_wins(unhinted: list[float], hinted: list[tuple[float, list[str]]],
                   cfg: RegretConfig) -> tuple[list[float], str]:
    """Hinted wins out of the unhinted group's reach (DESIGN §6, play-time leaks beyond
    verbatim copies): when no unhinted episode solved the task and at least
    `cfg.unreached_min_hinted` of the hinted ones did, each hinted win whose every reply has
    at most `cfg.unreached_bare_words` words (an answer, no reasoning) scores 1 as a copy, else
    0. `hinted`: (score, actions) per hinted episode. Returns the scores, in order, and the
    reason ("" when none is flagged)."""
    none = [0.0] * len(hinted)
    words = cfg.unreached_bare_words
    if not words or not hinted or not unhinted or any(s >= 1.0 for s in unhinted):
        return none, ""
    wins = [s >= 1.0 for s, _ in hinted]
    if sum(wins) / len(hinted) < cfg.unreached_min_hinted:
        return none, ""
    bare = [float(won and bool(actions) and all(len(a.split()) <= words for a in actions))
            for won, (_, actions) in zip(wins, hinted, strict=True)]
    if not any(bare):
        return none, ""
    return bare, (f"unreached: {sum(wins)} of {len(hinted)} hinted episodes solved it, "
                  f"{int(sum(bare))} with bare replies (<= {words} words each), against 0 of "
                  f"{len(unhinted)} unhinted")


def design_reward(status: DesignStatus, regret: EnvRegret | None, cfg: RegretConfig,
                  checks_passed: float = 0.0) -> float:
    """`checks_passed`: share of validation checks an invalid design passed (0 without code)."""
    if status is DesignStatus.INVALID:
        if cfg.invalid_partial_credit:
            return cfg.invalid_penalty * (1.0 - checks_passed)
        return cfg.invalid_penalty
    if status is DesignStatus.DUPLICATE:
        return cfg.duplicate_penalty
    if regret is None:
        raise ValueError("an accepted design needs its environment's regret")
    return regret.designer_reward


def group_advantages(rewards: list[float], eps: float) -> list[float] | None:
    """(r - mean) / (std + eps) over one group; None when the group has zero variance."""
    if len(rewards) < 2:
        return None
    mean = math.fsum(rewards) / len(rewards)
    var = math.fsum((r - mean) ** 2 for r in rewards) / len(rewards)
    if var <= 1e-12:
        return None
    std = math.sqrt(var)
    return [(r - mean) / (std + eps) for r in rewards]
