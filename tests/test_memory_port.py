"""The daemon's port onto the real LanceDB memory: what the fixed-environment baseline plays
(accepted environments only, with their code) and the replay order (never-played environments
first, oldest first, then PLR's draw over the played ones)."""

from __future__ import annotations

from pathlib import Path

import anyio

from memory_db.config import MemoryConfig
from spade_async.core.config import PathsConfig, SandboxConfig, SpadeConfig
from spade_async.envs.validate import validate
from spade_async.memory.port import open_memory
from spade_async.reward.regret import DesignStatus
from spade_async.sandbox.runtime import Sandbox
from spade_async.testing.scripted import ENV_CODE

REPO = Path(__file__).resolve().parents[1]


def test_fixed_pool_and_unseen_first_replay_on_lancedb(tmp_path):
    cfg = SpadeConfig(paths=PathsConfig(data_dir=tmp_path / "data"),
                      sandbox=SandboxConfig(slots=4, warm_workers=1),
                      memory=MemoryConfig(embedding_model="hash-384"))
    other = (REPO / "spade_async" / "envs" / "seeds" / "mastermind.py").read_text()

    async def main():
        async with Sandbox(cfg.sandbox) as sb:
            reports = [await validate(c, sb, cfg.validation)
                       for c in (ENV_CODE, other, "class Environment:\n    def f(:\n")]
        async with open_memory(cfg) as port:
            ids = []
            for code, report in zip((ENV_CODE, other, "class Environment:\n    def f(:\n"),
                                    reports, strict=True):
                status, env_id, _ = await port.add_design(
                    code, report, doc_id="d", chunk_id="d#0", excerpt="x", policy_version=0)
                ids.append((status, env_id))
            assert [s for s, _ in ids] == [DesignStatus.ACCEPTED, DesignStatus.ACCEPTED,
                                           DesignStatus.INVALID]
            pool = await port.fixed_pool()
            # The first environment is played; the second never was.
            await port.record_play(ids[0][1], [0.0, 1.0], [1.0, 1.0])
            await port.mem.close()  # commit what is queued before reading it back
        async with open_memory(cfg) as port:
            first = await port.sample_replay()
            then = await port.sample_replay()
        return ids, pool, first, then

    ids, pool, first, then = anyio.run(main)
    assert [e.env_id for e in pool] == [ids[0][1], ids[1][1]]
    assert [e.code for e in pool] == [ENV_CODE, other] and pool[0].name == "countdown"
    assert first.env_id == ids[1][1]  # never played: first
    assert then.env_id == ids[0][1]   # then PLR over the played one
