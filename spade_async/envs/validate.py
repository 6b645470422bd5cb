"""The validation pipeline of DESIGN §3: static checks, then sandboxed checks, each with a stored,
human-readable reason. It judges code; it never runs it outside the sandbox.

Order: static (parse, size, imports, names, class shape) -> load -> determinism -> hint ->
probe policies (types and ranges, termination within max_turns, not trivially exploitable) ->
solution replay. A check that cannot run because an earlier one failed is reported as skipped.
"""

from __future__ import annotations

import ast
import json
import random
import re
import string
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from spade_async.config import SandboxConfig, ValidationConfig
from spade_async.envs.contract import (
    ALLOWED_IMPORTS,
    REQUIRED_METHODS,
    EnvMeta,
    episode_score,
)
from spade_async.sandbox.runtime import EnvSession, Sandbox, SandboxError, WorkerStartError

FORBIDDEN_NAMES = frozenset(
    "__import__ eval exec compile open input breakpoint globals locals vars memoryview help "
    "exit quit getattr setattr delattr __builtins__ __loader__ __spec__".split()
)
ALLOWED_DUNDERS = frozenset(
    "__init__ __repr__ __str__ __eq__ __lt__ __le__ __gt__ __ge__ __hash__ __len__ __iter__ "
    "__contains__ __post_init__ __name__".split()
)
_DUNDER_TEXT = re.compile(r"__\w+__")

# Probe policies: each repeats one action every turn. None of them may score >= the threshold.
PROBES: tuple[str, ...] = (
    "", "hello world lorem ipsum", "0", "1", "42", "yes", "A", '{"tool": "noop", "arguments": {}}',
)


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool | None  # None: skipped
    reason: str = ""
    credit: float = 0.0  # a failed check's partial progress in [0, 1) (a syntax error's line)


@dataclass(frozen=True)
class ValidationReport:
    accepted: bool
    checks: tuple[Check, ...]
    meta: EnvMeta | None = None
    seconds: float = 0.0
    probe_scores: dict[str, float] = field(default_factory=dict)

    @property
    def progress(self) -> float:
        """Share of the whole pipeline's checks passed, plus a failed check's partial credit:
        the dense signal behind `regret.invalid_partial_credit`. The denominator is every check
        there is, so failing early always scores below failing late."""
        passed = sum(c.passed is True for c in self.checks)
        credit = sum(c.credit for c in self.checks if c.passed is False)
        return min(1.0, (passed + credit) / len(ALL_CHECKS))

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.passed is False]

    @property
    def reason(self) -> str:
        """The first failure's reason: what the memory stores for a rejected environment."""
        f = self.failures
        return f"{f[0].name}: {f[0].reason}" if f else ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "reason": self.reason,
            "seconds": round(self.seconds, 4),
            "meta": None if self.meta is None else asdict(self.meta),
            "checks": [asdict(c) for c in self.checks],
            "probe_scores": self.probe_scores,
        }


STATIC_CHECKS = ("static.size", "static.parse", "static.imports", "static.names",
                 "static.class")
SANDBOXED_CHECKS = ("load", "determinism", "hint", "types", "termination", "not_exploitable",
                    "solution")
ALL_CHECKS = STATIC_CHECKS + SANDBOXED_CHECKS

# ---- static ------------------------------------------------------------------------------


