"""Plain model code: the causal LM (full or with a peft LoRA adapter) that scores tokens, and the
conversions of its state dict into what the inference servers load.

`PolicyModel.forward` returns log pi(token_t | tokens_<t) for the marked tokens, taken from the
logits at position t - 1 and divided by `temperature` before the log-softmax (1.0 matches vLLM's
default raw log-probs). Only the marked positions go through the LM head, so long prompts cost
no vocabulary-sized logits. Nothing here knows DDP, FSDP or torchrun.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import torch
from torch import nn

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.index.json")


class PolicyModel(nn.Module):
    def __init__(self, lm: nn.Module, *, temperature: float = 1.0, lora: bool) -> None:
        super().__init__()
        self.lm = lm
        self.temperature = temperature
        self.lora = lora

    def _hf(self) -> nn.Module:
        return self.lm.get_base_model() if self.lora else self.lm

    def forward(self, input_ids: torch.Tensor, target_mask: torch.Tensor,
                use_adapter: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs [N], entropy [N]) of the tokens where `target_mask` is set (N of them,
        row-major); `use_adapter=False` scores with the base weights (the LoRA reference)."""
        hf = self._hf()
        off = self.lm.disable_adapter() if (self.lora and not use_adapter) else (
            contextlib.nullcontext())
        with off:
            hidden = hf.get_decoder()(input_ids=input_ids, use_cache=False).last_hidden_state
            picked = target_mask[:, 1:]
            h = hidden[:, :-1][picked]  # [N, H]: the position before each scored token
            logits = hf.get_output_embeddings()(h).float() / self.temperature
        targets = input_ids[:, 1:][picked]
        lse = torch.logsumexp(logits, dim=-1)
        logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            entropy = lse - (probs * logits).sum(-1)
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


def save_full_weights(state: dict[str, torch.Tensor], base_dir: Path, out: Path) -> None:
    """A complete HF directory: the base's config and tokenizer files, the new weights in the
    base checkpoint's dtype (what vLLM serves), one safetensors file."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in base_dir.iterdir():
        if f.is_file() and not any(f.match(p) for p in WEIGHT_FILES):
            shutil.copy2(f, out / f.name)
    dtype = checkpoint_dtype(base_dir)
    tensors = {k: v.detach().to("cpu", dtype).contiguous().clone() for k, v in state.items()}
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})


def checkpoint_dtype(base_dir: Path) -> torch.dtype:
    cfg = json.loads((base_dir / "config.json").read_text())
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    return getattr(torch, str(name))


def ties_embeddings(base_dir: Path) -> bool:
    return bool(json.loads((base_dir / "config.json").read_text()).get("tie_word_embeddings"))
