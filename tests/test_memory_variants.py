"""Variants in the environment memory (issue 17), on a real LanceDB database under tmp_path: an
environment played at given params is a variant with its own statistics; environments carry
the aggregate; replay draws variants; a v1 database (stats keyed by environment) upgrades in
place; `spade memory show` and `stats` show the variants."""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import anyio
import lancedb
import pyarrow as pa
import pytest
import typer
from typer.testing import CliRunner

from memory_db import SCHEMA_VERSION, MemoryConfig, NewEnv, SchemaError, open_memory
from memory_db.embed import HashEmbedder, env_text
from memory_db.records import EnvStats, VariantStats
from memory_db.schema import envs_schema, meta_rows, read_meta, variant_id
from spade_async.cli.memory import memory_app
from spade_async.loop.ports import StoredEnv
from spade_async.memory.port import LanceMemoryPort

FAST = {"writer": {"flush_interval_s": 0.005}}
HARD = {"size": 9, "walls": True}
EASY = {"size": 3, "walls": False}


def hash_cfg(**kw) -> MemoryConfig:
    return MemoryConfig(embedding_model="hash-128", **{**FAST, **kw})


def env(i: int | str, description: str = "", **kw) -> NewEnv:
    return NewEnv(code=f"class Environment:\n    ident = {i!r}\n", name=f"env-{i}",
                  description=description or f"task {i}", check_novelty=False, **kw)


# ---- ids --------------------------------------------------------------------------------


def test_variant_ids_are_the_env_id_without_params_and_stable_under_key_order():
    e = "0123456789abcdef"
    assert variant_id(e, None) == variant_id(e, {}) == e
    a = variant_id(e, {"size": 9, "walls": True})
    assert a == variant_id(e, {"walls": True, "size": 9})
    assert a.startswith(e + ".") and len(a) == len(e) + 9
    assert all(c in "0123456789abcdef" for c in a.split(".")[1])
    assert variant_id(e, {"size": 8, "walls": True}) != a
    assert variant_id("fedcba9876543210", {"size": 9, "walls": True}) != a
    assert variant_id(e, {"size": 9.0, "walls": True}) != a  # 9.0 and 9 are different JSON


# ---- migration ----------------------------------------------------------------------------

V1_STATS = pa.schema([  # env_stats as schema v1 wrote it: keyed by environment id
    pa.field("id", pa.string(), nullable=False),
    pa.field("episodes_hinted", pa.int64()), pa.field("episodes_unhinted", pa.int64()),
    pa.field("mean_hinted", pa.float64()), pa.field("mean_unhinted", pa.float64()),
    pa.field("regret_last", pa.float64()), pa.field("regret_ema", pa.float64()),
    pa.field("learnability", pa.float64()), pa.field("times_replayed", pa.int64()),
    pa.field("last_played", pa.timestamp("us", tz="UTC")), pa.field("last_tick", pa.int64()),
    pa.field("updated_at", pa.timestamp("us", tz="UTC")),
])


async def write_v1(uri: str, envs: list[NewEnv], stats: list[dict]) -> list[str]:
    """A v1 database written directly, as the v1 code laid it out; the environments' ids."""
    from memory_db.schema import env_id

    emb = HashEmbedder(128)
    vecs = emb.embed([env_text(e.name, e.description, e.code) for e in envs])
    ids = [env_id(e.code) for e in envs]
    now = datetime.now(UTC)
    db = await lancedb.connect_async(uri)
    await db.create_table("envs", data=pa.table({
        "id": ids, "name": [e.name for e in envs], "description": [e.description for e in envs],
        "code": [e.code for e in envs], "source_doc_id": ["doc"] * len(envs),
        "source_excerpt": [""] * len(envs),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), 128),
        "created_at": [now] * len(envs), "policy_version": [0] * len(envs),
        "status": ["accepted"] * len(envs), "reason": [""] * len(envs),
        "tags": [[] for _ in envs]}, schema=envs_schema(128)))
    await db.create_table("env_stats", data=pa.Table.from_pylist(
        [{"id": ids[i], **row} for i, row in enumerate(stats)], schema=V1_STATS))
    await db.create_table("meta", data=meta_rows({
        "schema_version": 1, "embedding_model": "hash-128", "embedding_dim": 128,
        "created_at": now.isoformat(), "replay_tick": 7}))
    return ids


