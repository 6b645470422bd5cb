"""Exporting version N: a collective gather of the trained weights to rank 0, which writes
`weights/vN` atomically (temp directory, fsync, rename): a peft adapter or a full HF
checkpoint in the serving dtype.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from spade_async.core.io import fsync_dir
from spade_async.core.policy import version_dir, weights_dir
from trainer.model import adapter_state_dict, merged_state_dict, save_full_weights, ties_embeddings
from trainer.parallel import inner
from trainer.step import StepRunner


def export_version(runner: StepRunner, kind: str, data_dir: Path, version: int, *,
                   transfer: Any = None, files: bool = True) -> Path:
    """Collective: gather the weights to rank 0, which writes `weights/vN` atomically: a peft
    adapter directory (kind 'adapter') or a full HF checkpoint in the serving dtype with any
    LoRA merged in (kind 'full'); the full weights also go to the NCCL transfer, if any
    (`transfer.set_weights(state, version)`). `files=False` (only NCCL publishes) writes
    nothing: the returned path does not exist."""
    adapter = kind == "adapter"
    full = get_model_state_dict(runner.model, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True, ignore_frozen_params=adapter))
    weights, path = weights_dir(data_dir), version_dir(data_dir, version)
    if runner.d.is_main and not files:
        if adapter or transfer is None:
            raise ValueError("only full weights sent over NCCL may skip their files")
        transfer.set_weights(_serving_state(runner, full), version)
        shutil.rmtree(path, ignore_errors=True)  # an older run's files are not this version
    elif runner.d.is_main:
        tmp = weights / f".v{version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        if adapter:
            inner(runner.model).lm.save_pretrained(tmp, state_dict=adapter_state_dict(full))
        else:
            state = _serving_state(runner, full)
            save_full_weights(state, runner.base_dir, tmp, runner.precision.serving_dtype)
            if transfer is not None:
                transfer.set_weights(state, version)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        shutil.rmtree(path, ignore_errors=True)  # a re-export after a crash
        os.replace(tmp, path)
        fsync_dir(weights)
    dist.barrier()
    return path


def _serving_state(runner: StepRunner, full: dict[str, Any]) -> dict[str, Any]:
    """HF checkpoint names, any LoRA merged in, in the serving dtype."""
    tcfg = runner.tcfg
    state = merged_state_dict(full, lora=runner.lora, scaling=tcfg.lora_alpha / tcfg.lora_rank,
                              tied=ties_embeddings(runner.base_dir))
    dtype = runner.precision.serving_dtype
    return {k: v.to(dtype) for k, v in state.items()}
