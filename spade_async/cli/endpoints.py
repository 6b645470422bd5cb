"""`spade endpoints check`: probe every endpoint of the config and say whether each role can
run where the config puts it."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import typer

from spade_async.cli.common import ConfigOpt, JsonOpt, check_endpoint_secrets, config_or_exit, fail

endpoints_app = typer.Typer(help="Inference endpoints: health, latency, served versions.",
                            no_args_is_help=True)


@endpoints_app.command("check")
def endpoints_check(config: Path = ConfigOpt, as_json: bool = JsonOpt) -> None:
    """Probe every endpoint: up/down, latency, models and adapters served, weight version,
    capabilities, and whether each role can run where the config puts it. Exit 0: all up and
    servable; 1: an endpoint is down; 3: all up, but a role lacks a capability (listed)."""
    from spade_async.inference.errors import EndpointError
    from spade_async.inference.pool import EndpointPool

    cfg = config_or_exit(config)

    from spade_async.inference.roles import role_problems, role_route

    async def probe():
        async with EndpointPool(cfg.endpoints, cfg.pool) as pool:
            health = await pool.check()
            return health, role_problems(cfg, pool)

    try:
        check_endpoint_secrets(cfg)
        health, problems = anyio.run(probe)
    except EndpointError as exc:
        raise fail(str(exc), 2) from None
    routes = {r: role_route(cfg, r).as_dict() for r in ("agent", "designer", "eval")}
    if as_json:
        typer.echo(json.dumps({"endpoints": [h.as_dict() for h in health], "roles": routes,
                               "problems": problems}, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table("endpoint", "group", "url", "state", "latency ms", "models", "adapters",
                      "weight version")
        for h in health:
            table.add_row(
                h.name, h.group, h.base_url,
                "[green]up[/]" if h.up else f"[red]down[/] {h.error}",
                "-" if h.latency_ms is None else f"{h.latency_ms:.1f}",
                ", ".join(h.models) or "-", ", ".join(h.adapters) or "-", h.weight_version or "-",
            )
        Console().print(table)
        caps = Table("endpoint", "server", "tokens path", "chat", "tools", "structured",
                     "weight swap", title="capabilities (probed)")
        yes = {True: "[green]yes[/]", False: "[red]no[/]"}
        for h in health:
            c = h.capabilities
            if c is None:
                caps.add_row(h.name, "not probed (down)", "-", "-", "-", "-", "-")
                continue
            short = {"completions": "/v1/completions", "token_prompts": "id prompts",
                     "token_ids": "ids back", "logprobs": "log-probs"}
            tokens = yes[c.tokens_path] + ("" if c.tokens_path else " (no " + ", ".join(
                w for k, w in short.items() if not getattr(c, k)) + ")")
            caps.add_row(h.name, c.server, tokens, yes[c.chat], yes[c.tools], yes[c.structured],
                         "unknown" if c.swap is None else ", ".join(c.swap) or "none")
        Console().print(caps)
        for role, r in routes.items():
            typer.echo(f"roles.{role}: group {r['group']}, model "
                       f"{r['model'] or '(the policy)'}, {r['path']} path"
                       + (", trained on" if r["trained"] else ""))
        for p in problems:
            typer.echo(f"problem: {p}")
    if not all(h.up for h in health):
        raise typer.Exit(1)
    if problems:  # every endpoint answers, but a role cannot run where the config puts it
        raise typer.Exit(3)