async def test_v1_database_upgrades_to_variants_keeping_its_stats(tmp_path):
    uri = str(tmp_path / "m")
    played = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    row = {"episodes_hinted": 4, "episodes_unhinted": 6, "mean_hinted": 0.75,
           "mean_unhinted": 0.5, "regret_last": 0.25, "regret_ema": 0.3, "learnability": 0.25,
           "times_replayed": 2, "last_played": played, "last_tick": 6, "updated_at": played}
    ids = await write_v1(uri, [env(1), env(2)], [row])
    old = EnvStats(id=ids[0], **row)

    with pytest.raises(SchemaError, match=f"v1 needs an upgrade to v{SCHEMA_VERSION}"):
        async with open_memory(hash_cfg(), uri, writable=False):
            pass
    async with open_memory(hash_cfg(), uri) as mem:  # the writer migrates
        assert (await mem.get(ids[0])).stats == old
        assert (await mem.get(ids[1])).stats == EnvStats(id=ids[1])
        (v,) = await mem.variants(ids[0])
        assert v == VariantStats(env_id=ids[0], params={}, stats=old)
        assert await mem.replay_probabilities() == {ids[0]: pytest.approx(1.0)}
        # the migrated table takes variant rows, and an old row still updates in place
        s = await mem.record_episodes(ids[0], hinted=[1.0], unhinted=[1.0], params=HARD)
        assert s.id == variant_id(ids[0], HARD) and s.episodes_unhinted == 1
        s = await mem.record_episodes(ids[0], hinted=[1.0], unhinted=[1.0, 1.0])
        assert s.id == ids[0] and s.episodes_unhinted == 8 and s.mean_unhinted == 0.625
    async with open_memory(hash_cfg(), uri, writable=False) as reader:
        meta = await read_meta(reader.tables.meta)
        assert meta["schema_version"] == SCHEMA_VERSION and meta["replay_tick"] >= 7
        schema = await reader.tables.stats.schema()
        assert {"env_id", "params"} <= set(schema.names)
        rows = {r["id"]: r for r in (await reader.tables.stats.query().to_arrow()).to_pylist()}
        assert rows[ids[0]]["env_id"] == ids[0] and rows[ids[0]]["params"] == "{}"
        assert rows[variant_id(ids[0], HARD)]["params"] == '{"size":9,"walls":true}'
        assert (await reader.get(ids[0])).stats.episodes_unhinted == 9


async def test_an_interrupted_migration_is_finished_on_the_next_open(tmp_path):
    """Columns added but the version not bumped (a crash between the two commits)."""
    uri = str(tmp_path / "m")
    ids = await write_v1(uri, [env(1)], [{"episodes_unhinted": 1, "mean_unhinted": 1.0,
                                          "episodes_hinted": 0, "times_replayed": 0}])
    db = await lancedb.connect_async(uri)
    await (await db.open_table("env_stats")).add_columns({"env_id": "id", "params": "'{}'"})
    async with open_memory(hash_cfg(), uri) as mem:
        assert [v.id for v in await mem.variants(ids[0])] == [ids[0]]
        assert (await read_meta(mem.tables.meta))["schema_version"] == SCHEMA_VERSION


# ---- stats per variant, the family aggregate -----------------------------------------------


