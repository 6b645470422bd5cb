"""The environment memory on a real LanceDB database under tmp_path: MMR retrieval, the novelty
filter (with the real MiniLM embedder), stats updates, the PLR replay sampler and its restart,
schema versioning, and the ANN index / optimize schedule. Large and synthetic sets use the
hash embedder; embedding quality is only what the MiniLM tests rely on."""

from __future__ import annotations

import random
from collections import Counter
from datetime import timedelta
from pathlib import Path

import anyio
import lancedb
import numpy as np
import pyarrow as pa
import pytest

from memory_db import (
    SCHEMA_VERSION,
    MemoryClosed,
    MemoryConfig,
    MiniLMEmbedder,
    NewEnv,
    SchemaError,
    open_memory,
)
from memory_db import schema as schema_mod
from memory_db.embed import HashEmbedder, env_text
from memory_db.mmr import mmr
from memory_db.replay import replay_distribution
from memory_db.schema import read_meta, write_meta

SEEDS = Path(__file__).resolve().parents[1] / "spade_async" / "envs" / "seeds"
FAST = {"writer": {"flush_interval_s": 0.005}}


def hash_cfg(**kw) -> MemoryConfig:
    return MemoryConfig(embedding_model="hash-128", **{**FAST, **kw})


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    return MiniLMEmbedder()


def env(i: int | str, description: str, **kw) -> NewEnv:
    return NewEnv(code=f"class Environment:\n    ident = {i!r}\n", name=f"env-{i}",
                  description=description, **kw)


# ---- MMR ----------------------------------------------------------------------------------


def test_mmr_function_orders_by_relevance_at_lambda_one_and_spreads_below():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(2, 16))
    vecs = np.stack([base[0] + 0.01 * rng.normal(size=16) for _ in range(4)]
                    + [base[1] + 0.01 * rng.normal(size=16)])
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    rel = np.array([0.9, 0.89, 0.88, 0.87, 0.5])
    assert mmr(rel, vecs, 3, 1.0) == [0, 1, 2]
    assert mmr(rel, vecs, 3, 0.5)[:2] == [0, 4]  # the lone far vector beats near-copies of 0
    assert sorted(mmr(rel, vecs, 10, 0.5)) == [0, 1, 2, 3, 4]  # k > n: every candidate once


CLUSTERS = 6
PER_CLUSTER = 8


def planted() -> list[NewEnv]:
    """Clusters of near-duplicates: cluster c shares 6 - c of the query's words, and its members
    differ from each other by one word only."""
    query_words = ["maze", "grid", "walk", "exit", "wall", "map"]
    out = []
    for c in range(CLUSTERS):
        words = query_words[: CLUSTERS - c] + [f"topic{c}x{j}" for j in range(4 + c)]
        for m in range(PER_CLUSTER):
            out.append(env(f"{c}-{m}", " ".join([*words, f"member{c}x{m}"]), tags=(f"c{c}",),
                           check_novelty=False))
    return out


async def test_mmr_covers_more_clusters_than_plain_top_k_and_lambda_one_equals_it(tmp_path):
    async with open_memory(hash_cfg(), str(tmp_path / "m")) as mem:
        await mem.insert_many(planted())
        q = "maze grid walk exit wall map"
        plain = await mem.search(q, k=6, diverse=False)
        diverse = await mem.search(q, k=6, diverse=True, lam=0.5, fetch_k=48)
        same = await mem.search(q, k=6, diverse=True, lam=1.0, fetch_k=48)
    cluster = lambda hits: {h.record.tags[0] for h in hits}  # noqa: E731
    assert len(plain) == len(diverse) == 6
    assert cluster(plain) == {"c0"}, [h.record.name for h in plain]  # all near-copies
    assert len(cluster(diverse)) >= 4, [h.record.name for h in diverse]
    assert [h.record.id for h in same] == [h.record.id for h in plain]
    assert [h.similarity for h in plain] == sorted((h.similarity for h in plain), reverse=True)


