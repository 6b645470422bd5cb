"""`spade eval`: score a served policy version (or any served model) on the held-out suites."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio
import typer

from spade_async.cli.common import ConfigOpt, JsonOpt, check_endpoint_secrets, config_or_exit, fail
from spade_async.core.config import SpadeConfig


async def _serve_published_adapter(cfg: SpadeConfig, pool: Any, version: int, model: str,
                                   progress: Any) -> None:
    """A published LoRA version that a vllm-lora endpoint no longer holds (it keeps the newest
    few; a restarted server holds none) is loaded again from its weight directory, so a past
    version can be evaluated after the run. Endpoints of other kinds are left alone."""
    from spade_async.core.config import VllmLoraSwap
    from spade_async.core.policy import version_dir
    from spade_async.inference.errors import EndpointError, EndpointRequestError

    if version == 0 or model == cfg.model.served_name:
        return
    await pool.check()
    path = version_dir(cfg.paths.data_dir, version)
    for ep in cfg.endpoints:
        if not isinstance(ep.weight_swap, VllmLoraSwap) or ep.name in pool.serves(model):
            continue
        if not (path / "adapter_config.json").is_file():
            raise EndpointError(f"{ep.name} does not serve {model} and its adapter is not kept "
                                f"at {path} (trainer.keep_versions keeps the newest few)")
        progress(f"{ep.name}: loading {model} from {path}")
        try:
            await pool.post("/v1/load_lora_adapter", {"lora_name": model, "lora_path": str(path)},
                            endpoint=ep.name)
        except EndpointRequestError as exc:
            if "already been loaded" not in exc.detail:
                raise
        pool.note_model(ep.name, model, served=True)


def _reload_only(cfg: SpadeConfig) -> bool:
    """Every trained endpoint reloads full weights: it holds one version at a time."""
    return {e.weight_swap.type for e in cfg.endpoints} - {"none"} == {"vllm-reload"}


def _held_version(reported: str | None, newest: int) -> int:
    """The version a vllm-reload server holds, from the `weight_version` it reports: a number
    once a swap set it; vLLM's initial "default" before any (a server started from the base
    checkpoint, as `scripts/inference.sh` starts one: version 0); the newest published
    version when the server does not say (no `/weight_info`), as the trainer left it."""
    if reported is None:
        return newest
    try:
        return int(reported)
    except ValueError:
        return 0


def _daemon_running(cfg: SpadeConfig) -> bool:
    from spade_async.cli.status_read import read_status

    try:
        return bool(read_status(cfg).get("running"))
    except (FileNotFoundError, ValueError):
        return False


async def _reload_version(cfg: SpadeConfig, pool: Any, version: int, progress: Any) -> None:
    """A vllm-reload server holds only the newest version: load `version`'s full weights
    (the base checkpoint for 0) from its weight directory into every such endpoint, through
    the trainer's own swap (pause, reload_weights, reset_prefix_cache, weight version,
    resume). The trainer's serve check pushes its own version back when it runs again."""
    from spade_async.core.config import VllmReloadSwap, checkpoint_dir
    from spade_async.core.policy import version_dir
    from spade_async.inference.errors import EndpointError
    from trainer.swap.reload import ReloadSwapper

    path = checkpoint_dir(cfg) if version == 0 else version_dir(cfg.paths.data_dir, version)
    if not any(path.glob("*.safetensors")):
        raise EndpointError(f"the full weights of version {version} are not kept at {path} "
                            "(trainer.keep_versions keeps the newest few)")
    for ep in cfg.endpoints:
        if isinstance(ep.weight_swap, VllmReloadSwap):
            progress(f"{ep.name}: reloading version {version}'s weights from {path}")
            await ReloadSwapper(pool, ep.name, cfg.model.served_name).swap(version, path)


