"""Strict and lenient held-out scores with their 95% intervals: the lenient reading of an
untagged reply, the interval function, the `reasoning-gym-easy` suite's fixed task set and its
scoring, a suite run's summary through results.jsonl, and `spade eval`'s report of both."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

from spade_async.cli import app
from spade_async.core.config import load_config
from spade_async.evals import SUITES, make_suite
from spade_async.evals.base import (
    SuiteResult,
    TaskResult,
    interval95,
    load_results,
    run_suite,
    store_result,
    wilson_interval,
)
from spade_async.evals.reasoning_gym_suite import (
    EASY_GENERATORS,
    GENERATORS,
    ReasoningGymSuite,
    lenient_answer,
)
from spade_async.testing.fake.server import FakeOpenAIServer
from spade_async.testing.stack import one_endpoint_toml

FOUR = ("A", "B", "C", "D")


def test_lenient_answer_is_the_tagged_one_when_there_are_tags():
    reply = "7 + 8 is 15, or 16?\n<answer>15</answer> I said 16"
    assert lenient_answer(reply, "number") == "15"
    assert lenient_answer(reply, "lines") == "15"
    assert lenient_answer("<answer>B</answer> then C", "option", options=[FOUR]) == "B"


def test_lenient_answer_reads_an_untagged_reply_by_its_shape():
    assert lenient_answer("4 + 9 = 13.\nSo the answer is 13.", "number") == "13"
    assert lenient_answer("3 - 7 = -4", "number") == "-4"
    assert lenient_answer("about 2.5 steps", "number") == "2.5"
    assert lenient_answer("It is B, no wait, the answer is c.", "option", options=[FOUR]) == "C"
    kk = [("Ann is a knight", "Ann is a knave"), ("Bob is a knight", "Bob is a knave")]
    reply = "Suppose Ann is a knave... then\nAnn is  a KNIGHT.\nBob is a knave."
    assert lenient_answer(reply, "option", options=kk) == "Ann is a knight, Bob is a knave"
    assert lenient_answer("Only Bob is a knight.", "option", options=kk) == "Bob is a knight"
    assert lenient_answer("Sorted:\n\ncat, dog\n", "lines") == "cat, dog"
    grid = "1 2 3 4\n3 4 1 2\n2 1 4 3\n4 3 2 1"
    assert lenient_answer(f"Here:\n{grid}\n", "lines", lines=4) == grid


def test_lenient_answer_finds_nothing():
    assert lenient_answer("no idea", "number") is None
    assert lenient_answer("no idea", "option", options=[FOUR]) is None
    assert lenient_answer(" \n\n", "lines") is None
    assert lenient_answer("", "number") is None
    with pytest.raises(ValueError, match="shape"):
        lenient_answer("x", "essay")


def test_interval95_edges_and_kinds():
    assert interval95([]) == (0.0, 1.0)                       # n = 0: nothing known
    assert interval95([0.4]) == (0.0, 1.0)                    # one fractional score
    assert interval95([0.0] * 8) == wilson_interval(0, 8)     # 0/n: Wilson, not empty
    assert interval95([0.0] * 8)[0] == 0.0 and interval95([0.0] * 8)[1] > 0.3
    assert interval95([1.0] * 8) == wilson_interval(8, 8)     # n/n
    assert interval95([1.0] * 8)[1] == 1.0 and interval95([1.0] * 8)[0] < 0.7
    assert interval95([1.0, 0.0, 1.0, 1.0]) == wilson_interval(3, 4)
    lo, hi = interval95([0.5, 0.25, 0.75, 0.5])  # normal approximation around 0.5
    assert lo == pytest.approx(0.5 - 1.96 * (1 / 24) ** 0.5 / 2) and hi == pytest.approx(1 - lo)
    assert interval95([0.9, 1.0, 0.95, 1.0])[1] == 1.0        # clipped to [0, 1]
    assert interval95([0.0, 0.1, 0.0, 0.05])[0] == 0.0


def test_easy_suite_is_registered_fixed_and_scores_its_own_way(tmp_path):
    assert "reasoning-gym-easy" in SUITES and "reasoning-gym" in SUITES
    f = tmp_path / "c.toml"
    f.write_text('[[endpoints]]\nname = "a"\nbase_url = "http://a"\n'
                 '[eval]\nsuites = ["reasoning-gym-easy"]\nreasoning_gym_per_generator = 3\n')
    suite = make_suite("reasoning-gym-easy", load_config(f, environ={}))
    assert isinstance(suite, ReasoningGymSuite) and suite.name == "reasoning-gym-easy"
    assert suite.generators == tuple(EASY_GENERATORS) and "knights_knaves" not in EASY_GENERATORS
    assert set(EASY_GENERATORS) < set(GENERATORS)
    a, b = suite.tasks(), ReasoningGymSuite(per_generator=3, name="reasoning-gym-easy").tasks()
    assert [(t.task_id, t.payload) for t in a] == [(t.task_id, t.payload) for t in b]
    assert len(a) == 3 * len(EASY_GENERATORS)
    hard = ReasoningGymSuite(per_generator=3).tasks()
    assert not {t.payload["question"] for t in a} & {t.payload["question"] for t in hard}
    for task in a:
        gen, i = task.payload["generator"], task.payload["index"]
        ref = suite.reference(gen, i)
        assert suite.score(gen, i, f"<answer>{ref}</answer>")[0] == 1.0, task
        assert suite.score_lenient(gen, i, f"<answer>{ref}</answer>")[0] == 1.0, task
        assert suite.score(gen, i, f"Thinking.\n{ref}")[0] == 0.0, task  # strict: no tags
        assert suite.score_lenient(gen, i, f"Thinking.\n{ref}")[0] == 1.0, task
        wrong = "999" if gen in ("chain_sum", "basic_arithmetic", "maze") else "zzz"
        assert suite.score(gen, i, f"<answer>{wrong}</answer>")[0] < 1.0, task
        assert suite.score_lenient(gen, i, f"<answer>{wrong}</answer>")[0] < 1.0, task
        assert suite.score_lenient(gen, i, f"so\n{wrong}")[0] < 1.0, task
    with pytest.raises(ValueError, match="unknown reasoning-gym suite"):
        ReasoningGymSuite(name="reasoning-gym-hard")


def test_knights_knaves_lenient_reading_of_the_hard_suite():
    suite = ReasoningGymSuite(per_generator=2, generators=("knights_knaves",))
    for i in range(2):
        ref = suite.reference("knights_knaves", i)  # "X is a knight, and Y is a knave."
        lines = "\n".join(ref.rstrip(".").split(", and "))
        assert suite.score("knights_knaves", i, lines)[0] == 0.0
        assert suite.score_lenient("knights_knaves", i, f"Let me think.\n{lines}")[0] == 1.0


class _Replies:
    """A policy that replies with what `answer` says about the question: no endpoint."""

    version, model, path = 4, "policy-v4", "tokens"

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    async def reply(self, messages: Sequence[dict[str, Any]],
                    max_tokens: int | None = None) -> tuple[str, int]:
        return self.answer(messages[-1]["content"]), 3


def _by_question(suite: ReasoningGymSuite) -> dict[str, str]:
    return {t.payload["question"]: suite.reference(t.payload["generator"], t.payload["index"])
            for t in suite.tasks()}


def test_suite_result_has_both_scores_and_round_trips_through_results_jsonl(tmp_path):
    suite = ReasoningGymSuite(per_generator=4, name="reasoning-gym-easy")
    refs = _by_question(suite)
    # The right answer without tags: strict sees none of it, lenient all of it.
    res = anyio.run(lambda: run_suite(suite, _Replies(lambda q: f"I think\n{refs[q]}")))
    assert (res.n, res.scored, res.score, res.passed) == (20, 20, 0.0, 0.0)
    assert (res.lenient_score, res.lenient_passed) == (1.0, 1.0)
    assert res.passed_ci95 == [round(x, 4) for x in wilson_interval(0, 20)]
    assert res.lenient_passed_ci95 == [round(x, 4) for x in wilson_interval(20, 20)]
    assert all(t.detail["extracted"] is None and t.detail["lenient"] for t in res.tasks)
    # Tagged, right on every other task: lenient == strict.
    half = dict(list(refs.items())[::2])
    right = sum(t.payload["question"] in half for t in suite.tasks())
    res = anyio.run(lambda: run_suite(
        suite, _Replies(lambda q: f"<answer>{half.get(q, 'zzz')}</answer>")))
    assert res.score == res.passed == res.lenient_passed == round(right / 20, 4)
    assert [(t.score, t.passed) for t in res.tasks] == \
        [(t.lenient, t.lenient_passed) for t in res.tasks]
    assert res.passed_ci95 == res.lenient_passed_ci95 == \
        [round(x, 4) for x in wilson_interval(right, 20)]
    assert res.score_ci95 == [round(x, 4) for x in interval95([t.score for t in res.tasks])]
    store_result(tmp_path, res)
    (row,) = load_results(tmp_path)
    assert row == json.loads(json.dumps(res.summary()))
    for key in ("lenient_score", "lenient_passed", "score_ci95", "passed_ci95",
                "lenient_score_ci95", "lenient_passed_ci95"):
        assert row[key] == getattr(res, key), key
    task = json.loads((tmp_path / "eval" / "v4" / "reasoning-gym-easy.jsonl")
                      .read_text().splitlines()[0])
    assert {"lenient", "lenient_passed"} <= set(task)


def test_a_checker_without_tags_has_lenient_equal_to_strict():
    assert (TaskResult("t", 0.5, False).lenient, TaskResult("t", 1.0, True).lenient_passed) \
        == (0.5, True)
    assert TaskResult("t", 0.0, False, lenient=1.0, lenient_passed=True).lenient == 1.0
    old = {"suite": "probe", "version": 0, "model": "policy", "n": 2, "scored": 2,
           "score": 0.5, "passed": 0.5, "errors": 0, "seconds": 1.0, "time": 0.0}
    r = SuiteResult(**old, tasks=[])  # the fields an older results.jsonl line holds
    assert r.lenient_passed_ci95 == [0.0, 1.0]


def test_spade_eval_prints_strict_and_lenient_against_the_fake(tmp_path, checkpoint):
    server = FakeOpenAIServer()
    server.start()
    try:
        cfg = tmp_path / "spade.toml"
        cfg.write_text(one_endpoint_toml(tmp_path / "data", checkpoint, "fake", server.base_url)
                       + """
[memory]
embedding_model = "hash-384"
[eval]
max_tokens = 16
reasoning_gym_per_generator = 1
""")
        runner = CliRunner()
        res = runner.invoke(app, ["eval", "--config", str(cfg), "--suite", "reasoning-gym-easy",
                                  "--version", "0"])
        assert res.exit_code == 0, res.output
        lines = res.stdout.splitlines()
        assert lines[0].startswith("reasoning-gym-easy v0 (policy, tokens path): 5 of 5 tasks")
        assert lines[1].split()[:2] == ["strict", "score"] and "scored)" in lines[1]
        assert lines[2].split()[:2] == ["lenient", "score"] and " of 5 scored)" in lines[2]
        res = runner.invoke(app, ["eval", "--config", str(cfg), "--suite", "reasoning-gym-easy",
                                  "--version", "0", "--json"])
    finally:
        server.stop()
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)
    assert {"lenient_score", "lenient_passed", "score_ci95", "passed_ci95",
            "lenient_score_ci95", "lenient_passed_ci95"} <= set(row)
    assert len(load_results(tmp_path / "data")) == 2