async def test_params_make_separate_variants_and_the_environment_aggregates_them(tmp_path):
    async with open_memory(hash_cfg(ema_alpha=0.5), str(tmp_path / "m")) as mem:
        res = await mem.insert(env(1))
        version = await mem.tables.envs.version()
        d = await mem.record_episodes(res.id, hinted=[1.0, 1.0], unhinted=[0.0, 0.0])
        h1 = await mem.record_episodes(res.id, hinted=[1.0], unhinted=[0.0, 0.0, 1.0, 1.0],
                                       params=HARD)
        h2 = await mem.record_episodes(res.id, hinted=[1.0], unhinted=[0.0, 1.0],
                                       params={"walls": True, "size": 9})  # the same variant
        e = await mem.record_episodes(res.id, unhinted=[1.0], params=EASY)
        assert await mem.tables.envs.version() == version  # environments rows untouched
        with pytest.raises(KeyError, match="unknown environment"):
            await mem.record_episodes("0" * 16, unhinted=[1.0], params=HARD)
        with pytest.raises(TypeError):
            await mem.record_episodes(res.id, unhinted=[1.0], params={"f": object()})
        rec = await mem.get(res.id)
        variants = await mem.variants(res.id)
        listed = await mem.list(sort="regret")
        summary = await mem.summary()

    assert d.id == res.id
    assert h1.id == h2.id == variant_id(res.id, HARD) and e.id == variant_id(res.id, EASY)
    assert h2.episodes_unhinted == 6 and h2.mean_unhinted == pytest.approx(0.5)
    assert h2.learnability == pytest.approx(0.25)
    assert h2.regret_ema == pytest.approx(0.5 * 0.5 + 0.5 * 0.5)  # 1 - 0.5, then 1 - 0.5
    assert e.regret_ema is None  # unhinted only: no regret yet

    # most played first: HARD (6 + 2), the default (2 + 2), EASY (1)
    assert [v.id for v in variants] == [h1.id, d.id, e.id]
    assert [v.params for v in variants] == [HARD, {}, EASY]
    assert all(v.env_id == res.id for v in variants)
    assert variants[0].stats == h2 and variants[1].stats == d

    s = rec.stats
    assert s.id == res.id
    assert (s.episodes_unhinted, s.episodes_hinted) == (9, 4)
    assert s.mean_unhinted == pytest.approx((0 * 2 + 0.5 * 6 + 1 * 1) / 9)
    assert s.mean_hinted == pytest.approx(1.0)
    assert s.learnability == pytest.approx(s.mean_unhinted * (1 - s.mean_unhinted))
    # regret EMA: the variants' EMAs weighted by their episodes; EASY has none
    assert s.regret_ema == pytest.approx((1.0 * 4 + 0.5 * 8) / 12)
    assert s.last_played == e.last_played and s.regret_last == e.regret_last
    assert listed[0].stats == s
    assert summary.variants == 3 and summary.played == 1
    assert summary.solve_rate["unhinted"]["n"] == 1  # environments, not variants


# ---- replay over variants -------------------------------------------------------------------


async def test_replay_draws_variants_of_accepted_environments(tmp_path):
    cfg = hash_cfg(replay={"rho": 0.3, "beta": 0.3, "score": "learnability"})
    async with open_memory(cfg, str(tmp_path / "m")) as mem:
        a, b = await mem.insert_many([env("a"), env("b")])
        bad = await mem.insert(env("bad", rejected_reason="hint: empty"))
        rng = random.Random(3)
        # a's variants by learnability p(1 - p): size 5 (0.25) > size 7 (0.1875) > size 3 (0)
        for size, unhinted in ((3, [1.0] * 4), (5, [1.0, 0.0]), (7, [1.0, 1.0, 1.0, 0.0])):
            await mem.record_episodes(a.id, hinted=[1.0], unhinted=unhinted,
                                      params={"size": size})
        await mem.record_episodes(bad.id, hinted=[1.0], unhinted=[0.0, 1.0], params={"size": 5})
        await mem.record_episodes(b.id, hinted=[1.0], unhinted=[1.0])
        probs = await mem.replay_probabilities()
        picks = Counter()
        for _ in range(200):
            vid, p = await mem.sample_replay(rng)
            assert 0 < p <= 1
            picks[vid] += 1
        drawn = await mem.variant(variant_id(a.id, {"size": 7}))
        with pytest.raises(KeyError, match="no variant"):
            await mem.variant(a.id)  # a was never played at its defaults
        after = await mem.variants(a.id)

    ours = {variant_id(a.id, {"size": s}) for s in (3, 5, 7)} | {b.id}
    assert set(probs) == ours  # the rejected environment's variant is not in the pool
    assert sum(probs.values()) == pytest.approx(1.0)
    assert set(picks) == ours and all(picks[v] >= 3 for v in ours), picks  # staleness
    assert picks[variant_id(a.id, {"size": 5})] == max(picks.values()), picks
    assert drawn.env_id == a.id and drawn.params == {"size": 7}
    assert sum(v.stats.times_replayed for v in after) == sum(
        n for v, n in picks.items() if v != b.id)


