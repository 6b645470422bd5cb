"""Environment memory on LanceDB (DESIGN §7): schema, embeddings, novelty filter, MMR retrieval,
PLR replay sampler, and the queries behind `spade memory`. Must never import spade_async or
trainer: the daemon and the CLI depend on this package, not the other way round.

Names are resolved lazily: importing `memory_db.config` (the config tree does) must not pull in
LanceDB and torch, which every `spade` command would otherwise pay for at start.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "MemoryConfig": "memory_db.config", "ReplayConfig": "memory_db.config",
    "HashEmbedder": "memory_db.embed", "MiniLMEmbedder": "memory_db.embed",
    "make_embedder": "memory_db.embed",
    "EnvRecord": "memory_db.records", "EnvStats": "memory_db.records", "Hit": "memory_db.records",
    "InsertResult": "memory_db.records", "NewEnv": "memory_db.records",
    "Summary": "memory_db.records", "VariantStats": "memory_db.records",
    "SCHEMA_VERSION": "memory_db.schema", "SchemaError": "memory_db.schema",
    "canonical_params": "memory_db.schema", "env_id": "memory_db.schema",
    "variant_id": "memory_db.schema",
    "EnvMemory": "memory_db.store", "open_memory": "memory_db.store",
    "MemoryClosed": "memory_db.ops",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'memory_db' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
