"""The batch contract between the daemon and the trainer: the Arrow schema (v2, and v1 read as
v2), one training Sample and the checks it must pass, and the conversion of samples to a batch
table and back (Batch). Pure: no files, no clocks but a sample's default creation time."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SCHEMA_VERSION = 2
ROLES = ("agent", "designer")
Role = Literal["agent", "designer"]
MOVES = ("", "write", "edit")  # a designer sample's move; "" for the agent

BATCH_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("role", pa.string(), nullable=False),
        pa.field("env_id", pa.string(), nullable=False),
        pa.field("policy_version", pa.int64(), nullable=False),
        pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
        pa.field("behaviour_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("advantage", pa.float32(), nullable=False),
        pa.field("reward", pa.float32(), nullable=False),
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("hinted", pa.bool_(), nullable=False),
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
        # v2: the designer's move, and for a sample decoded under a choice constraint the
        # token ids the constraint allowed at each sampled (mask 1) token, in order; null for
        # free decoding (see spade_async/inference/constrained.py).
        pa.field("move", pa.string(), nullable=False),
        pa.field("allowed_tokens", pa.list_(pa.list_(pa.int32())), nullable=True),
    ],
    metadata={"schema_version": str(SCHEMA_VERSION)},
)

BATCH_V1_SCHEMA = pa.schema(list(BATCH_SCHEMA)[:-2], metadata={"schema_version": "1"})

_INT32_MAX = 2**31 - 1


class SpoolError(RuntimeError):
    """The spool cannot do what was asked; the message names the directory or batch."""


class SampleError(ValueError):
    """A sample that breaks the batch contract; names the sample and the field."""

    def __init__(self, sample_id: str, field: str, problem: str) -> None:
        super().__init__(f"sample {sample_id!r}: field {field!r}: {problem}")
        self.sample_id = sample_id
        self.field = field


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Sample:
    """One training sample: a whole sequence with the model's own tokens marked in `loss_mask`.

    `behaviour_logprobs[i]` is the log-prob the server reported for token i when it was sampled
    (mask 1), and 0 where the mask is 0 (prompt, environment observations, tool results).
    Floats are stored as float32: a value reads back as `float(np.float32(value))`.
    """

    sample_id: str
    role: Role
    env_id: str
    policy_version: int
    token_ids: Sequence[int]
    loss_mask: Sequence[int]
    behaviour_logprobs: Sequence[float]
    advantage: float
    reward: float
    episode_id: str = ""
    hinted: bool = False
    created_at: datetime = field(default_factory=_utcnow)
    move: str = ""
    allowed_tokens: Sequence[Sequence[int]] | None = None

    def validate(self) -> None:
        """Raise SampleError naming the first field that breaks the contract."""
        _checked_arrays(self)


def _checked_arrays(s: Sample) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate `s`; return its token ids, mask and log-probs as int32, int8 and float32."""
    sid = s.sample_id if isinstance(s.sample_id, str) else repr(s.sample_id)

    def bad(field: str, problem: str) -> SampleError:
        return SampleError(sid, field, problem)

    if not isinstance(s.sample_id, str) or not s.sample_id:
        raise bad("sample_id", "must be a non-empty string")
    if s.role not in ROLES:
        raise bad("role", f"must be one of {ROLES}, got {s.role!r}")
    for name in ("env_id", "episode_id"):
        if not isinstance(getattr(s, name), str):
            raise bad(name, "must be a string")
    if isinstance(s.policy_version, bool) or not isinstance(s.policy_version, int | np.integer):
        raise bad("policy_version", f"must be an int, got {type(s.policy_version).__name__}")
    if s.policy_version < 0:
        raise bad("policy_version", f"must be >= 0, got {s.policy_version}")
    if not isinstance(s.hinted, bool | np.bool_):
        raise bad("hinted", "must be a bool")
    if not isinstance(s.created_at, datetime) or s.created_at.utcoffset() is None:
        raise bad("created_at", "must be a timezone-aware datetime")
    for name in ("advantage", "reward"):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
            raise bad(name, f"must be a number, got {type(value).__name__}")
        with np.errstate(over="ignore"):  # overflow is what we test for
            as_f32 = float(np.float32(value))
        if not math.isfinite(as_f32):
            raise bad(name, f"must be finite in float32, got {value}")

    try:
        tokens = np.asarray(s.token_ids)
        mask = np.asarray(s.loss_mask)
        logprobs = np.asarray(s.behaviour_logprobs, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise bad("token_ids/loss_mask/behaviour_logprobs", f"not a flat numeric list: {exc}") from None
    if tokens.ndim != 1 or len(tokens) == 0:
        raise bad("token_ids", "must be a non-empty flat list")
    if tokens.dtype.kind not in "iu":
        raise bad("token_ids", f"must hold integers, got {tokens.dtype}")
    if tokens.min() < 0 or tokens.max() > _INT32_MAX:
        raise bad("token_ids", f"ids must lie in [0, {_INT32_MAX}]")
    for name, arr in (("loss_mask", mask), ("behaviour_logprobs", logprobs)):
        if arr.ndim != 1 or len(arr) != len(tokens):
            raise bad(name, f"has length {arr.size}, token_ids has {len(tokens)}")
    if mask.dtype.kind not in "iub":
        raise bad("loss_mask", f"must hold 0/1 integers, got {mask.dtype}")
    off = ~np.isin(mask, (0, 1))
    if off.any():
        i = int(np.argmax(off))
        raise bad("loss_mask", f"values must be 0 or 1, got {mask[i]} at position {i}")
    sampled = mask == 1
    if not sampled.any():
        raise bad("loss_mask", "marks no sampled token (nothing to train on)")
    with np.errstate(over="ignore"):
        lp32 = logprobs.astype(np.float32)
    wrong = sampled & ~(np.isfinite(lp32) & (lp32 <= 0))
    if wrong.any():
        i = int(np.argmax(wrong))
        raise bad("behaviour_logprobs", f"must be finite and <= 0 where loss_mask is 1, "
                  f"got {logprobs[i]} at position {i}")
    nonzero = ~sampled & (lp32 != 0)
    if nonzero.any():
        i = int(np.argmax(nonzero))
        raise bad("behaviour_logprobs", f"must be 0 where loss_mask is 0, got {logprobs[i]} "
                  f"at position {i}")
    if s.move not in MOVES:
        raise bad("move", f"must be one of {MOVES}, got {s.move!r}")
    if s.allowed_tokens is not None:
        n_sampled = int(sampled.sum())
        if len(s.allowed_tokens) != n_sampled:
            raise bad("allowed_tokens", f"has {len(s.allowed_tokens)} sets for {n_sampled} "
                      "sampled tokens")
        for k, (pos, allowed) in enumerate(zip(np.flatnonzero(sampled), s.allowed_tokens,
                                               strict=True)):
            if int(tokens[pos]) not in allowed:
                raise bad("allowed_tokens", f"set {k} does not hold the sampled token "
                          f"{int(tokens[pos])} at position {int(pos)}")
    return tokens.astype(np.int32), mask.astype(np.int8), lp32


def _list_array(parts: list[np.ndarray], dtype: pa.DataType) -> pa.ListArray:
    lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = pa.array(np.concatenate(parts), type=dtype)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32), pa.int32()), values)


