"""Plain model code: the causal LM (full or with a peft LoRA adapter) that scores tokens, and the
conversions of its state dict into what the inference servers load.

`PolicyModel.forward` returns log pi(token_t | tokens_<t) for the marked tokens, taken from the
logits at position t - 1 and divided by `temperature` before the log-softmax (the sampling temperature, which a server in
processed_logprobs mode reports at; 1.0 matches vLLM's default raw log-probs). Only the marked positions go through the LM head, so long prompts cost
no vocabulary-sized logits. Nothing here knows DDP, FSDP or torchrun.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from spade_async.inference.cpu_profile import CpuInfo, choose_dtype, effective_dtype

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.index.json")


def constrained_lse(logits: torch.Tensor, lse: torch.Tensor, allowed_pos: torch.Tensor,
                    allowed_tok: torch.Tensor) -> torch.Tensor:
    """`lse` with the entries of constrained positions replaced by the log-sum-exp over their
    allowed ids only (differentiable: the constrained policy's normaliser moves with theta)."""
    vals = logits[allowed_pos, allowed_tok]  # [M]
    peak = torch.full_like(lse, -torch.inf).scatter_reduce(
        0, allowed_pos, vals.detach(), reduce="amax")
    total = torch.zeros_like(lse).index_add(0, allowed_pos, torch.exp(vals - peak[allowed_pos]))
    constrained = torch.zeros_like(lse, dtype=torch.bool)
    constrained[allowed_pos] = True
    safe_total = torch.where(constrained, total, torch.ones_like(total))
    return torch.where(constrained, peak + torch.log(safe_total), lse)


class PolicyModel(nn.Module):
    def __init__(self, lm: nn.Module, *, temperature: float = 1.0, lora: bool) -> None:
        super().__init__()
        self.lm = lm
        self.temperature = temperature
        self.lora = lora

    def _hf(self) -> nn.Module:
        return self.lm.get_base_model() if self.lora else self.lm

    def forward(self, input_ids: torch.Tensor, target_mask: torch.Tensor | None = None,
                use_adapter: bool = True, allowed_pos: torch.Tensor | None = None,
                allowed_tok: torch.Tensor | None = None, *,
                position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                pred_index: torch.Tensor | None = None,
                targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs [N], entropy [N]) of the scored tokens: those `target_mask` marks (N of
        them, row-major; token t scored from position t - 1), or, for packed rows
        (trainer/pack.py), `targets` scored from the flattened positions `pred_index`, with
        the rows' `position_ids` and tree `attention_mask` ([B, 1, T, T] bool).
        `use_adapter=False` scores with the base weights (the LoRA reference).
        A token that was sampled under a choice constraint (pairs (n, id) in `allowed_pos`,
        `allowed_tok`) is scored under the constrained distribution, renormalised over its
        allowed ids, as the server reported its behaviour log-prob."""
        if pred_index is None or targets is None:
            if target_mask is None:
                raise ValueError("give target_mask, or pred_index and targets")
            flat = torch.nonzero(target_mask.reshape(-1), as_tuple=True)[0]
            pred_index, targets = flat - 1, input_ids.reshape(-1)[flat]
        hf = self._hf()
        off = self.lm.disable_adapter() if (self.lora and not use_adapter) else (
            contextlib.nullcontext())
        with off:
            hidden = hf.get_decoder()(input_ids=input_ids, position_ids=position_ids,
                                      attention_mask=attention_mask,
                                      use_cache=False).last_hidden_state
            h = hidden.reshape(-1, hidden.shape[-1])[pred_index]  # [N, H]
            logits = hf.get_output_embeddings()(h).float() / self.temperature
        lse = torch.logsumexp(logits, dim=-1)
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            entropy = lse - (probs * logits).sum(-1)
        if allowed_pos is not None and allowed_pos.numel():
            lse = constrained_lse(logits, lse, allowed_pos, allowed_tok)
        logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
        return logprobs, entropy

    def decoder_layers(self) -> list[nn.Module]:
        """The transformer blocks, the unit FSDP2 shards."""
        return list(self._hf().get_decoder().layers)


def load_policy(base_dir: Path, *, mode: str, lora_rank: int, lora_alpha: float,
                lora_dropout: float, lora_targets: list[str], temperature: float,
                trainable: bool = True) -> PolicyModel:
    """The base checkpoint in float32 (the master weights), with a fresh adapter in LoRA mode
    (B = 0, so version 0 of an adapter equals the base model)."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    lm.config.use_cache = False
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        lm = get_peft_model(lm, LoraConfig(
            r=lora_rank, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
            target_modules=list(lora_targets), bias="none", task_type="CAUSAL_LM"))
    elif not trainable:
        lm.requires_grad_(False)
    model = PolicyModel(lm, temperature=temperature, lora=mode == "lora")
    model.train(trainable)
    return model


# ---- export: the state dict of PolicyModel (gathered, plain tensors) -> server formats --------

_LM = "lm."
_PEFT = "lm.base_model.model."


def adapter_state_dict(full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keys as the PeftModel names them (`base_model.model....lora_A.default.weight`)."""
    return {k[len(_LM):]: v for k, v in full.items() if ".lora_" in k}


def merged_state_dict(full: dict[str, torch.Tensor], *, lora: bool, scaling: float,
                      tied: bool, adapter: str = "default") -> dict[str, torch.Tensor]:
    """HF checkpoint names (`model.layers.0...`); a LoRA adapter is merged in:
    W' = W + scaling * B @ A, scaling = alpha / r."""
    if not lora:
        out = {k[len(_LM):]: v for k, v in full.items() if k.startswith(_LM)}
    else:
        out = {}
        for k, v in full.items():
            if not k.startswith(_PEFT) or ".lora_" in k:
                continue
            name = k[len(_PEFT):]
            if ".base_layer." in name:
                prefix = k[: k.index(".base_layer.")]
                a = full[f"{prefix}.lora_A.{adapter}.weight"].float()
                b = full[f"{prefix}.lora_B.{adapter}.weight"].float()
                name = name.replace(".base_layer.", ".")
                v = (v.float() + scaling * (b @ a)).to(v.dtype)
            out[name] = v
    if tied:
        out.pop("lm_head.weight", None)  # the checkpoint stores the embedding once
    return out


def save_full_weights(state: dict[str, torch.Tensor], base_dir: Path, out: Path,
                      dtype: torch.dtype | None = None) -> None:
    """A complete HF directory: the base's config (its dtype set to the weights') and tokenizer
    files, the new weights in `dtype` (the serving dtype; default the base checkpoint's), one
    safetensors file."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in base_dir.iterdir():
        if f.is_file() and not any(f.match(p) for p in WEIGHT_FILES):
            shutil.copy2(f, out / f.name)
    dtype = dtype or checkpoint_dtype(base_dir)
    name = str(dtype).removeprefix("torch.")
    config = json.loads((out / "config.json").read_text())
    if (config.get("dtype") or config.get("torch_dtype")) != name:
        config["dtype"] = name
        config.pop("torch_dtype", None)
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {k: v.detach().to("cpu", dtype).contiguous().clone() for k, v in state.items()}
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})


def checkpoint_dtype(base_dir: Path) -> torch.dtype:
    cfg = json.loads((base_dir / "config.json").read_text())
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    return getattr(torch, str(name))


@dataclass(frozen=True)
class Precision:
    """How the trainer computes, decided once at start from what the servers compute in."""

    autocast_bf16: bool  # bf16 compute over the float32 master weights
    serving_dtype: torch.dtype  # what the servers compute in: full-weight exports use it
    reason: str  # one line for the log

    def as_dict(self) -> dict[str, object]:
        return {"autocast_bf16": self.autocast_bf16,
                "serving_dtype": str(self.serving_dtype).removeprefix("torch."),
                "reason": self.reason}


def resolve_precision(autocast: bool | str, model_dtype: str, device_type: str,
                      base_dir: Path, *, cpu: CpuInfo | None = None) -> Precision:
    """The servers' dtype, resolved as scripts/inference.sh resolves `model.dtype` (on a CPU
    trainer from this CPU's features, which the embedded servers share; on a GPU trainer, vLLM's
    own auto of the checkpoint), and bf16 autocast iff that is bf16 (`trainer.autocast_bf16 =
    "auto"`; an explicit true / false is honoured)."""
    choice = choose_dtype(model_dtype, device="gpu" if device_type == "cuda" else "cpu",  # type: ignore[arg-type]
                          cpu=cpu)
    ckpt = str(checkpoint_dtype(base_dir)).removeprefix("torch.")
    serving = effective_dtype(choice, ckpt)
    if autocast == "auto":
        bf16 = serving == "bfloat16"
        why = f"servers compute in {serving} ({choice.reason})"
    else:
        bf16 = bool(autocast)
        why = (f"trainer.autocast_bf16 = {str(bf16).lower()} in the config; servers compute "
               f"in {serving} ({choice.reason})")
    return Precision(bf16, getattr(torch, serving), why)


def ties_embeddings(base_dir: Path) -> bool:
    return bool(json.loads((base_dir / "config.json").read_text()).get("tie_word_embeddings"))