def static_checks(code: str, max_bytes: int) -> list[Check]:
    checks: list[Check] = []
    size = len(code.encode())
    checks.append(Check("static.size", size <= max_bytes,
                        "" if size <= max_bytes else f"{size} bytes, the limit is {max_bytes}"))
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        lines = code.count("\n") + 1
        before = max(0, min((exc.lineno or 1) - 1, lines)) / lines
        checks.append(Check("static.parse", False, f"SyntaxError: {exc.msg} (line {exc.lineno})",
                            credit=min(before, 0.99)))
        return checks
    checks.append(Check("static.parse", True))

    bad_imports = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad_imports += [a.name for a in node.names if a.name.split(".")[0] not in ALLOWED_IMPORTS]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level or mod.split(".")[0] not in ALLOWED_IMPORTS:
                bad_imports.append("." * node.level + mod)
    checks.append(Check("static.imports", not bad_imports, "" if not bad_imports else
                        f"imports outside the allow-list: {', '.join(sorted(set(bad_imports)))} "
                        f"(allowed: {', '.join(sorted(ALLOWED_IMPORTS))})"))

    bad: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            bad.append(f"line {node.lineno}: use of '{node.id}'")
        elif isinstance(node, ast.Name) and node.id.startswith("__") and node.id not in ALLOWED_DUNDERS:
            bad.append(f"line {node.lineno}: name '{node.id}'")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__") and (
            node.attr not in ALLOWED_DUNDERS or node.attr == "__name__"
        ):
            bad.append(f"line {node.lineno}: attribute '.{node.attr}'")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _DUNDER_TEXT.search(
            node.value
        ):
            bad.append(f"line {node.lineno}: string naming a dunder ({_DUNDER_TEXT.search(node.value)[0]})")
    checks.append(Check("static.names", not bad, "" if not bad else
                        "reaches interpreter internals: " + "; ".join(bad[:5])))

    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Environment"]
    if not classes:
        checks.append(Check("static.class", False, "no top-level class named Environment"))
    else:
        methods = {n.name for n in classes[0].body if isinstance(n, ast.FunctionDef)}
        missing = [m for m in REQUIRED_METHODS if m not in methods]
        checks.append(Check("static.class", not missing, "" if not missing else
                            f"Environment lacks {', '.join(m + '()' for m in missing)}"))
    return checks


# ---- sandboxed ---------------------------------------------------------------------------


def _wrong_answer(solution: list[str]) -> str | None:
    """A plausible wrong answer: the solution's last action with its last number changed."""
    if not solution:
        return None
    last = solution[-1]
    nums = list(re.finditer(r"-?\d+", last))
    if nums:
        m = nums[-1]
        return last[: m.start()] + str(int(m.group()) + 1) + last[m.end():]
    return last + " not"


async def _play(env: EnvSession, seed: int, actions: list[str] | str, max_turns: int,
                ) -> tuple[float, bool, int]:
    """Reset, then play `actions` (or repeat one action) until done; (score, ended, turns)."""
    await env.reset(seed)
    rewards: list[float] = []
    ended = False
    turns = 0
    seq = [actions] * max_turns if isinstance(actions, str) else list(actions)
    for action in seq:
        res = await env.step(action)
        json.dumps(res.info)  # already checked, but a probe must see JSON-safe info
        rewards.append(res.reward)
        turns += 1
        if res.done:
            ended = True
            break
    return episode_score(rewards), ended, turns


