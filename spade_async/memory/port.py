"""The daemon's view of the environment memory (`loop.ports.MemoryPort`) on `memory_db.EnvMemory`.

Maps a design's outcome to the memory's records: accepted (novel and valid), rejected with the
validator's reason (invalid), or rejected as a near-copy of an accepted one (duplicate, the
neighbour's id in the reason). A reply with no code at all is not an environment and is not
stored; the daemon counts it. Plays are recorded per variant (the environment at its params);
replay hands back a variant.
"""

from __future__ import annotations

import random
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from memory_db.records import NewEnv, VariantStats
from memory_db.schema import variant_id
from memory_db.store import EnvMemory
from memory_db.store import open_memory as _open_memory
from spade_async.core.config import SpadeConfig, memory_config
from spade_async.envs.validation_report import ValidationReport
from spade_async.loop.ports import StoredEnv
from spade_async.reward.regret import DesignStatus

_NAME = re.compile(r"""^\s*name\s*(?::\s*str\s*)?=\s*["']([^"']{1,80})["']""", re.M)
_DESC = re.compile(r"""^\s*description\s*(?::\s*str\s*)?=\s*["']([^"']{1,400})""", re.M)


class LanceMemoryPort:
    def __init__(self, mem: EnvMemory, seed: int = 0) -> None:
        self.mem = mem
        self.rng = random.Random(seed)
        self._unseen: list[str] | None = None

    def cache_bytes(self) -> int:
        """What LanceDB's caches of this process hold now (bounded by memory.*_cache_mb)."""
        return int(self.mem.session.size_bytes)

    async def examples(self, query: str, k: int) -> list[str]:
        hits = await self.mem.search(query, k=k, diverse=True, code=True)
        return [h.record.code for h in hits if h.record.code]

    async def add_design(self, code: str | None, report: ValidationReport | None, *,
                         doc_id: str, chunk_id: str, excerpt: str, policy_version: int,
                         ) -> tuple[DesignStatus, str | None, str]:
        if code is None or report is None:
            return DesignStatus.INVALID, None, "no_code: the reply holds no Environment class"
        if report.meta is not None:
            name, desc = report.meta.name, report.meta.description
        else:
            m, d = _NAME.search(code), _DESC.search(code)
            name, desc = (m.group(1) if m else "unnamed"), (d.group(1) if d else "")
        res = await self.mem.insert(NewEnv(
            code=code, name=name, description=desc, source_doc_id=doc_id,
            source_excerpt=excerpt[:1000], policy_version=policy_version, tags=(chunk_id,),
            rejected_reason=None if report.accepted else report.reason,
        ))
        if res.status == "accepted" and not res.existed:
            return DesignStatus.ACCEPTED, res.id, ""
        if res.existed and res.status == "accepted":
            return DesignStatus.DUPLICATE, None, f"duplicate: the same code as {res.id}"
        if res.reason.startswith("duplicate"):
            return DesignStatus.DUPLICATE, None, res.reason
        return DesignStatus.INVALID, None, res.reason

    async def record_play(self, env_id: str, unhinted: list[float], hinted: list[float],
                          params: dict[str, Any] | None = None,
                          hint_copies: list[float] | None = None,
                          sandbox_failures: int = 0) -> None:
        await self.mem.record_episodes(env_id, hinted=hinted, unhinted=unhinted, params=params,
                                       hint_copies=hint_copies or (),
                                       sandbox_failures=sandbox_failures)

    async def record_failures(self, env_id: str, n: int,
                              params: dict[str, Any] | None = None) -> None:
        await self.mem.record_episodes(env_id, params=params, sandbox_failures=n)

    async def variants(self, env_id: str) -> list[VariantStats]:
        """The environment's variants with their statistics, most played first (what the
        designer's edit move shows the model)."""
        return await self.mem.variants(env_id)

    async def accepted_count(self) -> int:
        return await self.mem.count("accepted")

    async def fixed_pool(self) -> list[StoredEnv]:
        return [StoredEnv(r["id"], r["code"] or "", r["name"])
                async for r in self.mem.export(code=True, status="accepted")]

    async def sample_replay(self) -> StoredEnv | None:
        """Accepted environments never played (the bootstrap seeds, or a design whose play a
        crash cut short) come first, oldest first, with params {} (the daemon plays them at
        their easiest point or defaults, `daemon.unseen_rung`): PLR's unseen levels. Then
        PLR's draw over the played variants. The unseen list is read once per daemon; new
        designs are played when they are accepted, so they never join it."""
        if self._unseen is None:
            records = await self.mem.list(status="accepted", limit=None)
            self._unseen = [r.id for r in sorted(records, key=lambda r: (r.created_at, r.id))
                            if not r.stats.episodes_unhinted]
        if self._unseen:
            return await self._stored(self._unseen.pop(0), {})
        return await self.sample_played()

    async def sample_played(self) -> StoredEnv | None:
        """PLR's draw over the played variants only (what the edit move starts from, as ACCEL
        edits levels from its replay buffer); None when nothing has been played yet."""
        drawn = await self.mem.sample_replay(self.rng)
        if drawn is None:
            return None
        try:
            variant = await self.mem.variant(drawn[0])
            return await self._stored(variant.env_id, variant.params)
        except KeyError:  # retired by the memory's capacity since it was drawn
            return None

    async def _stored(self, env_id: str, params: dict[str, Any]) -> StoredEnv:
        rec = await self.mem.get(env_id, code=True)
        return StoredEnv(rec.id, rec.code or "", rec.name, params=params,
                         variant_id=variant_id(rec.id, params))


@asynccontextmanager
async def open_memory(cfg: SpadeConfig) -> AsyncIterator[LanceMemoryPort]:
    mcfg, uri = memory_config(cfg)
    async with _open_memory(mcfg, uri, writable=True) as mem:
        yield LanceMemoryPort(mem, seed=cfg.corpus.seed)
