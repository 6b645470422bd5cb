"""The validation pipeline of DESIGN §3: static checks, then sandboxed checks, each with a stored,
human-readable reason. It judges code; it never runs it outside the sandbox.

Order: static (parse, size, imports, names, class shape, params schema) -> load -> determinism ->
hint -> probe policies (types and ranges, not trivially exploitable; an episode a probe does not
end is truncated at max_turns, as in play) -> hint leak (policies read off the hint must not
solve the task: hint_leak.py) -> solution replay -> the model check of the hint (a model asked
for the answer with the hint and without: hint_reader.py; only once every other check passed,
and reported as not run where no endpoint answers). A check that cannot run because an earlier
one failed is reported as skipped.

An environment with difficulty knobs (`params`) runs the sandboxed checks at every point of
`extreme_points` (the defaults, then each knob at its ends), or only at a proposed variant's
params when one is given; a check fails if it fails at any point, and its reason names the point.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from spade_async.core.config import SandboxConfig, ValidationConfig
from spade_async.envs.contract import ContractError, EnvMeta
from spade_async.envs.hint_reader import NAME as READER_CHECK
from spade_async.envs.hint_reader import HintReader, not_run, reader_check
from spade_async.envs.knobs import extreme_points, resolve_params
from spade_async.envs.sandboxed_checks import check_point
from spade_async.envs.static_checks import static_checks, variant_reason
from spade_async.envs.validation_report import SANDBOXED_CHECKS, Check, ValidationReport
from spade_async.sandbox.errors import SandboxError, WorkerStartError
from spade_async.sandbox.runtime import Sandbox


async def validate(code: str, sandbox: Sandbox, vcfg: ValidationConfig | None = None,
                   scfg: SandboxConfig | None = None, *,
                   params: dict[str, Any] | None = None, reader: HintReader | None = None,
                   no_reader: str = "no endpoint to ask") -> ValidationReport:
    """Validate `code`. Without `params`, an environment with knobs is checked at every point
    of `extreme_points` (all seeds at the defaults, `vcfg.extreme_seeds` of them at the other
    points); with `params` (a variant an edit proposed), only there, after the defaults are
    filled in. A variant that does not fit the knobs fails `static.params`; nothing raises.
    `reader` runs the model check of the hint at the first point once every other check has
    passed; without one it is reported as not run, saying why (`no_reader`)."""
    vcfg = vcfg or ValidationConfig()
    scfg = scfg or sandbox.cfg
    t0 = time.perf_counter()
    checks = static_checks(code, scfg.max_code_bytes, params)
    if any(c.passed is False for c in checks):
        checks += [Check(n, None, "static checks failed")
                   for n in SANDBOXED_CHECKS + (READER_CHECK,)]
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
                checks[at_params] = Check("static.params", False, variant_reason(params, exc))
                points = []
            per_point: list[dict[str, Check]] = []
            for i, point in enumerate(points):
                seeds = vcfg.seeds if i == 0 else vcfg.seeds[: vcfg.extreme_seeds]
                found: dict[str, Check] = {}
                per_point.append(found)
                ran.append(point)
                try:
                    await check_point(env, meta, point, seeds, vcfg, found, probe_scores,
                                      echo=params is None and i == 0)
                except WorkerStartError:
                    raise  # the node was lost mid-check: no verdict (below)
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
    if not accepted:
        model = Check(READER_CHECK, None, "not run: an earlier check failed")
    elif reader is None or not vcfg.reader:
        model = not_run(no_reader if vcfg.reader else "validation.reader is off")
    else:
        assert meta is not None
        reader = replace(reader, max_tokens=vcfg.reader_tokens, max_turns=vcfg.reader_turns)
        model = await reader_check(sandbox, code, meta, reader, list(vcfg.seeds),
                                   vcfg.reader_threshold, ran[0] if meta.params else None)
        accepted = model.passed is not False
    checks.append(model)
    return ValidationReport(accepted, tuple(checks), meta, time.perf_counter() - t0, probe_scores,
                            tuple(ran))


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


def _point_label(point: dict[str, Any]) -> str:
    text = json.dumps(point, ensure_ascii=False)
    return text if len(text) <= 300 else text[:297] + "..."
