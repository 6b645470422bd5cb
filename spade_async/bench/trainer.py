"""`spade bench trainer`: our train step vs a plain HF forward+backward+step, side by side, and
the time from the end of a step to every endpoint serving the new version.

Throughput: one synthetic regret batch on the prepared checkpoint, the same samples and the same
micro-batches for both paths, interleaved (ours, plain, ours, plain, ...) after one warm-up step
each, so the machine's state is shared. "Plain" is what a first implementation writes: the HF
model (with the same peft adapter in LoRA mode) computes logits for every position, log-softmax
over the vocabulary, gather, the same clipped policy-gradient loss, backward, clip, AdamW.
Ours is `trainer.step.StepRunner.step`, the code the trainer runs (LM head only on the scored
positions, fused log-sum-exp). Tokens/s counts trained (loss-mask) tokens; both paths see the
same ones.

Publish latency: after a step of ours, `export_version` + `Publisher.publish` exactly as the
trainer does, against vLLM (the one given by --base-url, else one started here through the
Procfile's script): a LoRA adapter (`vllm-lora`: load `policy-vN`, retire old ones) and the
merged full weights (`vllm-reload`: pause, reload_weights, reset_prefix_cache, weight version,
resume). The server is given the base weights back at the end.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from spade_async.core.config import (
    EndpointConfig,
    PathsConfig,
    SpadeConfig,
    VllmLoraSwap,
    VllmReloadSwap,
)


def _samples(model_dir: Path, n: int, length: tuple[int, int], seed: int) -> list[Any]:
    from spade_async.core.spool.files import FileSpool
    from trainer.data import select_samples
    from trainer.testing import synthetic_sample

    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    rng = np.random.default_rng(seed)
    rows = [synthetic_sample(rng, f"s{i}", vocab=vocab, length=length,
                             role="designer" if i % 3 == 0 else "agent") for i in range(n)]
    with tempfile.TemporaryDirectory(prefix="spade-bench-train-") as tmp:
        with FileSpool(Path(tmp), writer=True) as spool:
            spool.write(rows)
        batch = FileSpool(Path(tmp)).claim_next(0)
        return select_samples(batch, current_version=0, max_staleness=0,
                              role_weights={"agent": 1.0, "designer": 1.0}).samples


class PlainHF:
    """The textbook step: full logits, log_softmax, gather, the same loss, backward, AdamW."""

    def __init__(self, tcfg: Any, model_dir: Path, *, bf16: bool = False) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from trainer.loss import LossConfig

        torch.manual_seed(tcfg.seed)
        lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        lm.config.use_cache = False
        if tcfg.mode == "lora":
            from peft import LoraConfig, get_peft_model

            lm = get_peft_model(lm, LoraConfig(
                r=tcfg.lora_rank, lora_alpha=tcfg.lora_alpha, lora_dropout=tcfg.lora_dropout,
                target_modules=list(tcfg.lora_targets), bias="none", task_type="CAUSAL_LM"))
        self.model = lm.train()
        self.params = [p for p in lm.parameters() if p.requires_grad]
        self.optim = torch.optim.AdamW(self.params, lr=tcfg.lr, betas=tcfg.adam_betas,
                                       eps=tcfg.adam_eps, weight_decay=tcfg.weight_decay)
        self.tcfg, self.bf16 = tcfg, bf16  # bf16 autocast, as ours runs when the servers do
        self.loss_cfg = LossConfig(tcfg.clip_eps_low, tcfg.clip_eps_high, 0.0)

    def step(self, samples: list[Any]) -> float:
        import torch

        from trainer.data import collate, micro_batches
        from trainer.loss import policy_loss
        from trainer.step import role_normalisers

        t0 = time.perf_counter()
        norm = role_normalisers(samples, {"agent": self.tcfg.agent_weight,
                                          "designer": self.tcfg.designer_weight})
        self.optim.zero_grad(set_to_none=True)
        for rows in micro_batches(samples, self.tcfg.micro_batch_tokens):
            mb = collate(rows, norm=norm)
            attn = torch.zeros_like(mb.input_ids)
            for i, r in enumerate(rows):
                attn[i, :r.length] = 1
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                logits = self.model(input_ids=mb.input_ids, attention_mask=attn).logits.float()
            logp_all = torch.log_softmax(logits[:, :-1], dim=-1)
            picked = mb.target_mask[:, 1:]
            logp = logp_all.gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1)[picked]
            with torch.no_grad():
                entropy = -(logp_all[picked].exp() * logp_all[picked]).sum(-1)
            loss, _ = policy_loss(logp, mb.behaviour_logprobs, mb.advantages, mb.weights,
                                  mb.staleness, entropy, None, normaliser=mb.loss_norm,
                                  cfg=self.loss_cfg)
            loss.backward()
        if self.tcfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.tcfg.grad_clip)
        self.optim.step()
        return time.perf_counter() - t0


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def _throughput(runner: Any, plain: PlainHF, samples: list[Any], steps: int,
                progress: Callable[[str], None]) -> dict[str, Any]:
    tokens = sum(s.trained_tokens for s in samples)
    sequence = sum(s.length for s in samples)
    ours_s: list[float] = []
    plain_s: list[float] = []
    for i in range(steps + 1):  # step 0 of each is the warm-up, not counted
        r = runner.step(samples, step_index=i)
        p = plain.step(samples)
        if i:
            ours_s.append(r.seconds)
            plain_s.append(p)
        progress(f"step {i}{' (warm-up)' if i == 0 else ''}: ours {r.seconds:.2f} s, "
                 f"plain HF {p:.2f} s")
    ours, base = statistics.median(ours_s), statistics.median(plain_s)
    return {"trained_tokens_per_step": tokens, "steps": steps,
            # four significant digits: a tiny checkpoint's steps last milliseconds, and
            # rounding those to 0.001 s would make the printed ratio disagree with them
            "ours_step_s": _sig(ours), "plain_hf_step_s": _sig(base),
            "ours_tokens_per_s": round(tokens / ours, 1),
            "plain_hf_tokens_per_s": round(tokens / base, 1),
            # what the trainer's metrics call seq_tokens_per_s (sequence tokens, scored or not)
            "sequence_tokens_per_step": sequence,
            "ours_seq_tokens_per_s": round(sequence / ours, 1),
            "ratio": round(base / ours, 3)}


def _publish_latency(cfg: SpadeConfig, runner: Any, samples: list[Any], base_url: str,
                     model_dir: Path, work: Path, publishes: int,
                     progress: Callable[[str], None]) -> dict[str, Any]:
    from trainer.export import export_version
    from trainer.publish import Publisher

    out: dict[str, Any] = {}
    step_index = 100
    for label, kind, swap in (("lora", "adapter", VllmLoraSwap()),
                              ("full_reload", "full", VllmReloadSwap())):
        data = work / label
        bcfg = cfg.model_copy(update={
            "paths": PathsConfig(data_dir=data),
            "endpoints": [EndpointConfig(name="bench", base_url=base_url,
                                         request_timeout_s=300, weight_swap=swap)]})
        tcfg = runner.tcfg.model_copy(update={"keep_versions": 2})
        seconds: list[float] = []
        swap_s: list[float] = []
        with Publisher(bcfg, tcfg) as pub:
            pub.adopt_server_state(0)
            try:
                for v in range(1, publishes + 1):
                    runner.step(samples[:2], step_index=step_index)  # any step will do
                    step_index += 1
                    end = time.perf_counter()
                    path = export_version(runner, kind, data / "weights", v)
                    report = pub.publish(v, path, started=end)
                    seconds.append(report.seconds)
                    swap_s.append(report.swap_seconds["bench"])
                    progress(f"{label} v{v}: step end -> served {report.seconds:.3f} s "
                             f"(swap {report.swap_seconds['bench']:.3f} s)")
            finally:
                if kind == "adapter":
                    for v in list(pub.swappers["bench"].loaded):
                        with contextlib.suppress(Exception):
                            pub.portal.call(pub.swappers["bench"].retire, v)
                else:  # give the server its base weights back
                    pub.portal.call(pub.swappers["bench"].swap, 0, model_dir)
        out[label] = {"publishes": publishes,
                      "step_end_to_served_s_median": round(statistics.median(seconds), 3),
                      "step_end_to_served_s_max": round(max(seconds), 3),
                      "swap_s_median": round(statistics.median(swap_s), 3)}
    return out


def run_trainer_bench(cfg: SpadeConfig, model_dir: Path, *, base_url: str | None,
                      samples: int = 16, length: tuple[int, int] = (128, 384), steps: int = 3,
                      publishes: int = 3, publish: bool = True, seed: int = 0,
                      progress: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    import torch

    from trainer.parallel import process_group
    from trainer.step import StepRunner

    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"no prepared checkpoint at {model_dir}: run "
                                "`spade model prepare`")
    tcfg = cfg.trainer.model_copy(update={"backend": "gloo", "parallel": "ddp",
                                          "lora_dropout": 0.0})
    batch = _samples(model_dir, samples, length, seed)
    report: dict[str, Any] = {"model_dir": str(model_dir), "mode": tcfg.mode,
                              "samples": len(batch), "torch_threads": torch.get_num_threads()}
    with process_group("gloo", timeout_s=1800) as d:
        progress(f"loading {model_dir.name} twice ({tcfg.mode}); {len(batch)} samples of "
                 f"{length[0]}-{length[1]} tokens")
        runner = StepRunner(tcfg, d, model_dir, model_dtype=cfg.model.dtype)
        report["precision"] = runner.precision.as_dict()
        progress(f"precision: bf16 autocast {runner.precision.autocast_bf16} "
                 f"({runner.precision.reason})")
        plain = PlainHF(tcfg, model_dir, bf16=runner.precision.autocast_bf16)
        report["throughput"] = _throughput(runner, plain, batch, steps, progress)
        del plain
        if not publish:
            return report
        from spade_async.inference.launch import serving

        # both kinds are published, an adapter first: the server it starts serves LoRA
        # whatever the config's own swap (the embedded default reloads merged weights)
        with serving(model_dir, base_url, progress=progress,
                     extra_env={"SPADE_VLLM_LORA": "1"}) as (url, _), \
                tempfile.TemporaryDirectory(prefix="spade-bench-publish-") as tmp:
            report["base_url"] = url
            report["publish"] = _publish_latency(cfg, runner, batch, url, model_dir, Path(tmp),
                                                 publishes, progress)
    return report
