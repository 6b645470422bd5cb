"""Checkpoints: trainable weights + optimizer state (torch.distributed.checkpoint, sharded per
rank) and the trainer state (step, last consumed spool sequence number, lineage) in one
directory that appears by rename only once complete.

Layout under `<checkpoint_dir>/checkpoints/`:
  step-000000012-seq-000000000013/      DCP shards + .metadata + trainer_state.json (last)
  step-000000014-seq-000000000015.tmp/  being written, or torn by a crash: deleted on start
  latest.json              {"step": 12, "dir": "step-000000012-seq-..."}, replaced atomically after
                           the rename; the one thing a restart trusts
The last consumed sequence number lives inside the same directory as the weights it produced,
so a restart resumes exactly after the last batch whose effect it holds: a batch trained after
that checkpoint is trained again from the checkpointed weights (its first attempt is lost with
the crash), never twice into the same weights. Needs a filesystem every rank sees.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from spade_async.core.io import atomic_write_json, fsync_dir
from spade_async.core.logs import get_logger
from trainer.parallel import Dist

log = get_logger("trainer.checkpoint")

STATE_FILE = "trainer_state.json"
LATEST = "latest.json"
FORMAT = 1


@dataclass
class TrainerState:
    step: int = 0  # optimizer steps taken
    last_seq: int = 0  # last spool batch consumed (trained, or wholly dropped)
    # Lineage: runs [first_seq, last_seq, first_step] of batches that made one step each,
    # and runs [first_seq, last_seq] of batches consumed without a step (all samples dropped).
    trained: list[list[int]] = field(default_factory=list)
    skipped: list[list[int]] = field(default_factory=list)
    samples: int = 0
    tokens: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    format: int = FORMAT

    def record(self, seq: int, *, stepped: bool) -> None:
        if seq != self.last_seq + 1:
            raise RuntimeError(f"batch {seq} consumed after {self.last_seq}: out of order")
        self.last_seq = seq
        if stepped:
            self.step += 1
            # run = [first_seq, last_seq, first_step]; steps count from 1
            run = self.trained[-1] if self.trained else None
            if run and run[1] == seq - 1 and run[2] + (run[1] - run[0]) == self.step - 1:
                run[1] = seq
            else:
                self.trained.append([seq, seq, self.step])
        else:
            run = self.skipped[-1] if self.skipped else None
            if run and run[1] == seq - 1:
                run[1] = seq
            else:
                self.skipped.append([seq, seq])

    def trained_seqs(self) -> list[int]:
        """Spool sequence number of every optimizer step, in step order."""
        return [s for a, b, _ in self.trained for s in range(a, b + 1)]


class Checkpointer:
    def __init__(self, root: Path, d: Dist, *, lora: bool, keep: int) -> None:
        self.dir = Path(root) / "checkpoints"
        self.d, self.keep = d, keep
        # LoRA: only the adapter and its optimizer state; the base comes from the checkpoint.
        self.options = StateDictOptions(ignore_frozen_params=lora)
        self.load_options = StateDictOptions(ignore_frozen_params=lora, strict=not lora)
        if d.is_main:
            self.dir.mkdir(parents=True, exist_ok=True)
        dist.barrier()

    def latest(self) -> Path | None:
        try:
            data = json.loads((self.dir / LATEST).read_text())
        except FileNotFoundError:
            return None
        path = self.dir / data["dir"]
        if not (path / STATE_FILE).is_file():
            raise RuntimeError(f"{self.dir / LATEST} names {path}, which is not a complete "
                               "checkpoint")
        return path

    def save(self, model: nn.Module, optim: torch.optim.Optimizer, state: TrainerState) -> Path:
        """Collective: every rank writes its shards; rank 0 commits."""
        # Named by step and seq: a stop after skipped batches checkpoints the same step again,
        # and must never replace the directory latest.json names.
        name = f"step-{state.step:09d}-seq-{state.last_seq:012d}"
        final, tmp = self.dir / name, self.dir / f"{name}.tmp"
        if self.d.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            if final.exists():  # renamed by a run that crashed before latest.json moved
                shutil.rmtree(final)
        dist.barrier()
        msd, osd = get_state_dict(model, optim, options=self.options)
        dcp.save({"model": msd, "optim": osd},
                 storage_writer=dcp.FileSystemWriter(tmp, sync_files=True, overwrite=True))
        dist.barrier()  # every rank's shards are on disk before the commit
        if self.d.is_main:
            atomic_write_json(tmp / STATE_FILE, asdict(state))
            os.replace(tmp, final)
            fsync_dir(self.dir)
            atomic_write_json(self.dir / LATEST, {"step": state.step, "dir": name})
            self._prune(keep_name=name)
        dist.barrier()
        log.info("checkpoint_saved", step=state.step, last_seq=state.last_seq, dir=str(final))
        return final

    def load(self, model: nn.Module, optim: torch.optim.Optimizer) -> TrainerState:
        """The latest committed checkpoint into model and optimizer (fresh state if none)."""
        path = self.latest()
        if self.d.is_main:
            for torn in self.dir.glob("*.tmp"):
                log.warning("checkpoint_torn_removed", dir=str(torn))
                shutil.rmtree(torn, ignore_errors=True)
        dist.barrier()
        if path is None:
            return TrainerState()
        data = json.loads((path / STATE_FILE).read_text())
        if data.get("format") != FORMAT:
            raise RuntimeError(f"{path}: checkpoint format {data.get('format')}, this trainer "
                               f"reads {FORMAT}")
        msd, osd = get_state_dict(model, optim, options=self.options)
        dcp.load({"model": msd, "optim": osd}, storage_reader=dcp.FileSystemReader(path))
        set_state_dict(model, optim, model_state_dict=msd, optim_state_dict=osd,
                       options=self.load_options)
        state = TrainerState(**data)
        log.info("checkpoint_loaded", step=state.step, last_seq=state.last_seq, dir=str(path))
        return state

    def _prune(self, keep_name: str) -> None:
        done = sorted(p for p in self.dir.glob("step-*") if p.is_dir() and p.suffix != ".tmp")
        for old in done[: max(0, len(done) - self.keep)]:
            if old.name != keep_name:
                shutil.rmtree(old, ignore_errors=True)
