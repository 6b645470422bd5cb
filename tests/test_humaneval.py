"""HumanEval in our sandbox: the package's own problems and tests, completions read from a
reply, the unbiased pass@k, and hostile completions contained (they fail; nothing reaches the
host)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from spade_async.core.config import SandboxConfig
from spade_async.evals.base import run_suite
from spade_async.evals.humaneval import (
    HumanEvalSuite,
    build_program,
    extract_code,
    pass_at_k,
    suite_pass_at,
)

FAST = SandboxConfig(call_timeout_s=2.0, warm_workers=1, slots=4)


class Scripted:
    """A policy whose reply to problem i is `answer(problem, sample)`."""

    version, model, path = 0, "scripted", "chat"

    def __init__(self, suite: HumanEvalSuite, answer) -> None:
        self.suite, self.answer, self.calls = suite, answer, []

    async def reply(self, messages, max_tokens=None, *, temperature=0.0, seed=None):
        self.calls.append((temperature, seed))
        prompt = messages[-1]["content"]
        problem = next(p for p in self.suite.problems().values() if p["prompt"] in prompt)
        return self.answer(problem, len(self.calls)), 10


def canonical(problem, _i) -> str:
    return "Here it is:\n```python\n" + problem["prompt"] + problem["canonical_solution"] + "```"


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - (7 * 6 * 5 * 4 * 3) / (10 * 9 * 8 * 7 * 6))
    assert pass_at_k(10, 6, 5) == 1.0 and pass_at_k(5, 0, 1) == 0.0
    with pytest.raises(ValueError, match="at least 10 samples"):
        pass_at_k(5, 1, 10)


def test_a_completion_is_read_from_the_reply():
    problem = {"prompt": "from typing import List\n\n\ndef f(x: List[int]) -> int:\n    \"\"\"doc\"\"\"\n",
               "entry_point": "f", "test": "def check(c):\n    assert c([1]) == 1\n"}
    whole = "```python\ndef f(x: List[int]) -> int:\n    return x[0]\n```\nDone."
    assert extract_code(whole) == "def f(x: List[int]) -> int:\n    return x[0]"
    program = build_program(problem, whole)
    assert program.startswith("from typing import List") and "def check" in program
    body = build_program(problem, "    return x[0]\n")  # a continuation of the signature
    assert body.startswith(problem["prompt"] + "    return x[0]")
    assert extract_code("```py\nunclosed") == "unclosed"


async def test_canonical_solutions_pass_and_wrong_ones_fail_in_the_sandbox():
    async with HumanEvalSuite(n_tasks=6, sandbox_cfg=FAST) as suite:
        right = await run_suite(suite, Scripted(suite, canonical), concurrency=3)
        wrong = await run_suite(
            suite, Scripted(suite, lambda p, i: f"```python\n{p['prompt']}    return None\n```"),
            concurrency=3)
    assert right.n == 6 and right.score == 1.0 and right.passed == 1.0
    assert wrong.score == 0.0 and all(t.detail["why"] for t in wrong.tasks)


async def test_hostile_completions_fail_and_never_reach_the_host(tmp_path):
    marker = Path("/tmp") / f"spade-humaneval-{uuid.uuid4().hex}"
    # the classic escape from restricted builtins: os.system through a loaded class's globals
    escape = ("[c for c in ().__class__.__base__.__subclasses__() "
              "if c.__name__ == '_wrap_close'][0].__init__.__globals__['system']")
    hostile = [  # each a body for the prompt's function, then module-level code
        f"    return True\nimport os\nos.system('touch {marker}')\n",        # not importable
        f"    return True\nopen('{marker}', 'w').write('x')\n",               # no open()
        f"    {escape}('touch {marker}')\n    return True\n",            # the builtin escape
        "    while True:\n        pass\n",                                    # past the deadline
        "    return [1] * (10 ** 10)\n",                                      # past the memory cap
    ]

    def answer(problem, i):
        return problem["prompt"] + hostile[(i - 1) % len(hostile)]

    async with HumanEvalSuite(n_tasks=1, sandbox_cfg=FAST) as suite:
        policy = Scripted(suite, answer)
        problem = suite.problems()["HumanEval/0"]
        verdicts = [await suite.passes(problem, answer(problem, i + 1))
                    for i in range(len(hostile))]
    assert [ok for ok, _ in verdicts] == [False] * len(hostile), verdicts
    assert not marker.exists()
    assert "timeout" in verdicts[3][1] or "deadline" in verdicts[3][1], verdicts[3]
    assert policy.calls == []


async def test_samples_give_pass_at_k_with_fixed_request_seeds():
    async with HumanEvalSuite(n_tasks=2, samples=4, ks=(1, 2, 4), sandbox_cfg=FAST) as suite:
        # samples 1 and 3 of each task right, 2 and 4 wrong: c = 2 of n = 4
        policy = Scripted(suite, lambda p, i: canonical(p, i) if i % 2 else "```python\n```")
        result = await run_suite(suite, policy, concurrency=1)
    assert [t.detail["correct"] for t in result.tasks] == [2, 2]
    assert result.score == 0.5
    assert suite_pass_at(result.tasks) == {"pass@1": 0.5, "pass@2": pytest.approx(0.8333, abs=1e-4),
                                           "pass@4": 1.0}
    assert {t for t, _ in policy.calls} == {0.8}
    assert [s for _, s in policy.calls] == [0, 1, 2, 3, 1000, 1001, 1002, 1003]