async def test_search_filters_by_status_tags_and_source(tmp_path):
    async with open_memory(hash_cfg(), str(tmp_path / "m")) as mem:
        await mem.insert_many([env(1, "maze walls", tags=("a",), source_doc_id="doc-1"),
                               env(2, "maze corridors", tags=("b",), source_doc_id="doc-2"),
                               env(3, "maze rooms", rejected_reason="hint: empty")])
        assert {h.record.name for h in await mem.search("maze", tags=["b"])} == {"env-2"}
        assert {h.record.name for h in await mem.search("maze", source_doc_id="doc-1")} == {
            "env-1"}
        assert {h.record.name for h in await mem.search("maze", status="rejected")} == {"env-3"}
        assert len(await mem.search("maze", status=None)) == 3
        # export filters by status in the scan (the edit move reads accepted code only)
        assert sorted([r["name"] async for r in mem.export(status="accepted")]) == ["env-1", "env-2"]
        assert [r["name"] async for r in mem.export(status="rejected")] == ["env-3"]
        with pytest.raises(ValueError, match="accepted or rejected"):
            [r async for r in mem.export(status="x")]


# ---- novelty ------------------------------------------------------------------------------


async def test_novelty_rejects_a_near_copy_naming_its_neighbour(tmp_path, minilm):
    maze = (SEEDS / "grid_maze.py").read_text()
    near_copy = maze.replace("HEIGHT, WIDTH = 7, 9", "HEIGHT, WIDTH = 7, 11").replace(
        "def _bfs(", "def _shortest_path(").replace("_bfs(", "_shortest_path(")
    assert near_copy != maze
    desc = "Navigate a maze over several turns to reach the goal."
    async with open_memory(MemoryConfig(**FAST), str(tmp_path / "m"), embedder=minilm) as mem:
        first = await mem.insert(NewEnv(maze, "grid_maze", desc))
        copy = await mem.insert(NewEnv(near_copy, "grid_maze", desc))
        other = await mem.insert(NewEnv((SEEDS / "calendar_booking.py").read_text(),
                                        "calendar_booking", "Book meetings into a calendar."))
        again = await mem.insert(NewEnv(maze + "\n\n", "grid_maze", desc))
        stored = await mem.get(copy.id)
        summary = await mem.summary()
    assert first.status == "accepted"
    assert copy.status == "rejected" and copy.neighbour_id == first.id
    assert first.id in copy.reason and copy.reason.startswith("duplicate")
    assert copy.similarity >= 0.95
    assert other.status == "accepted" and other.similarity < 0.95
    assert again.existed and again.id == first.id  # the same content hash: nothing written
    assert stored.status == "rejected" and first.id in stored.reason
    assert summary.counts == {"accepted": 2, "rejected": 1, "total": 3}
    assert summary.reasons == {"duplicate": 1}


async def test_duplicates_within_one_batch_are_caught(tmp_path):
    async with open_memory(hash_cfg(), str(tmp_path / "m")) as mem:
        body = "".join(f"    def step_{i}(self, action):\n        return {i}\n" for i in range(30))
        desc = "sort the numbers ascending"
        a, b, c = await mem.insert_many([NewEnv("class Environment:\n" + body, "sorter", desc),
                                         NewEnv("class Environment:\n" + body + "# v2\n",
                                                "sorter", desc),
                                         NewEnv("class Environment:\n" + body, "sorter", desc)])
    assert a.status == "accepted"
    assert b.status == "rejected" and b.neighbour_id == a.id
    assert c.existed and c.id == a.id


async def test_novelty_finds_the_accepted_neighbour_behind_a_crowd_of_rejected_copies(tmp_path):
    base = " ".join(f"word{i}" for i in range(150))
    async with open_memory(hash_cfg(), str(tmp_path / "m")) as mem:
        original = await mem.insert(env("a", base))
        crowd = await mem.insert_many([env(f"r{i}", f"{base} extra bits tail{i}",
                                           rejected_reason="types: bad reward")
                                       for i in range(12)])
        late = await mem.insert(env("late", f"{base} extra bits tail99"))
    assert {c.status for c in crowd} == {"rejected"}
    assert late.status == "rejected" and late.neighbour_id == original.id, late


