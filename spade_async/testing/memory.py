"""An in-process MemoryPort for daemon tests that are about the loop, not about LanceDB.
The real memory (memory_db on LanceDB) has its own tests; this double keeps the same contract:
accepted and rejected designs are both stored, with reasons."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from spade_async.envs.validation_report import ValidationReport
from spade_async.loop.ports import StoredEnv
from spade_async.reward.regret import DesignStatus, EnvRegret


@dataclass
class DictMemory:
    envs: dict[str, dict] = field(default_factory=dict)
    plays: list[tuple[str, list[float], list[float], EnvRegret, bool]] = field(default_factory=list)
    replay_ids: list[str] = field(default_factory=list)
    params_played: list[dict] = field(default_factory=list)
    failures_recorded: list[tuple[str, int, dict]] = field(default_factory=list)
    sandbox_failures: list[int] = field(default_factory=list)  # per recorded play

    async def examples(self, query: str, k: int) -> list[str]:
        accepted = [e["code"] for e in self.envs.values() if e["status"] == "accepted"]
        return accepted[:k]

    async def add_design(self, code, report: ValidationReport | None, *, doc_id, chunk_id,
                         excerpt, policy_version):
        env_id = hashlib.sha256((code or f"none:{len(self.envs)}").encode()).hexdigest()[:16]
        if code is None:
            status, reason = DesignStatus.INVALID, "no_code: the reply holds no Environment class"
        elif not report.accepted:
            status, reason = DesignStatus.INVALID, report.reason
        elif any(e["code"] == code and e["status"] == "accepted" for e in self.envs.values()):
            status, reason = DesignStatus.DUPLICATE, "duplicate of " + env_id
        else:
            status, reason = DesignStatus.ACCEPTED, ""
        self.envs.setdefault(env_id, {"code": code, "doc_id": doc_id, "chunk_id": chunk_id,
                                      "status": "accepted" if status is DesignStatus.ACCEPTED
                                      else "rejected", "reason": reason,
                                      "policy_version": policy_version})
        return status, env_id if status is DesignStatus.ACCEPTED else None, reason

    async def record_failures(self, env_id, n, params=None):
        self.failures_recorded.append((env_id, n, dict(params or {})))

    async def record_play(self, env_id, unhinted, hinted, params=None, hint_copies=None,
                          sandbox_failures=0):
        self.plays.append((env_id, unhinted, hinted))
        self.sandbox_failures.append(sandbox_failures)
        self.params_played.append(dict(params or {}))

    async def variants(self, env_id):
        """Played variants of `env_id` as memory_db.records.VariantStats-like views."""
        from memory_db.records import EnvStats, VariantStats
        from memory_db.schema import variant_id

        by: dict[str, list] = {}
        for (eid, unhinted, hinted), params in zip(self.plays, self.params_played,
                                                         strict=True):
            if eid == env_id:
                by.setdefault(variant_id(eid, params), [params, [], []])
                by[variant_id(eid, params)][1] += unhinted
                by[variant_id(eid, params)][2] += hinted
        out = []
        for vid, (params, u, h) in by.items():
            solved = sum(x >= 1 for x in u) / len(u) if u else None
            stats = EnvStats(id=vid, episodes_unhinted=len(u), episodes_hinted=len(h),
                             mean_unhinted=sum(u) / len(u) if u else None,
                             mean_hinted=sum(h) / len(h) if h else None,
                             learnability=None if solved is None else solved * (1 - solved))
            out.append(VariantStats(env_id, params, stats))
        return sorted(out, key=lambda v: -v.episodes)

    async def sample_played(self):
        """The most recent play's variant (deterministic for tests)."""
        from memory_db.schema import variant_id

        if not self.plays:
            return None
        env_id, params = self.plays[-1][0], self.params_played[-1]
        e = self.envs[env_id]
        return StoredEnv(env_id, e["code"], env_id, params=params,
                         variant_id=variant_id(env_id, params))

    async def accepted_count(self) -> int:
        return sum(e["status"] == "accepted" for e in self.envs.values())

    async def fixed_pool(self):
        return [StoredEnv(i, e["code"], i) for i, e in self.envs.items()
                if e["status"] == "accepted"]

    async def sample_replay(self):
        for env_id in self.replay_ids:
            e = self.envs[env_id]
            return StoredEnv(env_id, e["code"], env_id)
        return None
