"""Table rows <-> the memory's records: env_stats rows to and from EnvStats / VariantStats, the
`envs` rows of an insert batch, and an `envs` row read back as an EnvRecord."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

from memory_db.ops import InsertPayload
from memory_db.records import EnvRecord, EnvStats, InsertResult, VariantStats
from memory_db.schema import STATS_SCHEMA, envs_schema

VARIANT_COLUMNS = ("env_id", "params")  # the variant's identity; every other column is EnvStats
STAT_COLUMNS = [n for n in STATS_SCHEMA.names if n not in VARIANT_COLUMNS]
RECORD_COLUMNS = ["id", "name", "description", "status", "reason", "source_doc_id",
                  "source_excerpt", "created_at", "policy_version", "tags"]


def stats_from_row(row: dict[str, Any]) -> EnvStats:
    return EnvStats(**{k: row[k] for k in STAT_COLUMNS})


def variant_from_row(row: dict[str, Any]) -> VariantStats:
    return VariantStats(env_id=row["env_id"], params=json.loads(row["params"]),
                        stats=stats_from_row(row))


def stats_table(rows: list[EnvStats], family: dict[str, tuple[str, str]]) -> pa.Table:
    """Rows of env_stats; `family` maps each variant id to (env_id, canonical params)."""
    cols: dict[str, list[Any]] = {name: [getattr(s, name) for s in rows] for name in STAT_COLUMNS}
    cols["env_id"] = [family[s.id][0] for s in rows]
    cols["params"] = [family[s.id][1] for s in rows]
    return pa.table({name: cols[name] for name in STATS_SCHEMA.names}, schema=STATS_SCHEMA)


def envs_table(rows: list[tuple[InsertPayload, InsertResult]], now: Any, dim: int) -> pa.Table:
    """Columnar, so a batch of thousands of 384-d rows does not go through Python lists."""
    envs = [p.env for p, _ in rows]
    vecs = np.stack([p.vector for p, _ in rows]).astype(np.float32, copy=False)
    cols = {
        "id": [r.id for _, r in rows], "name": [e.name for e in envs],
        "description": [e.description for e in envs], "code": [e.code for e in envs],
        "source_doc_id": [e.source_doc_id for e in envs],
        "source_excerpt": [e.source_excerpt for e in envs],
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), dim),
        "created_at": [now] * len(rows), "policy_version": [e.policy_version for e in envs],
        "status": [r.status for _, r in rows], "reason": [r.reason for _, r in rows],
        "tags": [list(e.tags) for e in envs],
    }
    return pa.table(cols, schema=envs_schema(dim))


def record_from_row(row: dict[str, Any], stats: EnvStats | None, code: bool = False) -> EnvRecord:
    """An `envs` row (RECORD_COLUMNS, plus `code` when asked for) with its aggregated stats."""
    return EnvRecord(
        id=row["id"], name=row["name"], description=row["description"], status=row["status"],
        reason=row["reason"] or "", source_doc_id=row["source_doc_id"] or "",
        source_excerpt=row["source_excerpt"] or "", created_at=row["created_at"],
        policy_version=row["policy_version"], tags=tuple(row["tags"] or ()),
        stats=stats or EnvStats(id=row["id"]), code=row.get("code") if code else None,
    )
