"""From a spool batch to micro-batches: staleness filter, role weights, rank split, and the
padded layout (trainer/pack.py packs instead).

Every rank runs the same deterministic selection on the same batch file, then takes its own
share, so no sample data crosses ranks. Token `t` is scored from the logits at position
`t - 1`; a token marked at position 0 has no prefix and is never trained (counted).
Plain numpy and torch: nothing here knows torch.distributed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import torch

from spade_async.core.spool.batch import Batch


@dataclass(frozen=True)
class TrainSample:
    row: int
    sample_id: str
    role: str
    policy_version: int
    token_ids: np.ndarray  # int64 [T]
    loss_mask: np.ndarray  # bool [T], False at position 0
    behaviour_logprobs: np.ndarray  # float32 [T]
    advantage: float
    weight: float
    staleness: int
    move: str = ""
    seq: int = 0  # the spool batch it came from
    # Per trained token (in order), the ids a choice constraint allowed when it was sampled;
    # None for free decoding. The trainer renormalises its log-prob over them (see
    # spade_async/inference/constrained.py for why).
    allowed: list[np.ndarray] | None = None

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def trained_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def prompt_len(self) -> int:
        """Tokens before the first trained one (what samples may share as a prefix)."""
        return int(np.argmax(self.loss_mask))


@dataclass
class Selection:
    samples: list[TrainSample]
    dropped: Counter[str] = field(default_factory=Counter)
    dropped_rows: list[tuple[int, str]] = field(default_factory=list)  # (row, reason)

    @property
    def tokens(self) -> int:
        return sum(s.trained_tokens for s in self.samples)


def _lists(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    col = table[name].combine_chunks()
    if isinstance(col, pa.ChunkedArray):  # pyarrow < 16 returns a chunked array here
        col = pa.concat_arrays(col.chunks)
    return col.offsets.to_numpy(), col.values.to_numpy(zero_copy_only=False)


def select_samples(batch: Batch, *, current_version: int, max_staleness: int,
                   role_weights: dict[str, float]) -> Selection:
    """The batch's trainable samples, in file order, with their role weight and staleness."""
    t = batch.table
    offsets, tokens = _lists(t, "token_ids")
    _, masks = _lists(t, "loss_mask")
    _, logprobs = _lists(t, "behaviour_logprobs")
    sel = Selection([])
    ids, roles = t["sample_id"].to_pylist(), t["role"].to_pylist()
    versions, advantages = t["policy_version"].to_pylist(), t["advantage"].to_pylist()
    moves, allowed_col = t["move"].to_pylist(), t["allowed_tokens"]
    for i in range(t.num_rows):
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        # A sample from a version newer than ours can only come from a previous run's
        # weights; it is as fresh as it gets, so its staleness is 0, not negative.
        staleness = max(0, current_version - int(versions[i]))
        if staleness > max_staleness:
            sel.dropped["stale"] += 1
            sel.dropped_rows.append((i, "stale"))
            continue
        weight = float(role_weights.get(roles[i], 0.0))
        if weight == 0.0:
            sel.dropped[f"zero_weight_{roles[i]}"] += 1
            sel.dropped_rows.append((i, f"zero_weight_{roles[i]}"))
            continue
        mask = masks[lo:hi].astype(bool)
        allowed = allowed_col[i].as_py()
        if mask[0]:
            sel.dropped["first_token_masked"] += 1  # a token, not the sample
            mask = mask.copy()
            mask[0] = False
            allowed = allowed[1:] if allowed is not None else None
        if not mask.any():
            sel.dropped["no_trainable_token"] += 1
            sel.dropped_rows.append((i, "no_trainable_token"))
            continue
        sel.samples.append(TrainSample(
            row=i, sample_id=ids[i], role=roles[i], policy_version=int(versions[i]),
            token_ids=tokens[lo:hi].astype(np.int64), loss_mask=mask,
            behaviour_logprobs=logprobs[lo:hi].astype(np.float32),
            advantage=float(advantages[i]), weight=weight, staleness=staleness,
            move=moves[i] or "", seq=batch.seq,
            allowed=None if allowed is None else [np.asarray(a, np.int64) for a in allowed],
        ))
    return sel