async def test_the_port_hands_back_unseen_defaults_first_then_a_drawn_variant(tmp_path):
    async with open_memory(hash_cfg(), str(tmp_path / "m")) as mem:
        a, b = await mem.insert_many([env("a"), env("b")])
        port = LanceMemoryPort(mem, seed=0)
        await port.record_play(a.id, [0.0, 1.0], [1.0, 1.0], params=HARD)
        first = await port.sample_replay()
        then = await port.sample_replay()
        shown = await port.variants(a.id)
    assert first == StoredEnv(b.id, "class Environment:\n    ident = 'b'\n", "env-b")
    assert first.params == {} and first.variant_id == b.id
    assert (then.env_id, then.params, then.name) == (a.id, HARD, "env-a")
    assert then.variant_id == variant_id(a.id, HARD) and "ident = 'a'" in then.code
    assert [(v.id, v.params, v.stats.episodes_unhinted) for v in shown] == [
        (then.variant_id, HARD, 2)]
    with pytest.raises(ValueError, match="needs its variant_id"):
        StoredEnv(a.id, "", "env-a", params=HARD)


# ---- the CLI --------------------------------------------------------------------------------

root = typer.Typer()
root.add_typer(memory_app, name="memory")


def test_memory_show_and_stats_list_the_variants(tmp_path):
    data = tmp_path / "data"
    conf = tmp_path / "spade.toml"
    conf.write_text(f'[paths]\ndata_dir = "{data}"\n\n[memory]\nembedding_model = "hash-128"\n')

    async def build() -> tuple[str, str]:
        async with open_memory(hash_cfg(), str(data / "memory")) as mem:
            a, b = await mem.insert_many([env("a", "walk a grid maze"), env("b")])
            await mem.record_episodes(a.id, hinted=[1.0], unhinted=[0.0])
            await mem.record_episodes(a.id, hinted=[1.0, 1.0], unhinted=[0.0, 1.0, 1.0],
                                      params=HARD)
            return a.id, b.id

    a, b = anyio.run(build)

    def run(*args: str) -> str:
        res = CliRunner().invoke(root, [*args, "--config", str(conf)])
        assert res.exit_code == 0, (res.stdout, res.stderr, res.exception)
        return res.stdout

    shown = json.loads(run("memory", "show", a[:8], "--json"))
    assert shown["id"] == a and shown["stats"]["episodes_unhinted"] == 4
    assert [(v["id"], v["params"]) for v in shown["variants"]] == [
        (variant_id(a, HARD), HARD), (a, {})]
    hard = shown["variants"][0]
    assert hard["env_id"] == a and hard["stats"]["episodes_unhinted"] == 3
    assert hard["stats"]["mean_unhinted"] == pytest.approx(2 / 3)
    assert hard["stats"]["learnability"] == pytest.approx(2 / 9)

    text = run("memory", "show", a)
    assert "variants:       2" in text
    hard_line = next(line for line in text.splitlines() if variant_id(a, HARD) in line)
    assert "3/2" in hard_line and "0.667" in hard_line and "0.222" in hard_line
    assert '{"size": 9, "walls": true}' in hard_line
    default_line = next(line for line in text.splitlines() if line.startswith(f"  {a} "))
    assert "1/1" in default_line and "{} (defaults)" in default_line

    by_variant = json.loads(run("memory", "show", variant_id(a, HARD), "--json"))
    assert by_variant["id"] == a and by_variant["variants"] == shown["variants"]
    assert json.loads(run("memory", "show", b, "--json"))["variants"] == []
    assert "variants:       none played" in run("memory", "show", b)

    stats = json.loads(run("memory", "stats", "--json"))
    assert stats["variants"] == 2 and stats["played"] == 1 and stats["replay"]["pool"] == 2
    assert "1 played; 2 variants" in run("memory", "stats")

    path = tmp_path / "export.jsonl"
    run("memory", "export", str(path))
    rows = {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}
    assert [v["params"] for v in rows[a]["variants"]] == [HARD, {}]
    assert rows[b]["variants"] == []


async def test_variants_of_an_unplayed_or_unknown_environment_are_empty(tmp_path):
    async with open_memory(hash_cfg(), str(tmp_path / "m")) as mem:
        res = await mem.insert(env(1))
        assert await mem.variants(res.id) == []
        assert await mem.variants("f" * 16) == []
        assert (await mem.summary()).variants == 0
    # a default variant and one at params, read back by a fresh reader after a restart
    async with open_memory(hash_cfg(), str(tmp_path / "m")) as mem:
        await mem.record_episodes(res.id, unhinted=[1.0], params=EASY)
    async with open_memory(hash_cfg(), str(tmp_path / "m"), writable=False) as reader:
        (v,) = await reader.variants(res.id)
        assert v.params == EASY and v.stats.last_played > datetime.now(UTC) - timedelta(
            minutes=5)
