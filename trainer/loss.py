"""The policy-gradient loss and its metrics: one linear function, read top to bottom.

Inputs are flat over the tokens being trained (loss-mask 1) of one micro-batch; the caller
divides by the token count of the whole optimizer step (all micro-batches, all ranks), so the
result is a token-level mean that does not depend on how tokens were split across ranks.
What it must never do: touch the model, the data loader or torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Metric sums that add up over micro-batches and ranks, then become means over `tokens`.
SUM_KEYS = ("tokens", "loss", "pg_loss", "kl", "clipped", "ratio", "entropy", "staleness",
            "logprob_diff", "logprob_abs_diff", "weight", "edit_tokens",
            "edit_logprob_abs_diff")
MIN_KEYS = ("ratio_min",)
MAX_KEYS = ("ratio_max", "staleness_max", "logprob_abs_diff_max")


@dataclass(frozen=True)
class LossConfig:
    clip_eps_low: float
    clip_eps_high: float
    kl_coef: float


def policy_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    staleness: torch.Tensor,
    entropy: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    *,
    normaliser: float | torch.Tensor,
    cfg: LossConfig,
    edit: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-level clipped policy gradient (PPO surrogate against the behaviour policy).

    logprobs            [N] log pi_theta(token | prefix) from the trainer, with grad
    behaviour_logprobs  [N] log mu(token | prefix) the server reported when it sampled the token
    advantages          [N] the sample's advantage, repeated over its tokens
    weights             [N] the sample's role weight (designer or agent)
    staleness           [N] published versions between the sampling policy and ours (metrics)
    entropy             [N] entropy of pi_theta at each position (no grad; metrics)
    ref_logprobs        [N] log pi_ref (the base model), or None when kl_coef is 0
    normaliser          what each token's weighted loss is divided by: the trained tokens of
                        the whole optimizer step, or per token [N] its role's share of them
                        (trainer/step.py: each role's token mean, weighted by role)
    edit                [N] bool: the token belongs to an edit-move sample (metrics: its own
                        train/inference mismatch, scored under the choice constraint)
    Returns the loss to back-propagate (already / normaliser) and metric sums (no grad).
    """
    # 1. Importance ratio pi_theta / mu per token. The samples were drawn by the inference
    #    server with an older policy (async RL), so this corrects for the lag and for the
    #    numerical mismatch between the server's kernels and ours.
    log_ratio = logprobs - behaviour_logprobs
    ratio = torch.exp(log_ratio)

    # 2. PPO's pessimistic surrogate: the ratio may move the objective only inside
    #    [1 - eps_low, 1 + eps_high]; outside, the clipped branch is the min and has no gradient.
    clipped_ratio = torch.clamp(ratio, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)
    pg_per_token = -torch.minimum(ratio * advantages, clipped_ratio * advantages)

    # 3. Optional KL to the reference model, the k3 estimator exp(d) - d - 1 with
    #    d = log pi_ref - log pi_theta: non-negative, unbiased under pi_theta, low variance.
    if ref_logprobs is not None and cfg.kl_coef > 0:
        d = ref_logprobs - logprobs
        kl_per_token = torch.exp(d) - d - 1.0
    else:
        kl_per_token = torch.zeros_like(logprobs)

    # 4. Role weights scale each token's contribution; the sum is divided by the step's token
    #    count, or per token by its role's (the caller's choice), never by the weight sum, so
    #    down-weighting a role really lowers its share.
    per_token = (pg_per_token + cfg.kl_coef * kl_per_token) * weights
    loss = (per_token / normaliser).sum()

    # 5. Metrics, as sums over this micro-batch's tokens (means are taken after reduction).
    #    A token counts as clipped when the clipped branch is the active one (its gradient is
    #    zero): ratio above 1 + eps_high with A > 0, or below 1 - eps_low with A < 0.
    with torch.no_grad():
        clipped = ((ratio > 1.0 + cfg.clip_eps_high) & (advantages > 0)) | (
            (ratio < 1.0 - cfg.clip_eps_low) & (advantages < 0)
        )
        abs_diff = log_ratio.abs()
        edit_mask = edit if edit is not None and edit.numel() else torch.zeros_like(
            abs_diff, dtype=torch.bool)
        n = logprobs.numel()
        empty = n == 0
        metrics = {
            "tokens": torch.tensor(float(n)),
            "loss": per_token.detach().sum(),
            "pg_loss": (pg_per_token * weights).detach().sum(),
            "kl": kl_per_token.detach().sum(),
            "clipped": clipped.sum().float(),
            "ratio": ratio.detach().sum(),
            "entropy": entropy.detach().float().sum(),
            "staleness": staleness.float().sum(),
            # train/inference mismatch: log pi_theta - log mu (its mean is a k1 KL estimate)
            "logprob_diff": log_ratio.detach().sum(),
            "logprob_abs_diff": abs_diff.detach().sum(),
            "weight": weights.sum(),
            "edit_tokens": edit_mask.sum().float(),
            "edit_logprob_abs_diff": abs_diff.detach()[edit_mask].sum(),
            "ratio_min": ratio.detach().min() if not empty else torch.tensor(float("inf")),
            "ratio_max": ratio.detach().max() if not empty else torch.tensor(float("-inf")),
            "staleness_max": staleness.float().max() if not empty else torch.tensor(0.0),
            "logprob_abs_diff_max": abs_diff.detach().max() if not empty else torch.tensor(0.0),
        }
    return loss, {k: v.detach().float().cpu() for k, v in metrics.items()}


