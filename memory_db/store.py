"""`EnvMemory`: the environment memory's API. Reads (`MemoryReads`) run on any process (the CLI
reads while the daemon writes); writes go through the one `Writer` task of the process that
opened it writable.

    async with open_memory(cfg, uri) as mem:                # writable: runs the writer
        res = await mem.insert(NewEnv(code, name, description))
        hits = await mem.search("grid navigation", k=5)     # MMR over the top fetch_k hits
        await mem.record_episodes(res.id, hinted=[1, 1], unhinted=[0, 1], params={"n": 5})
        drawn = await mem.sample_replay(rng)                # PLR: (variant id, p), or None
        v = await mem.variant(drawn[0])                     # its environment and params

Novelty and MMR work on environments; replay draws variants.

Every await on the database has a deadline (`db_timeout_s`; writes `write_timeout_s`).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, Literal

import anyio
import lancedb
from anyio.abc import TaskStatus

from memory_db.config import MemoryConfig
from memory_db.embed import Embedder, aembed, env_text, make_embedder
from memory_db.ops import InsertPayload, MaintainPayload, MemoryClosed, RecordPayload, SamplePayload
from memory_db.reads import MemoryReads
from memory_db.records import EnvStats, InsertResult, NewEnv
from memory_db.schema import Tables, canonical_params, open_tables, variant_id
from memory_db.stats import Episodes
from memory_db.writer import Writer


class EnvMemory(MemoryReads):
    """The memory at `uri`: `open()` it (writable: with its writer, which `run()` serves), read
    it (`MemoryReads`), write through the writer, `close()` it."""

    def __init__(self, cfg: MemoryConfig, uri: str, *, writable: bool = False,
                 embedder: Embedder | None = None) -> None:
        if not uri:
            raise ValueError("the memory needs a resolved URI (the caller picks the default)")
        self.cfg, self.uri, self.writable = cfg, uri, writable
        self.embedder = embedder or make_embedder(cfg.embedding_model, cfg.embed_batch_size)
        if self.embedder.name != cfg.embedding_model:
            raise ValueError(f"embedder {self.embedder.name} does not match the configured "
                             f"model {cfg.embedding_model}")
        self._t: Tables | None = None
        self._writer: Writer | None = None
        # Bounded caches: with every read checking for the newest version, LanceDB's default
        # session keeps each version's manifest and footers it saw (GBs before it evicts).
        self.session = lancedb.Session(
            index_cache_size_bytes=cfg.index_cache_mb << 20,
            metadata_cache_size_bytes=cfg.metadata_cache_mb << 20)

    # ---- lifecycle -----------------------------------------------------------------------

    async def open(self) -> None:
        with anyio.fail_after(self.cfg.db_timeout_s):
            db = await lancedb.connect_async(
                self.uri, storage_options=dict(self.cfg.storage_options) or None,
                read_consistency_interval=timedelta(seconds=self.cfg.read_consistency_s),
                session=self.session)
        self._t = await open_tables(db, self.uri, model=self.embedder.name,
                                    dim=self.embedder.dim, writable=self.writable,
                                    timeout_s=self.cfg.db_timeout_s)
        if self.writable:
            self._writer = Writer(self.cfg, self._t, self.embedder.dim)
            await self._writer.load()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The writer service: returns once `close()` was called and the queue is committed."""
        if self._writer is None:
            raise MemoryClosed("opened read-only: there is no writer to run")
        await self._writer.run(task_status=task_status)

    async def close(self, timeout_s: float | None = None) -> None:
        """Stop taking writes and wait (shielded, bounded) for the queued ones to commit."""
        if self._writer is None:
            return
        self._writer.close()
        with anyio.move_on_after(timeout_s or self.cfg.db_timeout_s, shield=True):
            await self._writer.finished.wait()

    def _w(self) -> Writer:
        if self._writer is None:
            raise MemoryClosed(f"{self.uri} is open read-only")
        return self._writer

    # ---- writes (through the writer) ------------------------------------------------------

    async def insert(self, env: NewEnv) -> InsertResult:
        return (await self.insert_many([env]))[0]

    async def insert_many(self, envs: Sequence[NewEnv]) -> list[InsertResult]:
        """Embed (batched, in a worker thread), then insert through the writer's novelty filter.
        Results are in input order; each is committed when this returns."""
        writer = self._w()
        vectors = await aembed(self.embedder, [env_text(e.name, e.description, e.code)
                                               for e in envs])
        return await writer.submit_many(
            [InsertPayload(e, v) for e, v in zip(envs, vectors, strict=True)])

    async def record_episodes(self, env_id: str, *, hinted: Iterable[float] = (),
                              unhinted: Iterable[float] = (),
                              params: dict[str, Any] | None = None,
                              hint_copies: Iterable[float] = (),
                              sandbox_failures: int = 0) -> EnvStats:
        """One evaluation's episode scores of environment `env_id` played at `params`: updates
        that variant's counts, means, regret EMA, learnability (creating its row on first play)
        and returns its stats (`id` is the variant id). No params: the default variant, whose id
        is the environment's. Pass resolved params (every knob, defaults filled), or the same
        variant ends up under two ids. `hint_copies` (none, or one per hinted episode): how far
        each hinted episode won by copying the hint; their running mean is `hint_leak`.
        `sandbox_failures`: episodes of this play that failed on the environment's own code
        (counted, never scores; a play may consist of nothing else)."""
        episodes = Episodes(tuple(float(x) for x in hinted), tuple(float(x) for x in unhinted),
                            tuple(float(x) for x in hint_copies), int(sandbox_failures))
        canon = canonical_params(params)  # a value that is not JSON fails here, in the caller
        return await self._w().submit(
            RecordPayload(env_id, canon, variant_id(env_id, params), episodes))

    async def sample_replay(self, rng: random.Random) -> tuple[str, float] | None:
        """Draw one played variant by P_replay and mark it visited: (variant id, its
        probability); `variant()` has its environment and params. None when nothing has been
        played yet."""
        return await self._w().submit(SamplePayload(rng.random()))

    async def maintain(self, *, optimize: bool = True,
                       index: Literal["auto", "force", "skip"] = "auto") -> dict[str, Any]:
        """Run maintenance now, in the writer (between batches)."""
        return await self._w().submit(MaintainPayload(optimize, index))


@asynccontextmanager
async def open_memory(cfg: MemoryConfig, uri: str, *, writable: bool = True,
                      embedder: Embedder | None = None) -> AsyncIterator[EnvMemory]:
    """Open the memory; when writable, run its writer for the duration of the block and commit
    what is queued on the way out."""
    mem = EnvMemory(cfg, uri, writable=writable, embedder=embedder)
    await mem.open()
    if not writable:
        yield mem
        return
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(mem.run)
            try:
                yield mem
            finally:
                await mem.close()
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The task group wraps the caller's own exception; hand a lone one back unwrapped so
        # `except KeyError:` around the block still works.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise

