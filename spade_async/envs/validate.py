"""The validation pipeline of DESIGN §3: static checks, then sandboxed checks, each with a stored,
human-readable reason. It judges code; it never runs it outside the sandbox.

Order: static (parse, size, imports, names, class shape, params schema) -> load -> determinism ->
hint -> probe policies (types and ranges, not trivially exploitable; an episode a probe does not
end is truncated at max_turns, as in play) -> hint leak (policies read off the hint must not
solve the task: hint_leak.py) -> solution replay. A check that cannot run because an earlier one failed is reported as skipped.

An environment with difficulty knobs (`params`) runs the sandboxed checks at every point of
`extreme_points` (the defaults, then each knob at its ends), or only at a proposed variant's
params when one is given; a check fails if it fails at any point, and its reason names the point.
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

from spade_async.core.config import SandboxConfig, ValidationConfig
from spade_async.envs.contract import (  # noqa: F401 (declared_params: used from here too)
    ALLOWED_IMPORTS,
    COMPUTED,
    REQUIRED_METHODS,
    ContractError,
    EnvMeta,
    ParamSpec,
    check_params_schema,
    class_params_literal,
    declared_params,
    episode_score,
    extreme_points,
    resolve_params,
)
from spade_async.envs.hint_leak import answer_prefixes, leak_policies
from spade_async.sandbox.errors import SandboxError, WorkerStartError
from spade_async.sandbox.runtime import Sandbox
from spade_async.sandbox.session import EnvSession

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
# Besides these constants, each environment gets probes made for it (`_probes`): random text,
# the right format with wrong content, a verbose reply that sprays candidate answers, and
# well-formed calls of each of its tools with empty or wrong arguments.
PROBES: tuple[str, ...] = (
    "", "hello world lorem ipsum", "0", "1", "42", "yes", "A", '{"tool": "noop", "arguments": {}}',
)
# A long reply that contains many plausible answers: a verifier that pays when the answer
# appears anywhere in the reply (or pays for length) pays it.
VERBOSE = ("Let me think step by step. " + " ".join(str(i) for i in range(-20, 101))
           + " yes no true false none A B C D E R G Y O P left right up down north south east west"
           + " ANSWER: 1 ANSWER: 0 " + "lorem ipsum dolor sit amet " * 12).strip()


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
    probe_scores: dict[str, float] = field(default_factory=dict)  # worst over seeds and points
    points: tuple[dict[str, Any], ...] = ()  # the knob settings the sandboxed checks ran at

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
            "points": [dict(p) for p in self.points],
        }


STATIC_CHECKS = ("static.size", "static.parse", "static.imports", "static.names",
                 "static.class", "static.params")
SANDBOXED_CHECKS = ("load", "determinism", "hint", "types", "not_exploitable", "hint_leak",
                    "solution")
ALL_CHECKS = STATIC_CHECKS + SANDBOXED_CHECKS

# ---- static ------------------------------------------------------------------------------


def static_checks(code: str, max_bytes: int, params: dict[str, Any] | None = None) -> list[Check]:
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
    checks.append(_static_params(classes[0] if classes else None, params))
    return checks


def _static_params(cls: ast.ClassDef | None, params: dict[str, Any] | None) -> Check:
    """The knobs' schema, and a proposed variant's values against it, before anything runs.
    The loaded environment's own `params` is checked again after load (it may be computed)."""
    raw = class_params_literal(cls)
    if raw is COMPUTED:
        return Check("static.params", True, "params is not a literal: checked after load")
    try:
        specs = check_params_schema(raw)
    except ContractError as exc:
        return Check("static.params", False, str(exc))
    if params is not None and (specs or raw is not None):
        try:
            resolve_params(specs, params)
        except ContractError as exc:
            return Check("static.params", False, _variant_reason(params, exc))
    return Check("static.params", True, ", ".join(s.name for s in specs))


def _variant_reason(params: Any, exc: ContractError) -> str:
    text = json.dumps(params, ensure_ascii=False, default=repr)
    return f"the proposed params {text[:200]} do not fit the environment: {exc}"


def _point_label(point: dict[str, Any]) -> str:
    text = json.dumps(point, ensure_ascii=False)
    return text if len(text) <= 300 else text[:297] + "..."


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


def _short(action: str, n: int = 60) -> str:
    return repr(action if len(action) <= n else action[:n] + "...")


def _probes(meta: EnvMeta, solution: list[str] | None) -> list[tuple[str, str]]:
    """(label, action) of every probe policy for this environment, each repeated every turn."""
    out = [(f"constant {_short(p)}", p) for p in PROBES]
    rng = random.Random(0)
    out.append(("random text", "".join(rng.choice(string.printable) for _ in range(40))))
    out.append(("verbose filler", VERBOSE))
    wrong = _wrong_answer(solution or [])
    if wrong is not None:
        out.append(("right format, wrong content", wrong))
    for prefix in answer_prefixes(solution):
        out.append((f"format only {_short(prefix)}", prefix + "zzzz"))
        out.append((f"format with filler {_short(prefix)}", prefix + VERBOSE))
    for tool in meta.tools:
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            continue
        props = (fn.get("parameters") or {}).get("properties") or {}
        wrong_args = {k: ("zzzz" if (v or {}).get("type") == "string" else -987654)
                      for k, v in props.items() if isinstance(v, dict) or v is None}
        for what, args in (("empty", {}), ("wrong", wrong_args)):
            out.append((f"tool call {name} with {what} arguments",
                        json.dumps({"tool": name, "arguments": args})))
    seen: set[str] = set()
    return [(label, a) for label, a in out if not (a in seen or seen.add(a))]


@dataclass(frozen=True)
class LeakResult:
    """How often policies read off the hint solve the episode: `own` (each seed's own hint),
    `control` (the hint of another episode at the same point, on the same seed: what the
    answer space alone gives away); `rate` is own - control."""

    own: float
    control: float
    example: str = ""  # the first policy that solved with the episode's own hint

    @property
    def rate(self) -> float:
        return max(0.0, self.own - self.control)

    def reason(self, threshold: float) -> str:
        return (f"the hint gives the answer away: {self.example} solves "
                f"{self.own:.0%} of the episodes (against {self.control:.0%} with another "
                f"episode's hint), {self.rate:.2f} >= {threshold}")


CONTROL_SEED_OFFSET = 7919  # the control episode's seed: another episode at the same point


async def _hint_leak(env: EnvSession, meta: EnvMeta, point: dict[str, Any],
                     seeds: list[int]) -> LeakResult:
    """DESIGN §3b: play the policies `leak_policies` reads off the hint (hint_leak.py)."""

    async def solved_by(seed: int, hint_seed: int) -> str | None:
        await env.reset(hint_seed, point)
        hint = await env.hint()
        sol = await env.solution() if meta.has_solution else None
        for policy in leak_policies(hint, sol):
            score, _, _ = await _play(env, seed, point, policy.plan(meta.max_turns),
                                      meta.max_turns)
            if score >= 1.0 - 1e-9:
                return f"{policy.what} ({_short(' | '.join(policy.actions))})"
        return None

    own = control = 0
    example = ""
    for seed in seeds:
        hit = await solved_by(seed, seed)
        if hit is not None:
            own += 1
            example = example or hit
            control += await solved_by(seed, seed + CONTROL_SEED_OFFSET) is not None
    return LeakResult(own / len(seeds), control / len(seeds), example)


async def _play(env: EnvSession, seed: int, params: dict[str, Any], actions: list[str] | str,
                max_turns: int) -> tuple[float, bool, int]:
    """Reset, then play `actions` (or repeat one action) until done; (score, ended, turns)."""
    await env.reset(seed, params)
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
                   scfg: SandboxConfig | None = None, *,
                   params: dict[str, Any] | None = None) -> ValidationReport:
    """Validate `code`. Without `params`, an environment with knobs is checked at every point
    of `extreme_points` (all seeds at the defaults, `vcfg.extreme_seeds` of them at the other
    points); with `params` (a variant an edit proposed), only there, after the defaults are
    filled in. A variant that does not fit the knobs fails `static.params`; nothing raises."""
    vcfg = vcfg or ValidationConfig()
    scfg = scfg or sandbox.cfg
    t0 = time.perf_counter()
    checks = static_checks(code, scfg.max_code_bytes, params)
    if any(c.passed is False for c in checks):
        checks += [Check(n, None, "static checks failed") for n in SANDBOXED_CHECKS]
        return ValidationReport(False, tuple(checks), seconds=time.perf_counter() - t0)

    meta: EnvMeta | None = None
    probe_scores: dict[str, float] = {}
    results: dict[str, Check] = {}
    ran: list[dict[str, Any]] = []
    at_params = next(i for i, c in enumerate(checks) if c.name == "static.params")

    try:
        async with sandbox.open(code) as env:
            meta = env.meta
            results["load"] = Check("load", True)
            try:
                points = ([resolve_params(meta.params, params)] if params is not None
                          else extreme_points(meta.params))
            except ContractError as exc:  # the knobs are computed: only now can we tell
                checks[at_params] = Check("static.params", False, _variant_reason(params, exc))
                points = []
            per_point: list[dict[str, Check]] = []
            for i, point in enumerate(points):
                seeds = vcfg.seeds if i == 0 else vcfg.seeds[: vcfg.extreme_seeds]
                found: dict[str, Check] = {}
                per_point.append(found)
                ran.append(point)
                try:
                    await _check_point(env, meta, point, seeds, vcfg, found, probe_scores)
                except SandboxError as exc:
                    _record_failure(found, exc)
                    break  # the worker may be dead: the remaining points are not run
            results |= _merge_points(points, per_point, labelled=bool(meta.params))
    except WorkerStartError:
        raise  # the host failed, not the environment: no verdict (the caller may retry)
    except SandboxError as exc:
        if "load" not in results:
            results["load"] = Check("load", False, str(exc) + _tb(exc))
        else:  # raised outside a point's checks (tearing the session down)
            _record_failure(results, exc)

    skipped = ("not run: the params do not fit the environment"
               if checks[at_params].passed is False else "not run: an earlier check failed")
    for name in SANDBOXED_CHECKS:
        if name not in results:
            results[name] = Check(name, None, skipped)
    checks += [results[n] for n in SANDBOXED_CHECKS]
    accepted = all(c.passed is not False for c in checks) and all(
        results[n].passed is True for n in SANDBOXED_CHECKS)
    return ValidationReport(accepted, tuple(checks), meta, time.perf_counter() - t0, probe_scores,
                            tuple(ran))