@dataclass
class StepMetrics:
    """Accumulates `policy_loss` metric sums over micro-batches (and ranks, via `vectors`)."""

    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SUM_KEYS, 0.0))
    mins: dict[str, float] = field(default_factory=lambda: dict.fromkeys(MIN_KEYS, float("inf")))
    maxs: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(MAX_KEYS, float("-inf")))

    def add(self, m: dict[str, torch.Tensor]) -> None:
        for k in SUM_KEYS:
            self.sums[k] += float(m[k])
        for k in MIN_KEYS:
            self.mins[k] = min(self.mins[k], float(m[k]))
        for k in MAX_KEYS:
            self.maxs[k] = max(self.maxs[k], float(m[k]))

    def vectors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(sums, maxima) as float64 tensors; minima travel negated among the maxima."""
        sums = torch.tensor([self.sums[k] for k in SUM_KEYS], dtype=torch.float64)
        maxs = torch.tensor([-self.mins[k] for k in MIN_KEYS] + [self.maxs[k] for k in MAX_KEYS],
                            dtype=torch.float64)
        return sums, maxs

    @classmethod
    def from_vectors(cls, sums: torch.Tensor, maxs: torch.Tensor) -> StepMetrics:
        out = cls()
        out.sums = {k: float(v) for k, v in zip(SUM_KEYS, sums.tolist(), strict=True)}
        values = maxs.tolist()
        out.mins = {k: -float(v) for k, v in zip(MIN_KEYS, values[: len(MIN_KEYS)], strict=True)}
        out.maxs = {k: float(v) for k, v in zip(MAX_KEYS, values[len(MIN_KEYS):], strict=True)}
        return out

    def summary(self) -> dict[str, float]:
        n = max(self.sums["tokens"], 1.0)
        return {
            "tokens": int(self.sums["tokens"]),
            "loss": self.sums["loss"] / n,
            "pg_loss": self.sums["pg_loss"] / n,
            "kl": self.sums["kl"] / n,
            "clip_fraction": self.sums["clipped"] / n,
            "ratio_mean": self.sums["ratio"] / n,
            "ratio_min": self.mins["ratio_min"],
            "ratio_max": self.maxs["ratio_max"],
            "entropy": self.sums["entropy"] / n,
            "staleness_mean": self.sums["staleness"] / n,
            "staleness_max": self.maxs["staleness_max"],
            "logprob_diff_mean": self.sums["logprob_diff"] / n,
            "logprob_abs_diff_mean": self.sums["logprob_abs_diff"] / n,
            "logprob_abs_diff_max": self.maxs["logprob_abs_diff_max"],
            # the edit move's tokens alone (scored under their choice constraint): None
            # when the step had none
            "edit_tokens": int(self.sums["edit_tokens"]),
            "edit_logprob_abs_diff_mean": (self.sums["edit_logprob_abs_diff"]
                                           / self.sums["edit_tokens"]
                                           if self.sums["edit_tokens"] else None),
        }
