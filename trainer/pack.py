"""Packing a step's samples into rows: whole sequences side by side instead of one padded row
each, and samples that share a prompt prefix (the G designs of one document, the episodes of
one play under one system prompt) computing that prefix once.

A row holds groups; a group is a shared prefix followed by its members' suffixes:

    row:   [prefix A][suffix A1][suffix A2][suffix A3][prefix B][suffix B1] ... (pad)
    A2 attends to prefix A and to itself (causally), never to A1, A3 or group B.

The attention mask is a boolean [rows, 1, width, width] tensor (True: may attend) and the
position ids restart per group and continue from the prefix into every suffix, so each
member's tokens see exactly the context they had when sampled: the logits are the ones a
separate forward pass of that sample would give (checked in tests/test_trainer_pack.py). A
token is scored from the hidden state just before it in its own sequence: the previous token
of its suffix, or, for a suffix's first token, the prefix's last one (`pred_index`).

The shared prefix stays inside the prompt part of every member (before its first trained
token), so no scored token is ever shared. Plain numpy and torch: nothing here knows the model
or torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from trainer.data import MicroBatch, TrainSample


@dataclass(frozen=True)
class Group:
    """Members whose first `prefix_len` tokens are the same (all inside their prompts)."""

    prefix_len: int
    members: tuple[TrainSample, ...]

    @property
    def tokens(self) -> int:
        """Positions this group occupies in a row."""
        return self.prefix_len + sum(m.length - self.prefix_len for m in self.members)


@dataclass
class Row:
    groups: list[Group] = field(default_factory=list)
    tokens: int = 0

    @property
    def samples(self) -> list[TrainSample]:
        return [m for g in self.groups for m in g.members]


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def shared_prefix_groups(samples: list[TrainSample], *, min_prefix: int) -> list[Group]:
    """Samples grouped by common prompt prefixes. Sorted by their prompts, samples sharing a
    prefix are neighbours; a sample joins the group before it when the prefix they would share
    is at least `min_prefix` tokens and sharing saves at least as many positions as the
    group's current (longer) prefix did. Deterministic for a given list."""
    order = sorted(samples, key=lambda s: (s.token_ids[:s.prompt_len].tolist(), s.row,
                                           s.sample_id))
    groups: list[tuple[np.ndarray, list[TrainSample]]] = []
    for s in order:
        prompt = s.token_ids[:s.prompt_len]
        if groups:
            prefix, members = groups[-1]
            shared = _lcp(prefix, prompt)
            n = len(members)
            if shared >= min_prefix and n * shared >= (n - 1) * len(prefix):
                groups[-1] = (prefix[:shared], members + [s])
                continue
        groups.append((prompt, [s]))
    # a group of one needs no prefix of its own: its prompt is just the start of its row
    return [Group(len(prefix) if len(members) > 1 else 0, tuple(members))
            for prefix, members in groups]


def _split(group: Group, row_tokens: int) -> list[Group]:
    """A group too long for one row: members in chunks that each repeat the prefix."""
    if group.tokens <= row_tokens or len(group.members) == 1:
        return [group]
    out: list[Group] = []
    chunk: list[TrainSample] = []
    used = group.prefix_len
    for m in group.members:
        extra = m.length - group.prefix_len
        if chunk and used + extra > row_tokens:
            out.append(Group(group.prefix_len if len(chunk) > 1 else 0, tuple(chunk)))
            chunk, used = [], group.prefix_len
        chunk.append(m)
        used += extra
    out.append(Group(group.prefix_len if len(chunk) > 1 else 0, tuple(chunk)))
    return out


def pack_rows(samples: list[TrainSample], *, row_tokens: int, min_prefix: int = 16,
              ) -> list[Row]:
    """Rows of at most `row_tokens` positions (a longer group or sample gets a row of its
    own), filled first-fit by decreasing size. Deterministic for a given list."""
    pieces = [p for g in shared_prefix_groups(samples, min_prefix=min_prefix)
              for p in _split(g, row_tokens)]
    pieces.sort(key=lambda g: (-g.tokens, g.members[0].row, g.members[0].sample_id))
    rows: list[Row] = []
    for g in pieces:
        for row in rows:
            if row.tokens + g.tokens <= row_tokens:
                row.groups.append(g)
                row.tokens += g.tokens
                break
        else:
            rows.append(Row([g], g.tokens))
    return rows


def row_micro_batches(rows: list[Row], token_budget: int) -> list[list[Row]]:
    """Rows of similar width together; rows x widest row <= token_budget (a wider row runs
    alone)."""
    out: list[list[Row]] = []
    current: list[Row] = []
    for r in sorted(rows, key=lambda r: -r.tokens):
        widest = current[0].tokens if current else r.tokens
        if current and (len(current) + 1) * widest > token_budget:
            out.append(current)
            current = []
        current.append(r)
    if current:
        out.append(current)
    return out


