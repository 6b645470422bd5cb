"""Environment memory on LanceDB (DESIGN §7): schema, embeddings, novelty filter, MMR retrieval,
PLR replay sampler, and the queries behind `spade memory`. Must never import spade_async or
trainer: the daemon and the CLI depend on this package, not the other way round."""

from memory_db.config import MemoryConfig, ReplayConfig
from memory_db.embed import HashEmbedder, MiniLMEmbedder, make_embedder
from memory_db.records import EnvRecord, EnvStats, Hit, InsertResult, NewEnv, Summary
from memory_db.schema import SCHEMA_VERSION, SchemaError, env_id
from memory_db.store import EnvMemory, open_memory
from memory_db.writer import MemoryClosed

__all__ = [
    "SCHEMA_VERSION", "EnvMemory", "EnvRecord", "EnvStats", "HashEmbedder", "Hit",
    "InsertResult", "MemoryClosed", "MemoryConfig", "MiniLMEmbedder", "NewEnv", "ReplayConfig",
    "SchemaError", "Summary", "env_id", "make_embedder", "open_memory",
]
