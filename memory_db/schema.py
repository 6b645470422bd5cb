"""The memory's tables, their Arrow schemas, the schema version and its migrations.

Three tables live under one LanceDB URI:
- `envs`: one row per environment ever proposed, written once (code and embedding are never
  rewritten);
- `env_stats`: running episode statistics and replay state of each *variant*, keyed by variant
  id, upserted with `merge_insert` (LanceDB's merge_insert replaces whole matched rows, so
  keeping these small rows apart is what keeps stats updates from rewriting the code column).
  A variant is an environment played at given difficulty knobs (`params`, DESIGN §12): the
  row names its environment (`env_id`, the family) and its params as canonical JSON;
- `meta`: key -> JSON value: schema version, embedding model and dimension, replay tick, index
  training history.

`open_tables` creates a fresh database, upgrades an older one through `MIGRATIONS`, or refuses
with a message that says what it found; it never writes into a layout it does not recognise.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import pyarrow as pa

if TYPE_CHECKING:  # annotations only: ids and schemas need no LanceDB (nor `spade --help`)
    from lancedb import AsyncConnection
    from lancedb.table import AsyncTable

SCHEMA_VERSION = 3  # v2: env_stats rows are variants (env_id, params); v3: hint_leak and
# sandbox_failures per variant
ENVS, STATS, META = "envs", "env_stats", "meta"
ID_HEX_CHARS = 16  # 64 bits of sha256: a collision needs ~4e9 environments

TS = pa.timestamp("us", tz="UTC")


class SchemaError(RuntimeError):
    """The database at the URI cannot be used by this code as it is; the message says why."""


def envs_schema(dim: int) -> pa.Schema:
    return pa.schema([
        pa.field("id", pa.string(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("description", pa.string()),
        pa.field("code", pa.string()),
        pa.field("source_doc_id", pa.string()),
        pa.field("source_excerpt", pa.string()),
        pa.field("embedding", pa.list_(pa.float32(), dim)),
        pa.field("created_at", TS),
        pa.field("policy_version", pa.int64()),
        pa.field("status", pa.string()),  # accepted | rejected
        pa.field("reason", pa.string()),   # why rejected ("" when accepted)
        pa.field("tags", pa.list_(pa.string())),
    ])


STATS_SCHEMA = pa.schema([
    pa.field("id", pa.string(), nullable=False),       # variant id (`variant_id`)
    pa.field("env_id", pa.string(), nullable=False),   # the environment (family) it varies
    pa.field("params", pa.string(), nullable=False),   # `canonical_params`; "{}" = the default
    pa.field("episodes_hinted", pa.int64()),
    pa.field("episodes_unhinted", pa.int64()),
    pa.field("mean_hinted", pa.float64()),
    pa.field("mean_unhinted", pa.float64()),
    pa.field("regret_last", pa.float64()),
    pa.field("regret_ema", pa.float64()),
    pa.field("learnability", pa.float64()),
    pa.field("hint_leak", pa.float64()),  # share of hinted episodes won by copying the hint
    pa.field("sandbox_failures", pa.int64()),  # episodes the environment's code failed (no score)
    pa.field("times_replayed", pa.int64()),
    pa.field("last_played", TS),
    pa.field("last_tick", pa.int64()),  # replay clock value at the last visit (staleness)
    pa.field("updated_at", TS),
])

META_SCHEMA = pa.schema([
    pa.field("key", pa.string(), nullable=False),
    pa.field("value", pa.string()),  # JSON
])


def env_id(code: str) -> str:
    """Content hash of the code, insensitive to line endings and trailing whitespace."""
    norm = "\n".join(line.rstrip() for line in code.replace("\r\n", "\n").strip().split("\n"))
    return hashlib.sha256(norm.encode()).hexdigest()[:ID_HEX_CHARS]


def canonical_params(params: dict[str, Any] | None) -> str:
    """One spelling per params dict (keys sorted, no spaces): what is stored and hashed, so
    equal params always name the same variant. TypeError when a value is not JSON."""
    return json.dumps(params or {}, sort_keys=True, separators=(",", ":"))


def variant_id(env_id: str, params: dict[str, Any] | None) -> str:
    """The stats key of `env_id` played with `params`. No params: the environment's own id, so
    every row written before variants existed (and every caller that passes none) keeps its key.
    The daemon passes resolved params (every knob, defaults filled in), so one variant has one
    id; the hash cannot know a knob's default, so {"n": 3} and {} are two ids even when 3 is
    n's default, which is why callers must not mix resolved and unresolved params."""
    if not params:
        return env_id
    digest = hashlib.sha256(canonical_params(params).encode()).hexdigest()[:8]
    return f"{env_id}.{digest}"


def sql_str(value: str) -> str:
    """A SQL string literal for LanceDB filters."""
    return "'" + value.replace("'", "''") + "'"


def now_utc() -> datetime:
    return datetime.now(UTC)


@dataclass
class Tables:
    envs: AsyncTable
    stats: AsyncTable
    meta: AsyncTable
    info: dict[str, Any]  # the meta table as read at open


async def read_meta(meta: AsyncTable) -> dict[str, Any]:
    rows = (await meta.query().to_arrow()).to_pylist()
    return {r["key"]: json.loads(r["value"]) for r in rows}


def meta_rows(values: dict[str, Any]) -> pa.Table:
    return pa.table({"key": list(values), "value": [json.dumps(v) for v in values.values()]},
                    schema=META_SCHEMA)


async def write_meta(meta: AsyncTable, values: dict[str, Any]) -> None:
    await (meta.merge_insert("key").when_matched_update_all().when_not_matched_insert_all()
           .execute(meta_rows(values)))