# ---- stats ------------------------------------------------------------------------------


async def test_stats_updates_without_rewriting_the_environment_rows(tmp_path):
    cfg = hash_cfg(ema_alpha=0.5)
    async with open_memory(cfg, str(tmp_path / "m")) as mem:
        res = await mem.insert(env(1, "a task"))
        version = await mem.tables.envs.version()
        s1 = await mem.record_episodes(res.id, hinted=[1.0, 1.0], unhinted=[0.0, 0.0])
        s2 = await mem.record_episodes(res.id, hinted=[1.0, 0.0], unhinted=[1.0, 0.0])
        assert await mem.tables.envs.version() == version  # code and embedding untouched
        with pytest.raises(KeyError, match="unknown environment"):
            await mem.record_episodes("0" * 16, unhinted=[1.0])
        with pytest.raises(ValueError, match=r"not in \[0, 1\]"):
            await mem.record_episodes(res.id, unhinted=[1.5])
        got = (await mem.get(res.id)).stats
    assert (s1.regret_last, s1.regret_ema, s1.learnability) == (1.0, 1.0, 0.0)
    assert s2.episodes_hinted == 4 and s2.episodes_unhinted == 4
    assert s2.mean_hinted == 0.75 and s2.mean_unhinted == 0.25
    assert s2.regret_last == 0.0 and s2.regret_ema == pytest.approx(0.5)  # 0.5*0 + 0.5*1
    assert s2.learnability == pytest.approx(0.25 * 0.75)
    assert got == s2 and got.last_played is not None


# ---- replay -------------------------------------------------------------------------------


async def test_replay_prefers_high_scores_revisits_stale_ones_and_survives_restart(tmp_path):
    cfg = hash_cfg(replay={"rho": 0.3, "beta": 0.3, "score": "regret"})
    uri = str(tmp_path / "m")
    n, draws = 10, 300
    rng = random.Random(7)
    async with open_memory(cfg, uri) as mem:
        ids = [r.id for r in await mem.insert_many([env(i, f"task {i}") for i in range(n)])]
        for i, eid in enumerate(ids):  # regret of env i is i / 10
            await mem.record_episodes(eid, hinted=[1.0], unhinted=[1.0 - i / 10])
        picks = Counter()
        for _ in range(draws):
            eid, p = await mem.sample_replay(rng)
            assert 0 < p <= 1
            picks[eid] += 1
        before = await mem.replay_probabilities()
    counts = [picks[eid] for eid in ids]
    assert counts[-1] == max(counts) and counts[-1] > 4 * counts[0], counts
    # without staleness the lowest-regret env would hardly ever come back
    pure = replay_distribution(np.arange(n) / 10, np.zeros(n), 1, cfg.replay.model_copy(
        update={"rho": 0.0}))
    assert pure[0] * draws < 0.5
    assert all(c >= 2 for c in counts), counts  # staleness brings every env back

    async with open_memory(cfg, uri, writable=False) as reader:
        assert await reader.replay_probabilities() == pytest.approx(before)
        meta = await read_meta(reader.tables.meta)
        assert meta["replay_tick"] == n + draws
    async with open_memory(cfg, uri) as mem:  # a restarted writer continues the same state
        assert await mem.replay_probabilities() == pytest.approx(before)
        eid, p = await mem.sample_replay(random.Random(1))
        assert p == pytest.approx(before[eid])
        assert (await mem.get(eid)).stats.last_tick == n + draws


# ---- schema -------------------------------------------------------------------------------