def evaluate(
    config: Path = ConfigOpt,
    version: str = typer.Option("latest", "--version", help="policy version N, or 'latest' "
                                "(the one the servers hold now)"),
    suite: list[str] = typer.Option(None, "--suite", help="reasoning-gym, reasoning-gym-easy, "
                                    "humaneval, textarena, bfcl-multi-turn, probe or "
                                    "probe-greedy, or a "
                                    "group: paper (the paper's held-out table), held-out "
                                    "(repeatable; default: eval.suites)"),
    limit: int = typer.Option(None, "--limit", min=1, help="only the first N tasks of a suite"),
    group: str = typer.Option(None, "--group", help="endpoint group to evaluate on (default "
                              "roles.eval.group)"),
    model: str = typer.Option(None, "--model", help="evaluate this served model instead of a "
                              "policy version (default roles.eval.model); its results are "
                              "marked external"),
    path: str = typer.Option(None, "--path", help="tokens, chat or auto (default "
                             "roles.eval.path; auto: tokens for the policy, chat for --model)"),
    compare_to: int = typer.Option(None, "--compare-to", min=0, help="then, per suite, the "
                                   "paired difference (this version minus version N) over the "
                                   "tasks both scored, from N's stored per-task results"),
    stored: bool = typer.Option(False, "--stored", help="with --compare-to: evaluate nothing, "
                                "compare the results already stored for --version"),
    as_json: bool = JsonOpt,
) -> None:
    """Score a served policy version (or, with --model, any served model, on any
    OpenAI-compatible server) on held-out suites (their own checkers); results are stored per
    version under <data_dir>/eval/ and plotted by `spade report`. --compare-to N: the paired
    difference to version N, task by task (the probe plays the same tasks on every version)."""
    from spade_async.core.config import ConfigError, VllmReloadSwap, checkpoint_dir
    from spade_async.core.policy import PolicyVersion, current_path
    from spade_async.evals import expand_suites
    from spade_async.evals.base import model_for_version
    from spade_async.evals.paired import load_tasks
    from spade_async.evals.run import evaluate_version
    from spade_async.inference.chat_tokens import ChatTokens
    from spade_async.inference.errors import EndpointError
    from spade_async.inference.pool import EndpointPool
    from spade_async.inference.roles import RoleCapabilityError, check_roles, role_route

    cfg = config_or_exit(config)
    if stored and compare_to is None:
        raise fail("--stored compares stored results: give --compare-to N", 2)
    over = {k: v for k, v in (("group", group), ("model", model), ("path", path)) if v}
    if over:
        try:
            roles = cfg.roles.model_dump()
            roles["eval"] = {**roles["eval"], **over}
            cfg = type(cfg).model_validate({**cfg.model_dump(), "roles": roles})
        except ValueError as exc:
            msg = str(exc).splitlines()
            raise fail(f"--group/--model/--path: {msg[-1].strip() if msg else exc}",
                       2) from None
    try:
        names = expand_suites(suite or list(cfg.eval.suites))
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    current = PolicyVersion(current_path(cfg.paths.data_dir), cfg.model.served_name)
    current.refresh()
    try:
        v = current.version if version == "latest" else int(version)
    except ValueError as exc:
        raise fail(f"--version {version}: {exc}", 2) from None
    if stored:
        assert compare_to is not None
        _print_stored_comparison(cfg.paths.data_dir, names, v, compare_to, as_json)
        return
    check_endpoint_secrets(cfg)
    route = role_route(cfg, "eval")
    # A full-weight server holds one version: another one is reloaded for the evaluation (and
    # the newest put back after), which only a stopped loop may see. Which one it holds is
    # asked of the server below (a fresh one holds the base, whatever current.json says).
    full_weights = route.model is None and _reload_only(cfg)
    if full_weights and v != current.version and _daemon_running(cfg):
        raise fail(f"--version {version}: the servers hold v{current.version} and reload full "
                   "weights; evaluating another version means reloading it, and the running "
                   "daemon would sample from it: stop the loop first", 2)
    if full_weights and v > current.version:
        raise fail(f"--version {version}: version {v} is not published yet (newest: "
                   f"{current.version})", 2)
    try:
        served = cfg.model.served_name if full_weights else (
            route.model or model_for_version(cfg, v, (current.version, current.model)))
    except ValueError as exc:
        raise fail(f"--version {version}: {exc}", 2) from None
    tokenizer = cfg.model.tokenizer or checkpoint_dir(cfg)
    has_tokenizer = (Path(tokenizer) / "tokenizer_config.json").is_file()

    # version N's stored tasks, read before this run stores its own (N may be this version:
    # then its last run is compared with this one)
    base_tasks = {n: load_tasks(cfg.paths.data_dir, n, compare_to) for n in names} \
        if compare_to is not None else {}
    if unstored := [n for n, t in base_tasks.items() if t is None]:
        raise fail(f"--compare-to {compare_to}: no per-task results of {', '.join(unstored)} "
                   f"stored for v{compare_to} (under {cfg.paths.data_dir / 'eval'}): evaluate "
                   f"it first", 2)

    def progress(msg: str) -> None:
        typer.echo(f"[eval] {msg}", err=True)

    async def main():
        # The chat path needs no tokenizer of ours (the server applies its template).
        chat = (await anyio.to_thread.run_sync(ChatTokens.from_pretrained, tokenizer)
                if route.path == "tokens" or has_tokenizer else None)
        async with EndpointPool(cfg.endpoints, cfg.pool) as pool:
            health = await pool.check()
            check_roles(cfg, pool, ("eval",))
            if route.model is None and not full_weights:
                await _serve_published_adapter(cfg, pool, v, served, progress)
            held = {_held_version(h.weight_version, current.version) for h in health
                    if h.up and isinstance(pool.config(h.name).weight_swap, VllmReloadSwap)}
            reload = full_weights and held != {v}
            if reload:
                await _reload_version(cfg, pool, v, progress)
            progress(f"roles.eval: group {route.group}, {route.path} path, model {served}")
            try:
                return await evaluate_version(cfg, pool, chat, version=v, model=served,
                                              suites=names, limit=limit, progress=progress)
            finally:
                if reload and v != current.version:  # the newest back where the trainer left it
                    with anyio.CancelScope(shield=True):
                        await _reload_version(cfg, pool, current.version, progress)

    try:
        results = anyio.run(main)
    except (RoleCapabilityError, ConfigError) as exc:
        for line in str(exc).splitlines():
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2) from None
    except EndpointError as exc:
        raise fail(str(exc)) from None
    except (RuntimeError, ImportError) as exc:  # a suite's package or venv missing
        raise fail(str(exc), 2) from None
    rows = [r.summary() for r in results]
    if compare_to is not None:
        for res, r in zip(results, rows, strict=True):
            r["paired"] = _paired(res.suite, compare_to, v, base_tasks[res.suite],
                                  [asdict(t) for t in res.tasks])
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        _exit_if_unpaired(rows)
        return
    for res, r in zip(results, rows, strict=True):
        rate = r["completion_tokens"] / r["seconds"] if r["seconds"] else 0.0
        typer.echo(f"{r['suite']} v{r['version']} ({r['model']}, {r['path']} path): "
                   f"{r['scored']} of {r['n']} tasks scored ({r['n'] - r['scored']} failed on "
                   f"the endpoint), {r['errors']} errors, {r['seconds']:.0f} s, "
                   f"{rate:.1f} tok/s")
        scored = [t for t in res.tasks if not t.failed]
        for label, key, n_passed in (
                ("strict", "", sum(t.passed for t in scored)),
                ("lenient", "lenient_", sum(bool(t.lenient_passed) for t in scored))):
            typer.echo(f"  {label:8s} score {_with_ci(r, key + 'score')}, passed "
                       f"{_with_ci(r, key + 'passed')} ({n_passed} of {r['scored']} scored)")
        if "paired" in r:
            for line in _paired_lines(r["paired"]):
                typer.echo(f"  {line}")
    _exit_if_unpaired(rows)