# version n -> n+1, applied in order by the writer (readers refuse an old layout instead).
Migration = Callable[["AsyncConnection", dict[str, Any]], Awaitable[None]]


async def _v1_to_v2(db: AsyncConnection, info: dict[str, Any]) -> None:
    """env_stats rows become variants: every v1 row is its environment's default variant
    (env_id = id, params "{}"). One `add_columns` commit, so a crash leaves v1 or v2 whole;
    a crash between it and the version bump is caught by the column check on the retry."""
    stats = await db.open_table(STATS)
    have = set((await stats.schema()).names)
    missing = {name: expr for name, expr in (("env_id", "id"), ("params", "'{}'"))
               if name not in have}
    if missing:
        await stats.add_columns(missing)


async def _v2_to_v3(db: AsyncConnection, info: dict[str, Any]) -> None:
    """env_stats gets hint_leak (null on every existing row: never measured) and
    sandbox_failures (0), in one commit."""
    stats = await db.open_table(STATS)
    have = set((await stats.schema()).names)
    missing = {name: expr for name, expr in (("hint_leak", "CAST(NULL AS DOUBLE)"),
                                             ("sandbox_failures", "CAST(0 AS BIGINT)"))
               if name not in have}
    if missing:
        await stats.add_columns(missing)


MIGRATIONS: dict[int, Migration] = {1: _v1_to_v2, 2: _v2_to_v3}


async def _table_names(db: AsyncConnection) -> set[str]:
    names: set[str] = set()
    token = None
    while True:
        page = await db.list_tables(page_token=token)
        names.update(page.tables)
        token = page.page_token
        if not token:
            return names


def _check_columns(name: str, actual: pa.Schema, expected: pa.Schema, uri: str) -> None:
    problems = []
    for field in expected:
        if field.name not in actual.names:
            problems.append(f"missing column '{field.name}'")
        elif not actual.field(field.name).type.equals(field.type):
            problems.append(f"column '{field.name}' is {actual.field(field.name).type}, "
                            f"expected {field.type}")
    if problems:
        raise SchemaError(f"{uri}: table '{name}' does not match schema v{SCHEMA_VERSION}: "
                          + "; ".join(problems))


async def open_tables(db: AsyncConnection, uri: str, *, model: str, dim: int, writable: bool,
                      timeout_s: float) -> Tables:
    """Open (or, when writable, create / upgrade) the three tables and check they fit."""
    with anyio.fail_after(timeout_s):
        names = await _table_names(db)
    if META not in names:
        present = sorted(names & {ENVS, STATS})
        if present:
            # Only an interrupted creation leaves our tables without `meta`, and leaves them
            # empty; anything else here is not ours to write into.
            with anyio.fail_after(timeout_s):
                rows = [await (await db.open_table(n)).count_rows() for n in present]
            if any(rows):
                raise SchemaError(f"{uri}: has table(s) {present} but no '{META}' table: not a "
                                  "memory_db database (or one from before schema versioning); "
                                  "refusing to touch it")
        if not writable:
            raise SchemaError(f"{uri}: no environment memory here yet (nothing has been added)")
        with anyio.fail_after(timeout_s):
            await db.create_table(ENVS, schema=envs_schema(dim), exist_ok=True)
            await db.create_table(STATS, schema=STATS_SCHEMA, exist_ok=True)
            # `meta` is created last and with its rows in one commit: its presence means the
            # database is complete.
            await db.create_table(META, data=meta_rows({
                "schema_version": SCHEMA_VERSION, "embedding_model": model, "embedding_dim": dim,
                "created_at": now_utc().isoformat(), "replay_tick": 0}), schema=META_SCHEMA)
    elif {ENVS, STATS} - names:
        raise SchemaError(f"{uri}: the '{META}' table is there but table(s) "
                          f"{sorted({ENVS, STATS} - names)} are missing; refusing to open it")
    with anyio.fail_after(timeout_s):
        meta = await db.open_table(META)
        info = await read_meta(meta)
    version = info.get("schema_version")
    if not isinstance(version, int):
        raise SchemaError(f"{uri}: the '{META}' table has no schema version; refusing to open it")
    if version > SCHEMA_VERSION:
        raise SchemaError(f"{uri}: schema v{version} was written by a newer memory_db; this code "
                          f"reads up to v{SCHEMA_VERSION}")
    if version < SCHEMA_VERSION:
        if not writable:
            raise SchemaError(f"{uri}: schema v{version} needs an upgrade to v{SCHEMA_VERSION}; "
                              "open it once with the writer (the daemon or `spade memory add`)")
        while version < SCHEMA_VERSION:
            step = MIGRATIONS.get(version)
            if step is None:
                raise SchemaError(f"{uri}: schema v{version} has no upgrade path to "
                                  f"v{SCHEMA_VERSION}; refusing to open it")
            with anyio.fail_after(timeout_s):
                await step(db, info)
                version += 1
                await write_meta(meta, {"schema_version": version})
                info = await read_meta(meta)
    stored_model, stored_dim = info.get("embedding_model"), info.get("embedding_dim")
    if (stored_model, stored_dim) != (model, dim):
        raise SchemaError(f"{uri}: embeddings in this memory are {stored_model} "
                          f"(dim {stored_dim}), but the config asks for {model} (dim {dim}); "
                          "use the stored model or a fresh URI")
    with anyio.fail_after(timeout_s):
        envs = await db.open_table(ENVS)
        stats = await db.open_table(STATS)
        _check_columns(ENVS, await envs.schema(), envs_schema(dim), uri)
        _check_columns(STATS, await stats.schema(), STATS_SCHEMA, uri)
    return Tables(envs=envs, stats=stats, meta=meta, info=info)
