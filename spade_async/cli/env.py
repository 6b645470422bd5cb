"""`spade env ...`: validate environment files in the sandbox, and play one turn by turn."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import typer

from spade_async.cli.common import ConfigOpt, JsonOpt, config_or_exit, fail
from spade_async.core.config import SpadeConfig

env_app = typer.Typer(help="Environments: validate and play them in the sandbox.",
                      no_args_is_help=True)
ParamsOpt = typer.Option(None, "--params", help='the environment\'s knobs as a JSON object, '
                         'e.g. \'{"digits": 2}\' (the others keep their defaults)')


def _read_env_file(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"cannot read environment file {path}: {exc}", 2) from None


def _stored_env_code(cfg: SpadeConfig, env_id: str) -> str:
    from memory_db.store import open_memory
    from spade_async.core.config import memory_config

    mcfg, uri = memory_config(cfg)

    async def get() -> str:
        async with open_memory(mcfg, uri, writable=False) as mem:
            rec = await mem.get(env_id, code=True)
            return rec.code or ""

    try:
        return anyio.run(get)
    except (KeyError, LookupError, ValueError) as exc:
        raise fail(f"no environment '{env_id}' in the memory at {uri}: {exc}", 2) from None


def _parse_params(text: str | None) -> dict[str, Any] | None:
    """`--params` as a dict; a malformed one ends the command with a one-line error."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(f"--params is not valid JSON ({exc}): {text[:120]}", 2) from None
    if not isinstance(value, dict):
        raise fail(f"--params must be a JSON object like '{{\"digits\": 2}}', got "
                   f"{type(value).__name__}", 2)
    return value


@env_app.command("validate")
def env_validate(
    files: list[Path] = typer.Argument(..., help="environment module(s) (.py)"),
    config: Path = ConfigOpt,
    as_json: bool = JsonOpt,
    params_json: str | None = ParamsOpt,
    model_check: bool = typer.Option(True, "--model-check/--no-model-check",
                                     help="read the hint with the policy model on the "
                                     "config's agent endpoints (hint_reader), where one "
                                     "answers; otherwise that check is reported as not run"),
) -> None:
    """Run the validation pipeline; exit 0 when every file is accepted, 1 if any is rejected.
    An environment with knobs is checked at its defaults and every knob's extremes; with
    --params, only at those values (a value that does not fit fails static.params). The
    model check of the hint runs where an agent endpoint of the config answers."""
    from spade_async.envs.validate import validate
    from spade_async.sandbox.isolation import SandboxUnavailable
    from spade_async.sandbox.runtime import Sandbox

    cfg = config_or_exit(config)
    params = _parse_params(params_json)
    codes = [(f, _read_env_file(f)) for f in files]
    sb_cfg = cfg.sandbox.model_copy(update={"warm_workers": min(cfg.sandbox.warm_workers, 2)})

    async def run_all():
        async with Sandbox(sb_cfg) as sb, hint_reader_for(cfg, model_check) as (reader, why):
            return [(f, await validate(code, sb, cfg.validation, params=params, reader=reader,
                                       no_reader=why))
                    for f, code in codes]

    try:
        reports = anyio.run(run_all)
    except SandboxUnavailable as exc:
        raise fail(str(exc), 2) from None
    if as_json:
        out = [{"file": str(f), **r.as_dict()} for f, r in reports]
        typer.echo(json.dumps(out[0] if len(out) == 1 else out, indent=2))
    else:
        for f, r in reports:
            verdict = "ACCEPTED" if r.accepted else "REJECTED"
            name = r.meta.name if r.meta else "?"
            typer.echo(f"{f}: {verdict} ({name}, {r.seconds * 1000:.0f} ms)")
            if len(r.points) > 1 or any(r.points):
                typer.echo(f"  at {len(r.points)} params point(s): "
                           + "; ".join(json.dumps(p) for p in r.points))
            for c in r.checks:
                mark = {True: "ok  ", False: "FAIL", None: "skip"}[c.passed]
                line = f"  {mark} {c.name}"
                if c.reason and c.passed is not True:
                    line += ": " + c.reason.replace("\n", "\n        ")
                elif c.reason:
                    line += f" ({c.reason})"
                typer.echo(line)
    if not all(r.accepted for _, r in reports):
        raise typer.Exit(1)