async def validate(code: str, sandbox: Sandbox, vcfg: ValidationConfig | None = None,
                   scfg: SandboxConfig | None = None) -> ValidationReport:
    vcfg = vcfg or ValidationConfig()
    scfg = scfg or sandbox.cfg
    t0 = time.perf_counter()
    checks = static_checks(code, scfg.max_code_bytes)
    if any(c.passed is False for c in checks):
        checks += [Check(n, None, "static checks failed") for n in SANDBOXED_CHECKS]
        return ValidationReport(False, tuple(checks), seconds=time.perf_counter() - t0)

    meta: EnvMeta | None = None
    probe_scores: dict[str, float] = {}
    results: dict[str, Check] = {}

    def record(name: str, passed: bool, reason: str = "") -> None:
        results[name] = Check(name, passed, reason)

    try:
        async with sandbox.open(code) as env:
            meta = env.meta
            record("load", True)
            try:
                seeds = vcfg.seeds
                # determinism
                # Hidden state counts too: the hint and the solution reveal it.
                async def episode_start(seed: int) -> tuple:
                    first = await env.reset(seed)
                    sol = await env.solution() if meta.has_solution else None
                    return first.observation, first.info, await env.hint(), sol

                diffs = []
                for seed in seeds:
                    a, b = await episode_start(seed), await episode_start(seed)
                    if a != b:
                        what = [w for w, x, y in zip(("observation", "info", "hint", "solution"),
                                                     a, b, strict=True) if x != y]
                        diffs.append(f"reset({seed}) twice gave a different {' and '.join(what)}")
                        break
                record("determinism", not diffs, "" if not diffs else
                       diffs[0] + " (seed the environment's random.Random(seed), not the global "
                       "random module or the clock)")
                # hint
                empty = []
                for seed in seeds:
                    await env.reset(seed)
                    if not (await env.hint()).strip():
                        empty.append(seed)
                record("hint", not empty, "" if not empty else
                       f"hint() is empty after reset({empty[0]})")
                # probes: types/ranges, termination, exploitability
                solution = None
                if meta.has_solution:
                    await env.reset(seeds[0])
                    solution = await env.solution()
                probes = list(PROBES)
                rng = random.Random(0)
                probes.append("".join(rng.choice(string.printable) for _ in range(40)))
                wrong = _wrong_answer(solution or [])
                if wrong is not None and wrong not in probes:
                    probes.append(wrong)
                no_end: list[str] = []
                exploit: list[str] = []
                for probe in probes:
                    worst = 0.0
                    for seed in seeds:
                        score, ended, _ = await _play(env, seed, probe, meta.max_turns)
                        worst = max(worst, score)
                        if not ended and probe not in no_end:
                            no_end.append(probe)
                    probe_scores[probe] = worst
                    if worst >= vcfg.exploit_threshold:
                        exploit.append(probe)
                record("types", True)
                record("termination", not no_end, "" if not no_end else
                       f"the episode did not end within max_turns={meta.max_turns} under the "
                       f"probe action {no_end[0]!r} (step must return terminated or truncated)")
                record("not_exploitable", not exploit, "" if not exploit else
                       f"the constant action {exploit[0]!r} scores {probe_scores[exploit[0]]:.2f} "
                       f">= {vcfg.exploit_threshold} (the reward pays without solving)")
                # solution replay
                if not meta.has_solution:
                    record("solution", True, "no solution() to replay")
                else:
                    short = []
                    for seed in seeds:
                        await env.reset(seed)
                        actions = await env.solution()
                        score, _, _ = await _play(env, seed, actions, meta.max_turns)
                        if score < vcfg.solution_score - 1e-9:
                            short.append((seed, score, len(actions)))
                    record("solution", not short, "" if not short else
                           f"replaying solution() for seed {short[0][0]} ({short[0][2]} actions) "
                           f"scores {short[0][1]:.2f}, not {vcfg.solution_score:g}: the verifier "
                           "or the solution is broken")
            except SandboxError as exc:
                _record_failure(results, exc)
    except WorkerStartError:
        raise  # the host failed, not the environment: no verdict (the caller may retry)
    except SandboxError as exc:
        if "load" not in results:
            results["load"] = Check("load", False, str(exc) + _tb(exc))
        else:
            _record_failure(results, exc)

    for name in SANDBOXED_CHECKS:
        if name not in results:
            results[name] = Check(name, None, "not run: an earlier check failed")
    checks += [results[n] for n in SANDBOXED_CHECKS]
    accepted = all(c.passed is not False for c in checks) and results["load"].passed is True
    return ValidationReport(accepted, tuple(checks), meta, time.perf_counter() - t0, probe_scores)


_STAGE_OF_FAILURE = ("determinism", "hint", "types", "termination", "not_exploitable", "solution")


def _tb(exc: SandboxError) -> str:
    return f"\n{exc.traceback}" if exc.traceback else ""


def _record_failure(results: dict[str, Check], exc: SandboxError) -> None:
    """A sandbox error during a stage fails the first stage without a verdict yet."""
    stage = next(n for n in _STAGE_OF_FAILURE if n not in results)
    if stage in ("termination", "not_exploitable"):
        stage = "types"  # they ran inside the probe loop that failed
    label = {"timeout": "exceeded its time limit", "crashed": "killed the worker",
             "contract": "returned a value outside the contract",
             "output_limit": "sent too much output"}.get(exc.kind, "raised")
    results[stage] = Check(stage, False, f"{label}: {exc}{_tb(exc)}")