async def test_embedding_model_mismatch_is_an_error_naming_both(tmp_path):
    uri = str(tmp_path / "m")
    async with open_memory(hash_cfg(), uri) as mem:
        await mem.insert(env(1, "x"))
    with pytest.raises(SchemaError, match=r"hash-128 \(dim 128\).*hash-64 \(dim 64\)"):
        async with open_memory(MemoryConfig(embedding_model="hash-64"), uri):
            pass


async def test_schema_versions_newer_older_and_foreign_layouts(tmp_path, monkeypatch):
    uri = str(tmp_path / "m")
    async with open_memory(hash_cfg(), uri) as mem:
        await mem.insert(env(1, "x"))
    db = await lancedb.connect_async(uri, read_consistency_interval=timedelta(0))
    meta = await db.open_table("meta")

    await write_meta(meta, {"schema_version": 99})
    with pytest.raises(SchemaError, match="v99 was written by a newer memory_db"):
        async with open_memory(hash_cfg(), uri, writable=False):
            pass

    await write_meta(meta, {"schema_version": 0})
    with pytest.raises(SchemaError, match="v0 needs an upgrade"):
        async with open_memory(hash_cfg(), uri, writable=False):
            pass
    with pytest.raises(SchemaError, match=f"v0 has no upgrade path to v{SCHEMA_VERSION}"):
        async with open_memory(hash_cfg(), uri):
            pass

    ran = []

    async def v0_to_v1(conn, info):
        ran.append(info["schema_version"])
        envs = await conn.open_table("envs")
        assert await envs.count_rows() == 1

    monkeypatch.setitem(schema_mod.MIGRATIONS, 0, v0_to_v1)
    async with open_memory(hash_cfg(), uri) as mem:
        assert await mem.count() == 1
    assert ran == [0]  # then v1 -> v2 and on, which find their columns already there
    assert (await read_meta(meta))["schema_version"] == SCHEMA_VERSION

    foreign = str(tmp_path / "foreign")
    fdb = await lancedb.connect_async(foreign)
    await fdb.create_table("envs", data=pa.table({"id": ["a"], "x": [1]}))
    with pytest.raises(SchemaError, match="no 'meta' table: not a memory_db database"):
        async with open_memory(hash_cfg(), foreign):
            pass
    with pytest.raises(SchemaError, match="no environment memory here yet"):
        async with open_memory(hash_cfg(), str(tmp_path / "empty"), writable=False):
            pass


async def test_a_table_missing_a_column_is_refused(tmp_path):
    uri = str(tmp_path / "m")
    async with open_memory(hash_cfg(), uri) as mem:
        await mem.insert(env(1, "x"))
    db = await lancedb.connect_async(uri)
    await (await db.open_table("envs")).drop_columns(["tags"])
    with pytest.raises(SchemaError, match="missing column 'tags'"):
        async with open_memory(hash_cfg(), uri, writable=False):
            pass


# ---- index and optimize -------------------------------------------------------------------


async def test_index_is_trained_when_large_and_retrained_as_rows_grow(tmp_path):
    cfg = hash_cfg(index={"min_rows": 256, "rebuild_growth": 2.0},
                   writer={"batch_size": 1024, "flush_interval_s": 0.005})
    texts = [f"job {i} word{i % 37} thing{i % 11} more{i % 5}" for i in range(700)]
    async with open_memory(cfg, str(tmp_path / "m")) as mem:
        # training runs in the writer after the batch is acknowledged; a maintenance op queued
        # behind it returns once it is done
        barrier = lambda: mem.maintain(optimize=False, index="skip")  # noqa: E731
        await mem.insert_many([env(i, t, check_novelty=False) for i, t in enumerate(texts[:300])])
        await barrier()
        indices = await mem.tables.envs.list_indices()
        # the vector index and the status bitmap once trained; the id BTree from the start
        assert sorted(ix.columns for ix in indices) == [["embedding"], ["id"], ["status"]]
        assert [ix.columns for ix in await mem.tables.stats.list_indices()] == [["id"]]
        assert (await read_meta(mem.tables.meta))["index_trained_rows"] == 300
        await mem.insert_many([env(i, t, check_novelty=False)
                               for i, t in enumerate(texts[300:500], 300)])
        await barrier()
        assert (await read_meta(mem.tables.meta))["index_trained_rows"] == 300  # not yet 2x
        await mem.insert_many([env(i, t, check_novelty=False)
                               for i, t in enumerate(texts[500:], 500)])
        await barrier()
        assert (await read_meta(mem.tables.meta))["index_trained_rows"] == 700
        # an indexed search still finds the exact text first
        hits = await mem.search(texts[123], k=3, diverse=False)
        assert hits[0].record.name == "env-123"
        summary = await mem.summary()
    assert summary.storage["index"]["indexed_rows"] == 700
    assert summary.storage["index"]["distance"] == "cosine"


