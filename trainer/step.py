"""One optimizer step on a list of samples: split across ranks -> micro-batches ->
forward/backward (gradient sync on the last micro-batch only) -> clip -> AdamW step, and the
step's metrics reduced over ranks. The model, its KL reference and the optimizer live here;
the loop (trainer/loop.py) and the benchmark (spade bench trainer) share it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from spade_async.core.config.trainer import TrainerConfig
from trainer.data import TrainSample, collate, micro_batches, split_across_ranks
from trainer.loss import LossConfig, StepMetrics, policy_loss
from trainer.model import load_policy, resolve_precision
from trainer.parallel import Dist, all_reduce_, clip_grad_norm, grad_sync, wrap


@dataclass(frozen=True)
class StepResult:
    metrics: dict[str, float]
    samples: int
    padded_tokens: int
    micro_batches: int
    grad_norm: float
    lr: float
    seconds: float


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
        warm = self.tcfg.warmup_steps
        return self.tcfg.lr * (min(1.0, (step + 1) / warm) if warm else 1.0)

    def step(self, samples: list[TrainSample], *, step_index: int) -> StepResult:
        """One optimizer step on the whole (global) list; every rank passes the same list."""
        t0 = time.perf_counter()
        d = self.d
        shares = split_across_ranks(samples, d.world_size)
        plans = [micro_batches(share, self.tcfg.micro_batch_tokens) for share in shares]
        mine = plans[d.rank]
        # Same number of forwards on every rank (FSDP2 gathers in each); a rank short of work
        # runs empty micro-batches that add nothing to the gradient.
        n_micro = max(len(p) for p in plans)
        normaliser = float(sum(s.trained_tokens for s in samples))
        lr = self.lr_at(step_index)
        for group in self.optim.param_groups:
            group["lr"] = lr
        self.optim.zero_grad(set_to_none=True)
        metrics = StepMetrics()
        padded = 0
        for i in range(n_micro):
            rows = mine[i] if i < len(mine) else []
            mb = collate(rows).to(d.device)
            padded += mb.padded_tokens if rows else 0
            with grad_sync(self.model, enabled=i == n_micro - 1), self._autocast():
                ref_lp = None
                if self.loss_cfg.kl_coef > 0:
                    with torch.no_grad():
                        ref_model = self.ref if self.ref is not None else self.model
                        ref_lp = ref_model(mb.input_ids, mb.target_mask,
                                           allowed_pos=mb.allowed_pos,
                                           allowed_tok=mb.allowed_tok,
                                           **({} if self.ref is not None else
                                              {"use_adapter": False}))[0]
                logprobs, entropy = self.model(mb.input_ids, mb.target_mask,
                                               allowed_pos=mb.allowed_pos,
                                               allowed_tok=mb.allowed_tok)
                loss, m = policy_loss(logprobs, mb.behaviour_logprobs, mb.advantages,
                                      mb.weights, mb.staleness, entropy, ref_lp,
                                      normaliser=normaliser, cfg=self.loss_cfg, edit=mb.edit)
                # DDP and FSDP2 average gradients over ranks; the loss is a sum over this
                # rank's tokens / all tokens, so scaling by the world size makes the average
                # the gradient of the global token mean.
                (loss * d.world_size).backward()
            if rows:
                metrics.add(m)
        grad_norm = clip_grad_norm(self.params, self.tcfg.grad_clip)
        self.optim.step()
        sums, maxs = metrics.vectors()
        all_reduce_(sums, d)
        all_reduce_(maxs, d, dist.ReduceOp.MAX)
        padded_t = all_reduce_(torch.tensor([float(padded)], dtype=torch.float64), d)
        summary = StepMetrics.from_vectors(sums, maxs).summary()
        return StepResult(summary, len(samples), int(padded_t.item()), n_micro, grad_norm, lr,
                          time.perf_counter() - t0)
