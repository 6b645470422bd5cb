"""One optimizer step on a list of samples: packed into rows (trainer/pack.py) -> split across
ranks -> micro-batches -> forward/backward (gradient sync on the last micro-batch only) -> clip
-> AdamW step, and the step's metrics reduced over ranks. The model, its KL reference, the
optimizer and the learning-rate schedule live here; the loop (trainer/loop.py) and the
benchmark (spade bench trainer) share it.

The loss is each role's token mean, weighted by role (`agent_weight`, `designer_weight`) and
divided by the weights present: a step of designs (768 sampled tokens each) beside answers (a
few dozen) no longer hands the designer most of the gradient.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from spade_async.core.config.trainer import TrainerConfig
from trainer.data import MicroBatch, TrainSample, collate, micro_batches, split_across_ranks
from trainer.loss import LossConfig, StepMetrics, policy_loss
from trainer.model import load_policy, resolve_precision
from trainer.pack import Row, collate_rows, pack_rows, row_micro_batches, split_rows_across_ranks
from trainer.parallel import Dist, all_reduce_, clip_grad_norm, grad_sync, wrap


def role_normalisers(samples: list[TrainSample], role_weights: dict[str, float],
                     ) -> dict[str, float]:
    """What a token's weighted loss is divided by, per role: the role's trained tokens in the
    whole step times the sum of the weights of the roles present, so the loss is the
    role-weighted mean of each role's token mean."""
    tokens: dict[str, int] = {}
    for s in samples:
        tokens[s.role] = tokens.get(s.role, 0) + s.trained_tokens
    present = sum(role_weights.get(r, 0.0) for r, n in tokens.items() if n) or 1.0
    return {r: float(max(n, 1)) * present for r, n in tokens.items()}


@dataclass(frozen=True)
class StepResult:
    metrics: dict[str, float]
    samples: int
    padded_tokens: int
    micro_batches: int
    grad_norm: float
    lr: float
    seconds: float
    real_tokens: int = 0  # sequence tokens of the samples
    roles: dict[str, int] | None = None  # samples per role
    base: dict[str, float] | None = None  # kl_base, logprob_abs_diff_base (when measured)


