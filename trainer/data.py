"""From a spool batch to padded micro-batches: staleness filter, role weights, rank split.

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


@dataclass
class Selection:
    samples: list[TrainSample]
    dropped: Counter[str] = field(default_factory=Counter)

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
            continue
        weight = float(role_weights.get(roles[i], 0.0))
        if weight == 0.0:
            sel.dropped[f"zero_weight_{roles[i]}"] += 1
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
            continue
        sel.samples.append(TrainSample(
            row=i, sample_id=ids[i], role=roles[i], policy_version=int(versions[i]),
            token_ids=tokens[lo:hi].astype(np.int64), loss_mask=mask,
            behaviour_logprobs=logprobs[lo:hi].astype(np.float32),
            advantage=float(advantages[i]), weight=weight, staleness=staleness,
            move=moves[i] or "",
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
    """Padded inputs plus flat per-token tensors in the order the model returns log-probs
    (row-major over `target_mask`)."""

    input_ids: torch.Tensor  # int64 [B, T]
    target_mask: torch.Tensor  # bool [B, T]: score this token (from position t - 1)
    behaviour_logprobs: torch.Tensor  # float32 [N]
    advantages: torch.Tensor  # float32 [N]
    weights: torch.Tensor  # float32 [N]
    staleness: torch.Tensor  # float32 [N]
    # A choice constraint's allowed ids as (index into the N tokens, token id) pairs; a token
    # with pairs is scored under the constrained distribution. Empty: no constrained token.
    allowed_pos: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    allowed_tok: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    edit: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool))  # [N]

    @property
    def num_tokens(self) -> int:
        return int(self.target_mask.sum())

    @property
    def padded_tokens(self) -> int:
        return self.input_ids.numel()

    def to(self, device: torch.device) -> MicroBatch:
        return MicroBatch(*(t.to(device) for t in (
            self.input_ids, self.target_mask, self.behaviour_logprobs, self.advantages,
            self.weights, self.staleness, self.allowed_pos, self.allowed_tok, self.edit)))


def collate(rows: list[TrainSample], pad_id: int = 0) -> MicroBatch:
    """Right padding: with causal attention a real token never attends to a later pad, so no
    attention mask is needed and position ids stay 0..T-1."""
    if not rows:  # a rank with nothing to do still runs one forward (collectives must match)
        return MicroBatch(torch.full((1, 2), pad_id, dtype=torch.long),
                          torch.zeros((1, 2), dtype=torch.bool),
                          *(torch.zeros(0) for _ in range(4)))
    width = max(r.length for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    beh = torch.zeros((len(rows), width))
    adv, wts, stale = (torch.zeros((len(rows), width)) for _ in range(3))
    edit = torch.zeros((len(rows), width), dtype=torch.bool)
    pos_parts, tok_parts = [], []
    start = 0  # index of the row's first trained token in the flat [N] order
    for i, r in enumerate(rows):
        n = r.length
        ids[i, :n] = torch.from_numpy(r.token_ids)
        mask[i, :n] = torch.from_numpy(r.loss_mask)
        beh[i, :n] = torch.from_numpy(r.behaviour_logprobs)
        adv[i, :n], wts[i, :n], stale[i, :n] = r.advantage, r.weight, float(r.staleness)
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
    return MicroBatch(ids, mask, beh[mask], adv[mask], wts[mask], stale[mask], allowed_pos,
                      allowed_tok, edit[mask])
