"""How the agent plays an environment and how its episodes become rewards and advantages."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from spade_async.core.strict import Strict


class RolloutConfig(Strict):
    """How the agent plays: sampling, lengths, and episodes per environment (DESIGN §6)."""

    k_unhinted: int = Field(4, ge=1, description="K_u: unhinted episodes per environment")
    k_hinted: int = Field(2, ge=1, description="K_h: hinted episodes per environment")
    max_tokens_per_turn: int = Field(256, ge=1, description="completion budget of one agent turn")
    max_seq_len: int = Field(4096, ge=256, description="prompt + all turns; beyond it the "
                             "episode is truncated (keep <= the server's --max-model-len)")
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    request_deadline_s: float | None = Field(
        None, gt=0, description="one model request (a turn or a design), retries included. "
        "None: bounded by pool.max_attempts attempts, each timed to fit its tokens and the "
        "endpoint's measured speed (so a slow CPU server is not failed for being slow)")
    episode_attempts: int = Field(
        2, ge=1, description="tries of an episode that failed on the endpoint (timeout, 5xx, "
        "malformed answer) or because no sandbox worker started; an outage (no endpoint up, "
        "connection refused, model not served) is waited out instead and uses none of them. "
        "A failed episode is never a score")
    episode_deadline_s: float | None = Field(
        None, gt=0, description="a whole episode. None: bounded by max_turns turns, each "
        "bounded by its request and the sandbox's call_timeout_s")


class RegretConfig(Strict):
    """Regret, rewards and advantages (DESIGN §6); every choice is logged per environment."""

    feasibility_threshold: float = Field(0.2, ge=0, le=1, description="an env whose hinted mean "
                                         "R_h stays below this is infeasible: designer reward 0")
    invalid_penalty: float = Field(-1.0, le=0, description="designer reward of a design that "
                                   "fails validation or yields no code")
    duplicate_penalty: float = Field(-0.5, le=0, description="designer reward of a near-duplicate")
    invalid_partial_credit: bool = Field(False, description="scale the invalid penalty by the "
                                         "share of validation checks that failed, so a weak "
                                         "designer still sees a gradient toward valid code")
    train_on_hinted: bool = Field(False, description="also train the agent on hinted episodes")
    signal: Literal["hint_gap", "learnability", "both"] = Field(
        "hint_gap", description="what pays the designer for an accepted environment (both are "
        "recorded for every play): hint_gap, SPADE's regret max(0, R_h - R_u) behind the "
        "feasibility gate; learnability, 4 p(1 - p) of the unhinted solve rate p (as 'No "
        "Regrets' recommends for binary outcomes; a small model can do worse with a hint, "
        "which makes the hint gap 0); both, their mean")
    advantage_eps: float = Field(1e-6, gt=0, description="added to the std when normalising")
    leak_threshold: float = Field(0.5, gt=0, le=1, description="a play whose hinted episodes won "
                                  "by copying the hint this often (hint_leak) flags its "
                                  "environment; the designer's reward is discounted by "
                                  "(1 - hint_leak) in any case")
    unreached_bare_words: int = Field(
        4, ge=0, description="play-time leak beyond copies: when no unhinted episode of a play "
        "solved it and at least `unreached_min_hinted` of the hinted ones did, a hinted win "
        "whose every reply is this many words or fewer (an answer with no reasoning, out of "
        "the unhinted group's reach) counts as a copy of the hint, with its reason recorded "
        "(`leak_reason`). 0: off")
    unreached_min_hinted: float = Field(1.0, gt=0, le=1, description="the hinted solve rate "
                                        "from which bare hinted wins count as copies (above)")