def split_across_ranks(samples: list[TrainSample], world_size: int) -> list[list[TrainSample]]:
    """Greedy balance by sequence length (longest first); deterministic, order kept per rank."""
    shares: list[list[TrainSample]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for s in sorted(samples, key=lambda s: (-s.length, s.row)):
        r = min(range(world_size), key=lambda k: (load[k], k))
        shares[r].append(s)
        load[r] += s.length
    return [sorted(share, key=lambda s: s.row) for share in shares]


def micro_batches(samples: list[TrainSample], token_budget: int) -> list[list[TrainSample]]:
    """Rows of similar length together; rows x longest row <= token_budget (a longer sample
    runs alone)."""
    out: list[list[TrainSample]] = []
    current: list[TrainSample] = []
    for s in sorted(samples, key=lambda s: (-s.length, s.row)):
        longest = current[0].length if current else s.length
        if current and (len(current) + 1) * longest > token_budget:
            out.append(current)
            current = []
        current.append(s)
    if current:
        out.append(current)
    return out


@dataclass(frozen=True)
class MicroBatch:
    """Model inputs plus flat per-token tensors, one entry per scored token (N of them).

    Two layouts: padded rows of one sample each (`collate`: right padding, plain causal
    attention, `target_mask` marks the scored tokens), or packed rows (trainer/pack.py: several
    sequences per row with a tree attention mask and per-group position ids). Either way
    `pred_index` says, per scored token, which position of the flattened [B * T] hidden
    states predicts it, and `targets` is the token."""

    input_ids: torch.Tensor  # int64 [B, T]
    target_mask: torch.Tensor | None  # bool [B, T] (padded layout only)
    behaviour_logprobs: torch.Tensor  # float32 [N]
    advantages: torch.Tensor  # float32 [N]
    weights: torch.Tensor  # float32 [N]
    staleness: torch.Tensor  # float32 [N]
    # A choice constraint's allowed ids as (index into the N tokens, token id) pairs; a token
    # with pairs is scored under the constrained distribution. Empty: no constrained token.
    allowed_pos: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    allowed_tok: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    edit: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool))  # [N]
    position_ids: torch.Tensor | None = None  # int64 [B, T]; None: 0..T-1 in every row
    attention_mask: torch.Tensor | None = None  # bool [B, 1, T, T]; None: causal
    pred_index: torch.Tensor | None = None  # int64 [N] into the flattened [B * T] positions
    targets: torch.Tensor | None = None  # int64 [N]
    loss_norm: torch.Tensor | None = None  # float32 [N]: what the token's loss is divided by
    real_tokens: int = 0  # sequence tokens of the samples (before padding or sharing)

    @property
    def num_tokens(self) -> int:
        return int(self.behaviour_logprobs.numel())

    @property
    def padded_tokens(self) -> int:
        """Positions run through the model, padding included."""
        return self.input_ids.numel()

    def model_inputs(self) -> dict[str, torch.Tensor | None]:
        return {"position_ids": self.position_ids, "attention_mask": self.attention_mask,
                "pred_index": self.pred_index, "targets": self.targets,
                "allowed_pos": self.allowed_pos, "allowed_tok": self.allowed_tok}

    def to(self, device: torch.device) -> MicroBatch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return MicroBatch(*(move(getattr(self, f)) for f in (
            "input_ids", "target_mask", "behaviour_logprobs", "advantages", "weights",
            "staleness", "allowed_pos", "allowed_tok", "edit", "position_ids",
            "attention_mask", "pred_index", "targets", "loss_norm")),
            real_tokens=self.real_tokens)


def collate(rows: list[TrainSample], pad_id: int = 0,
            norm: dict[str, float] | None = None) -> MicroBatch:
    """One sample per row, right-padded: with causal attention a real token never attends to
    a later pad, so no attention mask is needed and position ids stay 0..T-1. `norm`: per
    role, what a token's loss is divided by (default 1)."""
    if not rows:  # a rank with nothing to do still runs one forward (collectives must match)
        return MicroBatch(torch.full((1, 2), pad_id, dtype=torch.long),
                          torch.zeros((1, 2), dtype=torch.bool),
                          *(torch.zeros(0) for _ in range(4)),
                          pred_index=torch.zeros(0, dtype=torch.long),
                          targets=torch.zeros(0, dtype=torch.long),
                          loss_norm=torch.zeros(0))
    width = max(r.length for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    beh = torch.zeros((len(rows), width))
    adv, wts, stale, scale = (torch.zeros((len(rows), width)) for _ in range(4))
    edit = torch.zeros((len(rows), width), dtype=torch.bool)
    pos_parts, tok_parts = [], []
    start = 0  # index of the row's first trained token in the flat [N] order
    for i, r in enumerate(rows):
        n = r.length
        ids[i, :n] = torch.from_numpy(r.token_ids)
        mask[i, :n] = torch.from_numpy(r.loss_mask)
        beh[i, :n] = torch.from_numpy(r.behaviour_logprobs)
        adv[i, :n], wts[i, :n], stale[i, :n] = r.advantage, r.weight, float(r.staleness)
        scale[i, :n] = (norm or {}).get(r.role, 1.0)
        edit[i, :n] = r.move == "edit"
        if r.allowed is not None:
            for k, allowed in enumerate(r.allowed):
                pos_parts.append(np.full(len(allowed), start + k, dtype=np.int64))
                tok_parts.append(allowed)
        start += r.trained_tokens
    allowed_pos = torch.from_numpy(np.concatenate(pos_parts)) if pos_parts else torch.zeros(
        0, dtype=torch.long)
    allowed_tok = torch.from_numpy(np.concatenate(tok_parts)) if tok_parts else torch.zeros(
        0, dtype=torch.long)
    flat = torch.nonzero(mask.reshape(-1), as_tuple=True)[0]
    return MicroBatch(ids, mask, beh[mask], adv[mask], wts[mask], stale[mask], allowed_pos,
                      allowed_tok, edit[mask], pred_index=flat - 1,
                      targets=ids.reshape(-1)[flat], loss_norm=scale[mask],
                      real_tokens=sum(r.length for r in rows))