def samples_to_table(seq: int, samples: Sequence[Sample]) -> pa.Table:
    """Validate every sample and build the batch table (the schema's metadata included)."""
    if not samples:
        raise SpoolError("a batch needs at least one sample")
    seen: set[str] = set()
    arrays = []
    for s in samples:
        arrays.append(_checked_arrays(s))
        if s.sample_id in seen:
            raise SampleError(s.sample_id, "sample_id", "appears twice in one batch")
        seen.add(s.sample_id)
    if sum(len(a[0]) for a in arrays) > _INT32_MAX:
        raise SpoolError(f"batch {seq}: more than {_INT32_MAX} tokens; split it")
    n = len(samples)
    columns = [
        pa.array(np.full(n, seq, dtype=np.int64)),
        pa.array([s.sample_id for s in samples], pa.string()),
        pa.array([s.role for s in samples], pa.string()),
        pa.array([s.env_id for s in samples], pa.string()),
        pa.array([int(s.policy_version) for s in samples], pa.int64()),
        _list_array([a[0] for a in arrays], pa.int32()),
        _list_array([a[1] for a in arrays], pa.int8()),
        _list_array([a[2] for a in arrays], pa.float32()),
        pa.array(np.array([s.advantage for s in samples], dtype=np.float32)),
        pa.array(np.array([s.reward for s in samples], dtype=np.float32)),
        pa.array([s.episode_id for s in samples], pa.string()),
        pa.array([bool(s.hinted) for s in samples], pa.bool_()),
        pa.array([s.created_at for s in samples], pa.timestamp("us", tz="UTC")),
        pa.array([s.move for s in samples], pa.string()),
        pa.array([None if s.allowed_tokens is None else [list(map(int, a))
                                                          for a in s.allowed_tokens]
                  for s in samples], pa.list_(pa.list_(pa.int32()))),
    ]
    return pa.Table.from_arrays(columns, schema=BATCH_SCHEMA)


def upgrade_v1(table: pa.Table) -> pa.Table:
    """A v1 batch (written before moves and constraints existed) read as v2: every sample
    free-decoded, designer samples written by the write move."""
    n = table.num_rows
    moves = pa.array(["write" if r == "designer" else "" for r in table["role"].to_pylist()],
                     pa.string())
    table = table.append_column(BATCH_SCHEMA.field("move"), moves)
    table = table.append_column(BATCH_SCHEMA.field("allowed_tokens"),
                                pa.nulls(n, pa.list_(pa.list_(pa.int32()))))
    return table.replace_schema_metadata(BATCH_SCHEMA.metadata)


@dataclass(frozen=True)
class Batch:
    """One claimed batch: `table` for columnar use (the trainer), `samples()` for Python use."""

    seq: int
    table: pa.Table
    schema_version: int

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def num_tokens(self) -> int:
        return int(pc.sum(pc.list_value_length(self.table["token_ids"])).as_py())

    def samples(self) -> list[Sample]:
        return [
            Sample(**{k: v for k, v in row.items() if k != "seq"})
            for row in self.table.to_pylist()
        ]