async def _check_point(env: EnvSession, meta: EnvMeta, point: dict[str, Any], seeds: list[int],
                       vcfg: ValidationConfig, results: dict[str, Check],
                       probe_scores: dict[str, float]) -> None:
    """The sandboxed checks at one knob setting, recorded into `results` as they finish; a
    SandboxError propagates with the earlier checks recorded (the caller fails the next one)."""

    def record(name: str, passed: bool, reason: str = "") -> None:
        results[name] = Check(name, passed, reason)

    # determinism. Hidden state counts too: the hint and the solution reveal it.
    async def episode_start(seed: int) -> tuple:
        first = await env.reset(seed, point)
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
        await env.reset(seed, point)
        if not (await env.hint()).strip():
            empty.append(seed)
    record("hint", not empty, "" if not empty else f"hint() is empty after reset({empty[0]})")
    # probes: types/ranges, exploitability. An episode a probe does not end is truncated at
    # max_turns, as the runner does in play (the environment need not count turns).
    solution = None
    if meta.has_solution:
        await env.reset(seeds[0], point)
        solution = await env.solution()
    exploit: list[tuple[str, str, float]] = []
    for label, probe in _probes(meta, solution):
        worst = 0.0
        for seed in seeds:
            score, _, _ = await _play(env, seed, point, probe, meta.max_turns)
            worst = max(worst, score)
        probe_scores[probe] = max(worst, probe_scores.get(probe, 0.0))
        if worst >= vcfg.exploit_threshold:
            exploit.append((label, probe, worst))
    record("types", True)
    record("not_exploitable", not exploit, "" if not exploit else
           f"the probe {exploit[0][0]} (action {_short(exploit[0][1])}, every turn) scores "
           f"{exploit[0][2]:.2f} >= {vcfg.exploit_threshold} (the reward pays without solving)")
    # the hint does not give the answer away
    leak = await _hint_leak(env, meta, point, seeds)
    record("hint_leak", leak.rate < vcfg.exploit_threshold, "" if leak.rate <
           vcfg.exploit_threshold else leak.reason(vcfg.exploit_threshold))
    # solution replay
    if not meta.has_solution:
        record("solution", True, "no solution() to replay")
        return
    short = []
    for seed in seeds:
        await env.reset(seed, point)
        actions = await env.solution()
        score, _, _ = await _play(env, seed, point, actions, meta.max_turns)
        if score < vcfg.solution_score - 1e-9:
            short.append((seed, score, len(actions)))
    record("solution", not short, "" if not short else
           f"replaying solution() for seed {short[0][0]} ({short[0][2]} actions) "
           f"scores {short[0][1]:.2f}, not {vcfg.solution_score:g}: the verifier "
           "or the solution is broken")


def _merge_points(points: list[dict[str, Any]], per_point: list[dict[str, Check]],
                  labelled: bool) -> dict[str, Check]:
    """One verdict per check over all points: failed if it failed anywhere (the first such
    point named, and the share of points it passed as partial credit), passed if it passed at
    every point, else skipped (a sandbox failure stopped the run before it got there)."""
    runs = per_point + [{}] * (len(points) - len(per_point))
    out: dict[str, Check] = {}
    for name in _STAGE_OF_FAILURE:
        seen = [(p, r[name]) for p, r in zip(points, runs, strict=True) if name in r]
        failed = [(p, c) for p, c in seen if c.passed is False]
        if failed:
            point, first = failed[0]
            passes = sum(c.passed is True for _, c in seen)
            where = f"at params {_point_label(point)}: " if labelled else ""
            out[name] = Check(name, False, where + first.reason,
                              credit=min(passes / len(points), 0.99))
        elif seen and len(seen) == len(points):
            out[name] = Check(name, True, seen[0][1].reason)
        elif seen:
            missing = next(p for p, r in zip(points, runs, strict=True) if name not in r)
            out[name] = Check(name, None, f"not run at params {_point_label(missing)}: an "
                              "earlier check failed")
    return out


_STAGE_OF_FAILURE = ("determinism", "hint", "types", "not_exploitable", "hint_leak", "solution")


def _tb(exc: SandboxError) -> str:
    return f"\n{exc.traceback}" if exc.traceback else ""


def _record_failure(results: dict[str, Check], exc: SandboxError) -> None:
    """A sandbox error during a stage fails the first stage without a verdict yet."""
    stage = next(n for n in _STAGE_OF_FAILURE if n not in results)
    if stage == "not_exploitable":
        stage = "types"  # it ran inside the probe loop that failed
    label = {"timeout": "exceeded its time limit", "crashed": "killed the worker",
             "contract": "returned a value outside the contract",
             "output_limit": "sent too much output"}.get(exc.kind, "raised")
    results[stage] = Check(stage, False, f"{label}: {exc}{_tb(exc)}")