@asynccontextmanager
async def hint_reader_for(cfg: SpadeConfig, wanted: bool) -> AsyncIterator[tuple[Any, str]]:
    """(the hint reader on the config's agent endpoints, or None, and why not)."""
    from spade_async.envs.hint_reader import HintReader
    from spade_async.inference.errors import EndpointError
    from spade_async.inference.pool import EndpointPool
    from spade_async.inference.roles import role_route

    if not wanted:
        yield None, "--no-model-check"
        return
    route = role_route(cfg, "agent")
    try:
        pool = EndpointPool(cfg.endpoints, cfg.pool)
    except EndpointError as exc:
        yield None, f"no endpoint to ask ({exc})"
        return
    async with pool:
        health = [h for h in await pool.check(capabilities=False) if h.group == route.group]
        if not any(h.up for h in health):
            tried = ", ".join(f"{h.name} at {h.base_url}: {h.error or 'down'}" for h in health)
            yield None, f"no endpoint of group {route.group} answered ({tried or 'none'})"
            return
        yield HintReader(pool, cfg.model.served_name, route.group,
                         deadline_s=cfg.rollout.request_deadline_s), ""


@env_app.command("play")
def env_play(
    file: str = typer.Argument(..., help="environment module (.py), or the id (or id prefix) "
                               "of an environment in the memory"),
    seed: int = typer.Option(0, "--seed", help="episode seed"),
    hint: bool = typer.Option(False, "--hint", help="show the privileged hint first"),
    config: Path = ConfigOpt,
    params_json: str | None = ParamsOpt,
) -> None:
    """Play an environment turn by turn, as a person: read an action, show the reward.
    A tool call is typed as `name {"arg": ...}` or as the canonical JSON."""
    from spade_async.envs.contract import ContractError, episode_score, tool_call_action
    from spade_async.envs.knobs import resolve_params
    from spade_async.sandbox.errors import SandboxError
    from spade_async.sandbox.isolation import SandboxUnavailable
    from spade_async.sandbox.runtime import open_env

    cfg = config_or_exit(config)
    given = _parse_params(params_json)
    code = _read_env_file(Path(file)) if Path(file).exists() or file.endswith(".py") else \
        _stored_env_code(cfg, file)

    def to_action(line: str, tool_names: set[str]) -> str:
        head, _, rest = line.strip().partition(" ")
        if head in tool_names:
            try:
                return tool_call_action(head, json.loads(rest) if rest.strip() else {})
            except json.JSONDecodeError:
                typer.echo("  (arguments are not JSON; sent as plain text)")
        return line

    async def play():
        async with open_env(cfg.sandbox, code) as env:
            m = env.meta
            params = resolve_params(m.params, given)  # ContractError: names the knob
            typer.echo(f"== {m.name} (max {m.max_turns} turns, seed {seed}"
                       + (f", params {json.dumps(params)}" if params else "")
                       + f")\n{m.description}")
            tools = {t["function"]["name"] for t in m.tools}
            for t in m.tools:
                fn = t["function"]
                typer.echo(f"  tool {fn['name']}: {fn.get('description', '')}")
            first = await env.reset(seed, params)
            if hint:
                typer.echo(f"[hint] {await env.hint()}")
            typer.echo(f"\n{first.observation}")
            rewards: list[float] = []
            for turn in range(1, m.max_turns + 1):
                try:
                    line = await anyio.to_thread.run_sync(input, f"[{turn}/{m.max_turns}] > ")
                except EOFError:
                    typer.echo("\n(quit)")
                    break
                res = await env.step(to_action(line, tools))
                rewards.append(res.reward)
                typer.echo(f"{res.observation}\n  reward {res.reward:g}"
                           + ("  [terminated]" if res.terminated else "")
                           + ("  [truncated]" if res.truncated else ""))
                if res.done:
                    break
            typer.echo(f"score {episode_score(rewards):g}")

    try:
        anyio.run(play)
    except SandboxUnavailable as exc:
        raise fail(str(exc), 2) from None
    except SandboxError as exc:
        raise fail(f"environment failed: {exc}") from None
    except ContractError as exc:
        raise fail(f"--params: {exc}", 2) from None