def _paired(suite: str, base: int, version: int, before: list[dict[str, Any]] | None,
            after: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The paired difference `version` - `base` on `suite` from their per-task results;
    {"suite", "before", "after", "error"} when a side has none stored."""
    from spade_async.evals.paired import pair_tasks

    missing = [f"v{x}" for x, t in ((base, before), (version, after)) if t is None]
    if missing:
        return {"suite": suite, "before": base, "after": version,
                "error": f"no per-task results of {suite} stored for {' and '.join(missing)} "
                         f"(run `spade eval --suite {suite} --version N` for each)"}
    assert before is not None and after is not None
    return {"suite": suite, "before": base, "after": version, **pair_tasks(before, after)}


def _paired_lines(p: dict[str, Any]) -> list[str]:
    """`paired v12 - v0: +0.085 [+0.031, +0.139] (n=200, ...); v0 0.260 -> v12 0.345`, and
    the tasks left out."""
    from spade_async.evals.paired import paired_text, unpaired_text

    b, a = f"v{p['before']}", f"v{p['after']}"
    if "error" in p:
        return [f"paired {a} - {b}: {p['error']}"]
    line = f"paired {a} - {b}: {paired_text(p)}"
    if p["n"]:
        line += f"; {b} {p['before_mean']:.3f} -> {a} {p['after_mean']:.3f}"
    left = unpaired_text(p, b, a)
    return [line] + ([f"  not paired: {left}"] if left else [])


def _exit_if_unpaired(rows: list[dict[str, Any]]) -> None:
    """A comparison asked for that had nothing stored to compare with is a failure (exit 1)."""
    if any("error" in r.get("paired", {}) for r in rows):
        raise typer.Exit(1)


def _print_stored_comparison(data_dir: Path, suites: list[str], version: int, base: int,
                             as_json: bool) -> None:
    """`--stored`: per suite, the newest stored summary of `version` with its paired
    difference to `base`, both read from <data_dir>/eval/; nothing is evaluated."""
    from spade_async.evals.base import load_results
    from spade_async.evals.paired import load_tasks

    newest: dict[str, dict[str, Any]] = {}
    for r in load_results(data_dir):
        if int(r.get("version", -1)) == version and r.get("suite") in suites:
            newest[r["suite"]] = r
    rows = [{**newest.get(s, {"suite": s, "version": version}),
             "paired": _paired(s, base, version, load_tasks(data_dir, s, base),
                               load_tasks(data_dir, s, version))} for s in suites]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        for r in rows:
            typer.echo(f"{r['suite']} v{version} (stored)"
                       + (f": score {_with_ci(r, 'score')}" if "score" in r else ""))
            for line in _paired_lines(r["paired"]):
                typer.echo(f"  {line}")
    _exit_if_unpaired(rows)


def _with_ci(row: dict[str, Any], key: str) -> str:
    """`0.375 [0.214, 0.567]`: a mean and its 95% interval, as results.jsonl holds them."""
    lo, hi = row.get(f"{key}_ci95", (0.0, 1.0))
    return f"{row.get(key, 0.0):.3f} [{lo:.3f}, {hi:.3f}]"