class StepRunner:
    """Model, optimizer and loss for one optimizer step on a list of samples (the loop and the
    benchmark share it)."""

    def __init__(self, tcfg: TrainerConfig, d: Dist, base_dir: Path, *,
                 model_dtype: str = "auto") -> None:
        """`model_dtype`: the config's model.dtype, which the servers' dtype and so this
        runner's compute dtype follow (see `resolve_precision`)."""
        self.tcfg, self.d, self.base_dir = tcfg, d, base_dir
        self.precision = resolve_precision(tcfg.autocast_bf16, model_dtype, d.device.type,
                                           base_dir)
        bf16 = self.precision.autocast_bf16
        torch.manual_seed(tcfg.seed)
        kw: dict[str, Any] = {"mode": tcfg.mode, "lora_rank": tcfg.lora_rank,
                              "lora_alpha": tcfg.lora_alpha, "lora_dropout": tcfg.lora_dropout,
                              "lora_targets": tcfg.lora_targets,
                              "temperature": tcfg.logprob_temperature}
        policy = load_policy(base_dir, **kw).to(d.device)
        self.model = wrap(policy, tcfg.parallel, d, bf16=bf16)
        self.lora = tcfg.mode == "lora"
        # The KL reference: the adapter switched off (LoRA), or a frozen copy of the base.
        self.ref = None
        if tcfg.kl_coef > 0 and not self.lora:
            ref = load_policy(base_dir, **{**kw, "mode": "full"}, trainable=False).to(d.device)
            self.ref = wrap(ref, "fsdp2", d, bf16=bf16) \
                if tcfg.parallel == "fsdp2" else ref
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optim = torch.optim.AdamW(self.params, lr=tcfg.lr, betas=tcfg.adam_betas,
                                       eps=tcfg.adam_eps, weight_decay=tcfg.weight_decay)
        self.loss_cfg = LossConfig(tcfg.clip_eps_low, tcfg.clip_eps_high, tcfg.kl_coef)
        self.role_weights = {"agent": tcfg.agent_weight, "designer": tcfg.designer_weight}

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.precision.autocast_bf16 and self.tcfg.parallel == "ddp":
            return torch.autocast(self.d.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def lr_at(self, step: int) -> float:
        """Linear warm-up over `warmup_steps`, then constant, or cosine down to
        lr * min_lr_ratio over `lr_decay_steps` and constant at that floor."""
        t = self.tcfg
        if t.warmup_steps and step < t.warmup_steps:
            return t.lr * (step + 1) / t.warmup_steps
        if t.lr_schedule == "constant":
            return t.lr
        progress = min(1.0, (step - t.warmup_steps) / t.lr_decay_steps)
        floor = t.lr * t.min_lr_ratio
        return floor + (t.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def _plans(self, samples: list[TrainSample]) -> list[list[list[Row]]] | list[
            list[list[TrainSample]]]:
        """Per rank, its micro-batches: of packed rows, or of one padded row per sample."""
        d, t = self.d, self.tcfg
        if t.pack:
            rows = pack_rows(samples, row_tokens=t.row_tokens, min_prefix=t.shared_prefix_min)
            return [row_micro_batches(share, t.micro_batch_tokens)
                    for share in split_rows_across_ranks(rows, d.world_size)]
        return [micro_batches(share, t.micro_batch_tokens)
                for share in split_across_ranks(samples, d.world_size)]

    def step(self, samples: list[TrainSample], *, step_index: int,
             before_update: Callable[[], None] | None = None) -> StepResult:
        """One optimizer step on the whole (global) list; every rank passes the same list.
        `before_update` is called once the gradients are in, before the weights change (the
        trainer ends the window in which a stop may drop the step there)."""
        t0 = time.perf_counter()
        d = self.d
        plans = self._plans(samples)
        mine = plans[d.rank]
        # Same number of forwards on every rank (FSDP2 gathers in each); a rank short of work
        # runs empty micro-batches that add nothing to the gradient.
        n_micro = max(len(p) for p in plans)
        norm = role_normalisers(samples, self.role_weights)
        lr = self.lr_at(step_index)
        for group in self.optim.param_groups:
            group["lr"] = lr
        measure_base = bool(self.tcfg.kl_base_every_steps) and (
            step_index % self.tcfg.kl_base_every_steps == 0)
        base_sums = torch.zeros(3, dtype=torch.float64)  # tokens, k3 KL, |dlogp|
        self.optim.zero_grad(set_to_none=True)
        metrics = StepMetrics()
        padded = 0
        for i in range(n_micro):
            part = mine[i] if i < len(mine) else []
            mb = self._collate(part, norm).to(d.device)
            padded += mb.padded_tokens if part else 0
            inputs = mb.model_inputs()
            with grad_sync(self.model, enabled=i == n_micro - 1), self._autocast():
                ref_lp = None
                if self.loss_cfg.kl_coef > 0 or (measure_base and i == 0 and part):
                    ref_lp = self._base_logprobs(mb, inputs)
                logprobs, entropy = self.model(mb.input_ids, **inputs)
                if measure_base and i == 0 and part and ref_lp is not None:
                    with torch.no_grad():
                        diff = ref_lp - logprobs.detach()
                        base_sums += torch.tensor([
                            float(diff.numel()), float((torch.exp(diff) - diff - 1).sum()),
                            float(diff.abs().sum())], dtype=torch.float64)
                loss, m = policy_loss(logprobs, mb.behaviour_logprobs, mb.advantages,
                                      mb.weights, mb.staleness, entropy,
                                      ref_lp if self.loss_cfg.kl_coef > 0 else None,
                                      normaliser=mb.loss_norm, cfg=self.loss_cfg,
                                      edit=mb.edit)
                # DDP and FSDP2 average gradients over ranks; the loss is this rank's share of
                # the global role-weighted token mean, so scaling by the world size makes the
                # average the gradient of the global mean.
                (loss * d.world_size).backward()
            if part:
                metrics.add(m)
        if before_update is not None:
            before_update()
        grad_norm = clip_grad_norm(self.params, self.tcfg.grad_clip)
        self.optim.step()
        sums, maxs = metrics.vectors()
        all_reduce_(sums, d)
        all_reduce_(maxs, d, dist.ReduceOp.MAX)
        padded_t = all_reduce_(torch.tensor([float(padded)], dtype=torch.float64), d)
        all_reduce_(base_sums, d)
        summary = StepMetrics.from_vectors(sums, maxs).summary()
        roles: dict[str, int] = {}
        for s in samples:
            roles[s.role] = roles.get(s.role, 0) + 1
        base = None
        if base_sums[0] > 0:
            base = {"kl_base": float(base_sums[1] / base_sums[0]),
                    "logprob_abs_diff_base": float(base_sums[2] / base_sums[0])}
        return StepResult(summary, len(samples), int(padded_t.item()), n_micro, grad_norm, lr,
                          time.perf_counter() - t0,
                          real_tokens=sum(s.length for s in samples), roles=roles, base=base)

    def _collate(self, part: list, norm: dict[str, float]) -> MicroBatch:
        if not part:
            return collate([])
        if isinstance(part[0], Row):
            return collate_rows(part, norm=norm)
        return collate(part, norm=norm)

    def _base_logprobs(self, mb: MicroBatch, inputs: dict) -> torch.Tensor | None:
        """Log-probs of the scored tokens under the base model: the adapter switched off
        (LoRA) or the frozen reference copy (full weights with kl_coef > 0); None when there
        is no base to ask (full weights without a reference)."""
        with torch.no_grad():
            if self.ref is not None:
                return self.ref(mb.input_ids, **inputs)[0]
            if self.lora:
                return self.model(mb.input_ids, use_adapter=False, **inputs)[0]
        return None
