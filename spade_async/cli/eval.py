"""`spade eval`: score a served policy version (or any served model) on the held-out suites."""

from __future__ import annotations

import json
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


def evaluate(
    config: Path = ConfigOpt,
    version: str = typer.Option("latest", "--version", help="policy version N, or 'latest' "
                                "(the one the servers hold now)"),
    suite: list[str] = typer.Option(None, "--suite", help="reasoning-gym, reasoning-gym-easy, "
                                    "bfcl-multi-turn or probe (repeatable; default: "
                                    "eval.suites)"),
    limit: int = typer.Option(None, "--limit", min=1, help="only the first N tasks of a suite"),
    group: str = typer.Option(None, "--group", help="endpoint group to evaluate on (default "
                              "roles.eval.group)"),
    model: str = typer.Option(None, "--model", help="evaluate this served model instead of a "
                              "policy version (default roles.eval.model); its results are "
                              "marked external"),
    path: str = typer.Option(None, "--path", help="tokens, chat or auto (default "
                             "roles.eval.path; auto: tokens for the policy, chat for --model)"),
    as_json: bool = JsonOpt,
) -> None:
    """Score a served policy version (or, with --model, any served model, on any
    OpenAI-compatible server) on held-out suites (their own checkers); results are stored per
    version under <data_dir>/eval/ and plotted by `spade report`."""
    from spade_async.core.config import ConfigError, checkpoint_dir
    from spade_async.core.policy import PolicyVersion, current_path
    from spade_async.evals import SUITES
    from spade_async.evals.base import model_for_version
    from spade_async.evals.run import evaluate_version
    from spade_async.inference.chat_tokens import ChatTokens
    from spade_async.inference.errors import EndpointError
    from spade_async.inference.pool import EndpointPool
    from spade_async.inference.roles import RoleCapabilityError, check_roles, role_route

    cfg = config_or_exit(config)
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
    check_endpoint_secrets(cfg)
    route = role_route(cfg, "eval")
    names = suite or list(cfg.eval.suites)
    for n in names:
        if n not in SUITES:
            raise fail(f"unknown suite {n!r}: one of {', '.join(SUITES)}", 2)
    current = PolicyVersion(current_path(cfg.paths.data_dir), cfg.model.served_name)
    current.refresh()
    try:
        v = current.version if version == "latest" else int(version)
        served = route.model or model_for_version(cfg, v, (current.version, current.model))
    except ValueError as exc:
        raise fail(f"--version {version}: {exc}", 2) from None
    tokenizer = cfg.model.tokenizer or checkpoint_dir(cfg)
    has_tokenizer = (Path(tokenizer) / "tokenizer_config.json").is_file()

    def progress(msg: str) -> None:
        typer.echo(f"[eval] {msg}", err=True)

    async def main():
        # The chat path needs no tokenizer of ours (the server applies its template).
        chat = (await anyio.to_thread.run_sync(ChatTokens.from_pretrained, tokenizer)
                if route.path == "tokens" or has_tokenizer else None)
        async with EndpointPool(cfg.endpoints, cfg.pool) as pool:
            await pool.check()
            check_roles(cfg, pool, ("eval",))
            if route.model is None:
                await _serve_published_adapter(cfg, pool, v, served, progress)
            progress(f"roles.eval: group {route.group}, {route.path} path, model {served}")
            return await evaluate_version(cfg, pool, chat, version=v, model=served,
                                          suites=names, limit=limit, progress=progress)

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
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
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


def _with_ci(row: dict[str, Any], key: str) -> str:
    """`0.375 [0.214, 0.567]`: a mean and its 95% interval, as results.jsonl holds them."""
    lo, hi = row.get(f"{key}_ci95", (0.0, 1.0))
    return f"{row.get(key, 0.0):.3f} [{lo:.3f}, {hi:.3f}]"