async def test_optimize_compacts_many_small_appends(tmp_path):
    async with open_memory(hash_cfg(), str(tmp_path / "m")) as mem:
        for i in range(12):  # one commit each
            await mem.insert(env(i, f"small append {i}"))
        before = (await mem.summary()).storage["fragments"]
        report = await mem.maintain(optimize=True, index="skip")
        after = (await mem.summary()).storage["fragments"]
        assert await mem.count() == 12
    assert before == 12 and after == 1
    assert report["optimized"] == ["envs", "stats", "meta"]


async def test_optimize_runs_on_its_schedule_while_idle(tmp_path):
    cfg = hash_cfg(optimize_every_s=0.3)
    async with open_memory(cfg, str(tmp_path / "m")) as mem:
        for i in range(5):
            await mem.insert(env(i, f"small append {i}"))
        with anyio.fail_after(10):
            while (await mem.summary()).storage["fragments"] > 1:
                await anyio.sleep(0.1)


# ---- embedders ----------------------------------------------------------------------------


def test_hash_embedder_is_deterministic_unit_norm_and_tracks_overlap():
    a, b = HashEmbedder(384), HashEmbedder(384)
    texts = ["walk the maze to the exit", "walk the maze to the goal", "book a meeting"]
    va, vb = a.embed(texts), b.embed(texts)
    assert np.array_equal(va, vb)
    assert np.allclose(np.linalg.norm(va, axis=1), 1.0, atol=1e-5)
    assert va[0] @ va[1] > va[0] @ va[2] + 0.3


def test_minilm_embeds_offline_like_sentence_transformers(minilm):
    v = minilm.embed([env_text("maze", "walk a grid maze to the exit", ""),
                      env_text("maze2", "navigate a labyrinth to reach the goal", ""),
                      env_text("cal", "schedule meetings in a calendar", "")])
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2]


async def test_writes_fail_fast_once_the_writer_is_gone_or_absent(tmp_path):
    uri = str(tmp_path / "m")
    async with open_memory(hash_cfg(), uri) as mem:
        await mem.insert(env(1, "x"))
    with pytest.raises(MemoryClosed, match="not running"):
        await mem.insert(env(2, "y"))
    async with open_memory(hash_cfg(), uri, writable=False) as reader:
        with pytest.raises(MemoryClosed, match="read-only"):
            await reader.record_episodes("0" * 16, unhinted=[1.0])
        assert await reader.count() == 1


async def test_upkeep_drops_old_rejected_code_and_keeps_the_row(tmp_path):
    """Past `rejected_code_keep_days` a rejected design's code is blanked by the upkeep; its
    row (id = the code's hash, reason, embedding) stays, and accepted code is never touched."""
    cfg = hash_cfg(rejected_code_keep_days=0.5 / 86400)  # half a second
    async with open_memory(cfg, str(tmp_path / "m")) as mem:
        await mem.insert_many([env(1, "kept task"), env(2, "old reject", rejected_reason="x: y")])
        await anyio.sleep(0.6)
        await mem.insert(env(3, "new reject", rejected_reason="x: z"))
        report = await mem.maintain(optimize=True, index="skip")
        rows = {r["name"]: r async for r in mem.export(code=True)}
    assert report["rejected_code_dropped"] == 1
    assert rows["env-2"]["code"] == "" and rows["env-2"]["reason"] == "x: y"
    assert rows["env-1"]["code"] and rows["env-3"]["code"]


