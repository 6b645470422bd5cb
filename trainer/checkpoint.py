"""Checkpoints: trainable weights + optimizer state (torch.distributed.checkpoint, sharded per
rank) and the trainer state (step, the spool position: the last wholly done batch and the done
rows of the batches after it) in one directory that appears by rename only once complete.
LoRA checkpoints hold the adapter alone (20 MB for SmolLM2 at rank 16 on attention, with its
AdamW moments), not the tied embedding DCP would add (113 MB).

Layout under `<checkpoint_dir>/checkpoints/`:
  step-000000012-seq-000000000013/      DCP shards + .metadata + trainer_state.json (last)
  step-000000014-seq-000000000015.tmp/  being written, or torn by a crash: deleted on start
  latest.json              {"step": 12, "dir": "step-000000012-seq-..."}, replaced atomically after
                           the rename; the one thing a restart trusts
The spool position lives inside the same directory as the weights it produced, so a restart
resumes exactly after the last samples whose effect it holds: a sample trained after that
checkpoint is trained again from the checkpointed weights (its first attempt is lost with the
crash), never twice into the same weights. Needs a filesystem every rank sees.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
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
LINEAGE = "lineage.json"
FORMAT = 2


@dataclass
class TrainerState:
    step: int = 0  # optimizer steps taken
    last_seq: int = 0  # every spool batch up to this one is wholly done (trained or dropped)
    # Batches after last_seq with some rows done: seq -> {"rows": n, "done": [row, ...]}
    # (trainer/buffer.py); a restart claims them again and skips those rows.
    open: dict[str, dict] = field(default_factory=dict)
    samples: int = 0  # samples trained
    tokens: int = 0  # tokens trained
    dropped: dict[str, int] = field(default_factory=dict)  # samples dropped, by reason
    format: int = FORMAT

    @classmethod
    def from_json(cls, data: dict) -> TrainerState:
        """A saved state; format 1 (one step per batch, with a lineage of batch runs) reads
        as format 2 with no open batches: its last_seq was wholly done."""
        if data.get("format") not in (1, FORMAT):
            raise ValueError(f"checkpoint format {data.get('format')}, this trainer reads "
                             f"1 and {FORMAT}")
        keep = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{**keep, "format": FORMAT})


class Checkpointer:
    def __init__(self, root: Path, d: Dist, *, lora: bool, keep: int,
                 keep_every_s: float = 0.0) -> None:
        self.dir = Path(root) / "checkpoints"
        self.d, self.keep, self.keep_every_s = d, keep, keep_every_s
        # LoRA: only the adapter and its optimizer state; the base comes from the checkpoint.
        self.options = StateDictOptions(ignore_frozen_params=lora)
        self.lora = lora
        self.load_options = StateDictOptions(ignore_frozen_params=lora, strict=not lora)
        if d.is_main:
            self.dir.mkdir(parents=True, exist_ok=True)
            if not (self.dir / LINEAGE).is_file():
                atomic_write_json(self.dir / LINEAGE, {"id": uuid.uuid4().hex})
        dist.barrier()
        # This checkpoint directory's identity, written into current.json at each publish: a
        # restart whose checkpoint is behind the published version knows that version is its own.
        self.lineage = str(json.loads((self.dir / LINEAGE).read_text())["id"])

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
        msd, osd = self._state_dicts(model, optim)
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
        try:
            state = TrainerState.from_json(json.loads((path / STATE_FILE).read_text()))
        except ValueError as exc:
            raise RuntimeError(f"{path}: {exc}") from None
        msd, osd = self._state_dicts(model, optim)
        dcp.load({"model": msd, "optim": osd}, storage_reader=dcp.FileSystemReader(path))
        set_state_dict(model, optim, model_state_dict=msd, optim_state_dict=osd,
                       options=self.load_options)
        log.info("checkpoint_loaded", step=state.step, last_seq=state.last_seq, dir=str(path))
        return state

    def _state_dicts(self, model: nn.Module, optim: torch.optim.Optimizer,
                     ) -> tuple[dict, dict]:
        """Model and optimizer state; in LoRA mode the adapter's alone (DCP keeps a tied,
        frozen lm_head in the model's state under its second name)."""
        msd, osd = get_state_dict(model, optim, options=self.options)
        if self.lora:
            msd = {k: v for k, v in msd.items() if ".lora_" in k}
        return msd, osd

    def _prune(self, keep_name: str) -> None:
        """The newest `keep` checkpoints stay, and with `keep_every_s` the first of each such
        period (by the time its state was written)."""
        done = sorted(p for p in self.dir.glob("step-*") if p.is_dir() and p.suffix != ".tmp")
        periods: set[int] = set()
        for old in done[: max(0, len(done) - self.keep)]:
            if old.name == keep_name:
                continue
            if self.keep_every_s:
                try:
                    period = int((old / STATE_FILE).stat().st_mtime // self.keep_every_s)
                except OSError:
                    period = None
                if period is not None and period not in periods:
                    periods.add(period)
                    continue
            shutil.rmtree(old, ignore_errors=True)