def split_rows_across_ranks(rows: list[Row], world_size: int) -> list[list[Row]]:
    """Greedy balance by row length (longest first); deterministic."""
    shares: list[list[Row]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for r in sorted(rows, key=lambda r: (-r.tokens, r.samples[0].row, r.samples[0].sample_id)):
        k = min(range(world_size), key=lambda i: (load[i], i))
        shares[k].append(r)
        load[k] += r.tokens
    return shares


def collate_rows(rows: list[Row], pad_id: int = 0,
                 norm: dict[str, float] | None = None) -> MicroBatch:
    """The packed micro-batch: ids, position ids, the tree attention mask, and per scored
    token (in row, group, member, position order) where it is predicted from and its
    behaviour log-prob, advantage, weight, staleness and choice constraint. `norm`: per role,
    what a token's loss is divided by (see trainer/step.py); default 1."""
    width = max(r.tokens for r in rows)
    b = len(rows)
    ids = np.full((b, width), pad_id, dtype=np.int64)
    pos = np.zeros((b, width), dtype=np.int64)
    group_of = np.full((b, width), -1, dtype=np.int64)  # -1: padding
    member_of = np.full((b, width), -1, dtype=np.int64)  # -1: a shared prefix (or padding)
    pred, tgt, beh, adv, wts, stale, scale, edit = ([] for _ in range(8))
    allowed_pos: list[np.ndarray] = []
    allowed_tok: list[np.ndarray] = []
    n = 0  # scored tokens so far (the flat order)
    member_id = 0
    for i, row in enumerate(rows):
        at = 0
        for gi, g in enumerate(row.groups):
            p = g.prefix_len
            first = g.members[0]
            ids[i, at:at + p] = first.token_ids[:p]
            pos[i, at:at + p] = np.arange(p)
            group_of[i, at:at + p] = gi
            prefix_end = at + p - 1  # the prefix's last position (predicts each suffix start)
            at += p
            for m in g.members:
                k = m.length - p
                ids[i, at:at + k] = m.token_ids[p:]
                pos[i, at:at + k] = np.arange(p, m.length)
                group_of[i, at:at + k] = gi
                member_of[i, at:at + k] = member_id
                member_id += 1
                t = np.flatnonzero(m.loss_mask)  # positions in the sample (all >= p)
                before = t - 1  # the position that predicts each
                flat = np.where(before >= p, i * width + at + (before - p), i * width + prefix_end)
                pred.append(flat)
                tgt.append(m.token_ids[t])
                beh.append(m.behaviour_logprobs[t])
                cnt = len(t)
                adv.append(np.full(cnt, m.advantage, np.float32))
                wts.append(np.full(cnt, m.weight, np.float32))
                stale.append(np.full(cnt, float(m.staleness), np.float32))
                scale.append(np.full(cnt, (norm or {}).get(m.role, 1.0), np.float32))
                edit.append(np.full(cnt, m.move == "edit"))
                if m.allowed is not None:
                    for j, a in enumerate(m.allowed):
                        allowed_pos.append(np.full(len(a), n + j, dtype=np.int64))
                        allowed_tok.append(a)
                n += cnt
                at += k
    if all(len(r.groups) == 1 and len(r.groups[0].members) == 1 for r in rows):
        mask_t = pos_t = None  # one sequence per row: plain causal attention, the fast kernel
    else:
        same_group = group_of[:, :, None] == group_of[:, None, :]
        causal = np.tril(np.ones((width, width), dtype=bool))[None]
        own = (member_of[:, None, :] == -1) | (member_of[:, :, None] == member_of[:, None, :])
        mask = same_group & causal & own & (group_of[:, :, None] >= 0)
        mask |= np.eye(width, dtype=bool)[None]  # a pad attends to itself: no empty softmax row
        mask_t, pos_t = torch.from_numpy(mask[:, None]), torch.from_numpy(pos)

    def cat(parts: list[np.ndarray], dtype: type) -> torch.Tensor:
        return torch.from_numpy(np.concatenate(parts).astype(dtype)) if parts else (
            torch.zeros(0, dtype=torch.long if dtype is np.int64 else torch.float32))

    return MicroBatch(
        input_ids=torch.from_numpy(ids), target_mask=None,
        behaviour_logprobs=cat(beh, np.float32), advantages=cat(adv, np.float32),
        weights=cat(wts, np.float32), staleness=cat(stale, np.float32),
        allowed_pos=cat(allowed_pos, np.int64), allowed_tok=cat(allowed_tok, np.int64),
        edit=torch.from_numpy(np.concatenate(edit)) if edit else torch.zeros(0, dtype=torch.bool),
        position_ids=pos_t, attention_mask=mask_t,
        pred_index=cat(pred, np.int64), targets=cat(tgt, np.int64),
        loss_norm=cat(scale, np.float32),
        real_tokens=sum(m.length for r in rows for m in r.samples))