async def test_scheduled_upkeep_runs_beside_the_writes(tmp_path):
    """A compaction or an index build (minutes on a large table) no longer holds the single
    writer: inserts commit while it runs; an explicit maintain() waits for it."""
    cfg = hash_cfg(optimize_every_s=0.05)
    async with open_memory(cfg, str(tmp_path / "m")) as mem:
        writer = mem._w()
        started, release = anyio.Event(), anyio.Event()
        real = writer.upkeep.run

        async def slow(rows, *, optimize, index, **kw):
            started.set()
            await release.wait()
            return await real(rows, optimize=optimize, index=index, **kw)

        writer.upkeep.run = slow
        await mem.insert(env(0, "first"))
        with anyio.fail_after(10):
            await started.wait()  # the scheduled upkeep is under way, and stays so
        # past the next period while it runs: the next upkeep is due but must wait for this
        # one, and the writes must not (a zero wait for the next op once spun the writer)
        await anyio.sleep(0.2)
        with anyio.fail_after(10):  # would time out if the upkeep held the writer
            for i in range(1, 4):
                await mem.insert(env(i, f"written beside the upkeep {i}"))
        assert await mem.count() == 4 and not release.is_set()
        release.set()
        with anyio.fail_after(30):
            report = await mem.maintain(optimize=True, index="skip")
        assert report["optimized"] == ["envs", "stats", "meta"]


async def test_a_producer_that_stops_waiting_never_commits_behind_its_back(tmp_path):
    """A write whose caller timed out or was cancelled either never commits (the writer had
    not taken it: dropped) or is waited for (it had: the caller learns its result). Retrying
    after a timeout then counts a play's episodes once, and a drain cut cannot leave the
    memory counting a play the run's logs never saw."""
    cfg = hash_cfg(writer={"flush_interval_s": 0.005, "write_timeout_s": 0.3})
    async with open_memory(cfg, str(tmp_path / "m")) as mem:
        res = await mem.insert(env(1, "a task"))
        writer = mem._w()
        real, gate, entered = writer._records, anyio.Event(), anyio.Event()

        async def held(ops, dirty):
            entered.set()
            await gate.wait()
            return await real(ops, dirty)

        writer._records = held
        async with anyio.create_task_group() as tg:
            # the first record is taken and held in its batch: its caller's timeout passes,
            # the call still returns the committed stats (no failure to retry)
            first: list = []

            async def record_first() -> None:
                first.append(await mem.record_episodes(res.id, unhinted=[1.0]))

            tg.start_soon(record_first)
            with anyio.fail_after(10):
                await entered.wait()
            # the second waits in the queue behind it; its caller gives up before it is taken
            with pytest.raises(TimeoutError):
                await mem.record_episodes(res.id, unhinted=[0.0, 0.0])
            # a third caller is cancelled while queued: dropped too
            with anyio.move_on_after(0.05):
                await mem.record_episodes(res.id, unhinted=[0.0, 0.0, 0.0])
            gate.set()
        assert first[0].episodes_unhinted == 1
        again = await mem.record_episodes(res.id, unhinted=[0.0, 0.0])  # the retry
        assert again.episodes_unhinted == 3
        assert (await mem.get(res.id)).stats.episodes_unhinted == 3
        # a caller cancelled once its op was taken waits for the commit before it leaves
        gate, entered = anyio.Event(), anyio.Event()
        left, scope = anyio.Event(), anyio.CancelScope()

        async def cancelled_while_taken() -> None:
            with scope:
                await mem.record_episodes(res.id, unhinted=[1.0])
            left.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancelled_while_taken)
            with anyio.fail_after(10):
                await entered.wait()
            scope.cancel()  # once the writer holds its op
            await anyio.sleep(0.2)
            assert not left.is_set()  # still waiting for the batch that holds its op
            gate.set()
        assert (await mem.get(res.id)).stats.episodes_unhinted == 4


async def test_capacity_retires_the_lowest_ranked_played_environments_and_old_rejects(tmp_path):
    """Past max_accepted the upkeep deletes the lowest-ranked played environments (regret EMA)
    with their variants' stats, never an unplayed one; past max_rejected the oldest rejected
    rows. A play of a retired environment still in flight is recorded as nothing, and a reopened
    memory has the same rows and the counts of what went."""
    cfg = hash_cfg(max_accepted=3, max_rejected=1, retire_grace_s=0)
    uri = str(tmp_path / "m")
    words = ["orchard ladder", "glacier compass", "violin harbor", "desert lantern",
             "quartz meadow"]
    async with open_memory(cfg, uri) as mem:
        ids = [(await mem.insert(env(i, w))).id for i, w in enumerate(words)]
        for i, eid in enumerate(ids[:4]):  # regret i/4: env 0 lowest; env 4 never played
            await mem.record_episodes(eid, hinted=[1.0], unhinted=[1.0 - i / 4], params={"k": 1})
            await mem.record_episodes(eid, hinted=[1.0], unhinted=[1.0])
        for i in range(3):
            await mem.insert(env(f"r{i}", f"bad {i}", rejected_reason="validation: no"))
            await anyio.sleep(0.01)
        report = await mem.maintain(optimize=True, index="skip")
        assert report["retired"] == 2 and report["rejected_deleted"] == 2
        left = {r["name"]: r["status"] async for r in mem.export(code=False)}
        assert left == {"env-2": "accepted", "env-3": "accepted", "env-4": "accepted",
                        "env-r2": "rejected"}
        assert await mem.variants(ids[0]) == []
        late = await mem.record_episodes(ids[0], hinted=[1.0], unhinted=[0.0])
        assert late.episodes_unhinted == 0
        with pytest.raises(KeyError):
            await mem.record_episodes("ab" * 8, unhinted=[1.0])
    async with open_memory(cfg, uri) as mem:
        assert await mem.count("accepted") == 3 and await mem.count("rejected") == 1
        assert mem._w().deleted == {"retired": 2, "rejected": 1 + 1}
        assert {v.env_id for v in (await mem.variants(ids[2]))} == {ids[2]}


def test_retirement_order_skips_unplayed_and_recent_environments():
    from datetime import UTC, datetime, timedelta

    from memory_db.capacity import oldest_beyond, to_retire
    from memory_db.records import EnvStats

    now = datetime(2026, 1, 1, tzinfo=UTC)
    old, new = now - timedelta(hours=1), now - timedelta(seconds=5)

    def st(vid, regret, tick, at):
        return EnvStats(id=vid, episodes_unhinted=2, regret_ema=regret, last_tick=tick,
                        updated_at=at)

    stats = {"a": st("a", 0.1, 5, old), "a.x": st("a.x", 0.9, 1, old),  # a's best: 0.9
             "b": st("b", 0.1, 3, old), "c": st("c", 0.1, 2, old), "d": st("d", 0.0, 9, new)}
    env_of = {"a.x": "a"}
    accepted = {"a", "b", "c", "d", "e"}  # e: never played
    # d is recent, e unplayed, a ranks high (its other variant's regret): c (older) then b
    assert to_retire(accepted, stats, env_of, keep=3, score="regret", now=now,
                     grace_s=60) == ["c", "b"]
    assert to_retire(accepted, stats, env_of, keep=1, score="regret", now=now,
                     grace_s=60) == ["c", "b", "a"]  # fewer eligible than the excess
    assert to_retire(accepted, stats, env_of, keep=0, score="regret", now=now, grace_s=60) == []
    assert oldest_beyond([("x", old), ("y", new), ("z", now)], 1) == ["x", "y"]
