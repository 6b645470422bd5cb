"""`spade memory ...`: the environment memory from the terminal.

Read commands open the memory read-only (no writer), so they work while the daemon writes;
`add` validates files in the sandbox and inserts them through a writer of its own (LanceDB
serialises its commits with the daemon's). Every command takes `--json`; errors go to stderr
as `error: ...` with exit 2 (usage, config, sandbox) or 1 (everything else). The text output
is memory_text's.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import anyio
import typer

from memory_db.config import MemoryConfig
from memory_db.records import EnvRecord, NewEnv, VariantStats
from memory_db.schema import SchemaError
from spade_async.cli.common import ConfigOpt, JsonOpt, config_or_exit, fail
from spade_async.cli.memory_text import print_records, show_lines, stats_lines
from spade_async.core.config import SpadeConfig, memory_config
from spade_async.core.io import atomic_open

if TYPE_CHECKING:  # LanceDB loads when a command opens the memory, not for `spade --help`
    from memory_db.store import EnvMemory

memory_app = typer.Typer(help="Environment memory: search, list, show, stats, add, export.",
                         no_args_is_help=True)

T = TypeVar("T")


def _progress(message: str) -> None:
    typer.echo(f"[memory] {message}", err=True)


def _load(config: Path) -> tuple[SpadeConfig, MemoryConfig, str]:
    cfg = config_or_exit(config)
    return (cfg, *memory_config(cfg))


def _read(config: Path, query: Callable[[EnvMemory], Awaitable[T]]) -> T:
    """Run `query` against the memory opened read-only."""
    _, mcfg, uri = _load(config)

    async def main() -> T:
        from memory_db.store import open_memory

        async with open_memory(mcfg, uri, writable=False) as mem:
            return await query(mem)

    try:
        return anyio.run(main)
    except SchemaError as exc:
        raise fail(str(exc)) from None
    except (OSError, ValueError, RuntimeError) as exc:  # LanceDB raises these for bad URIs
        raise fail(f"{uri}: {exc}") from None


@memory_app.command("search")
def memory_search(
    query: str = typer.Argument(..., help="what the environments should be about"),
    k: int = typer.Option(10, "-k", min=1, help="results"),
    no_diverse: bool = typer.Option(False, "--no-diverse", help="plain top-k, no MMR"),
    lam: float = typer.Option(None, "--lambda", min=0.0, max=1.0,
                              help="MMR trade-off (default: memory.mmr_lambda)"),
    fetch_k: int = typer.Option(None, "--fetch-k", min=1, help="vector hits MMR re-ranks"),
    status: str = typer.Option("accepted", "--status", help="accepted, rejected or all"),
    tag: list[str] = typer.Option([], "--tag", help="only environments with any of these tags"),
    source: str = typer.Option(None, "--source", help="only this source document id"),
    config: Path = ConfigOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Environments closest to QUERY, diversified by maximal marginal relevance."""
    if status not in ("accepted", "rejected", "all"):
        raise fail(f"--status must be accepted, rejected or all, not {status!r}", 2)
    hits = _read(config, lambda mem: mem.search(
        query, k=k, diverse=not no_diverse, lam=lam, fetch_k=fetch_k,
        status=None if status == "all" else status, tags=tag, source_doc_id=source))
    if as_json:
        typer.echo(json.dumps([h.as_dict() for h in hits], indent=2))
        return
    if not hits:
        typer.echo("no matching environments")
        return
    mode = "plain top-k" if no_diverse else "MMR"
    print_records([h.record for h in hits], f"{query!r} ({mode})", hits)


@memory_app.command("list")
def memory_list(
    sort: str = typer.Option("created", "--sort", help="regret, created or played"),
    status: str = typer.Option("all", "--status", help="accepted, rejected or all"),
    tag: list[str] = typer.Option([], "--tag", help="only environments with any of these tags"),
    limit: int = typer.Option(20, "--limit", min=1),
    config: Path = ConfigOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Stored environments, newest / highest-regret / most recently played first."""
    if sort not in ("regret", "created", "played"):
        raise fail(f"--sort must be regret, created or played, not {sort!r}", 2)
    if status not in ("accepted", "rejected", "all"):
        raise fail(f"--status must be accepted, rejected or all, not {status!r}", 2)
    records = _read(config, lambda mem: mem.list(
        sort=sort, status=None if status == "all" else status, tags=tag, limit=limit))
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in records], indent=2))
    elif not records:
        typer.echo("no environments")
    else:
        print_records(records, f"environments by {sort} ({status})")


@memory_app.command("show")
def memory_show(
    env_id: str = typer.Argument(..., metavar="ID",
                                 help="environment id, a unique prefix, or a variant id"),
    code: bool = typer.Option(False, "--code", help="print the code too"),
    config: Path = ConfigOpt,
    as_json: bool = JsonOpt,
) -> None:
    """One environment: metadata, source, status and reason, running stats over all its
    variants, each variant's params and stats (and its code)."""

    async def get(mem: EnvMemory) -> tuple[EnvRecord, list[VariantStats]] | str:
        try:
            rec = await mem.get(env_id, code=code)
        except KeyError as exc:
            return str(exc.args[0])
        return rec, await mem.variants(rec.id)

    got = _read(config, get)
    if isinstance(got, str):
        raise fail(got)
    rec, variants = got
    if as_json:
        typer.echo(json.dumps({**rec.as_dict(), "variants": [v.as_dict() for v in variants]},
                              indent=2))
        return
    typer.echo("\n".join(show_lines(rec, variants)))
    if code:
        typer.echo("\n" + (rec.code or ""))


@memory_app.command("stats")
def memory_stats(config: Path = ConfigOpt, as_json: bool = JsonOpt) -> None:
    """Counts by status and reason, regret and solve-rate distributions, diversity, replay."""
    s = _read(config, lambda mem: mem.summary())
    if as_json:
        typer.echo(json.dumps(s.as_dict(), indent=2))
        return
    typer.echo("\n".join(stats_lines(s)))


@memory_app.command("add")
def memory_add(
    files: list[Path] = typer.Argument(..., help="environment module(s) (.py)"),
    tag: list[str] = typer.Option(["hand-written"], "--tag", help="tags to store with them"),
    source: str = typer.Option(None, "--source", help="source document id (default file:NAME)"),
    config: Path = ConfigOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Validate environment files in the sandbox, then insert them (a file that fails
    validation is stored as rejected with its reason). Exit 1 if any ends up rejected."""
    from spade_async.envs.validate import validate
    from spade_async.sandbox.isolation import SandboxUnavailable
    from spade_async.sandbox.runtime import Sandbox

    cfg, mcfg, uri = _load(config)
    codes = []
    for f in files:
        try:
            codes.append((f, f.read_text()))
        except (OSError, UnicodeDecodeError) as exc:
            raise fail(f"cannot read environment file {f}: {exc}", 2) from None
    sb_cfg = cfg.sandbox.model_copy(update={"warm_workers": min(cfg.sandbox.warm_workers, 2)})

    async def main():
        _progress(f"validating {len(codes)} file(s) in the sandbox ...")
        async with Sandbox(sb_cfg) as sb:
            reports = [await validate(code, sb, cfg.validation) for _, code in codes]
        envs = [NewEnv(code=code, name=r.meta.name if r.meta else f.stem,
                       description=r.meta.description if r.meta else "",
                       source_doc_id=source or f"file:{f.name}", tags=tuple(tag),
                       rejected_reason=None if r.accepted else r.reason)
                for (f, code), r in zip(codes, reports, strict=True)]
        _progress(f"embedding ({mcfg.embedding_model}) and inserting into {uri} ...")
        from memory_db.store import open_memory

        async with open_memory(mcfg, uri) as mem:
            return reports, await mem.insert_many(envs)

    try:
        reports, results = anyio.run(main)
    except SandboxUnavailable as exc:
        raise fail(str(exc), 2) from None
    except SchemaError as exc:
        raise fail(str(exc)) from None
    except (OSError, ValueError, RuntimeError) as exc:  # LanceDB / object-store failures
        raise fail(f"{uri}: {exc}") from None
    out = [{"file": str(f), "validation": r.accepted, **res.as_dict()}
           for (f, _), r, res in zip(codes, reports, results, strict=True)]
    if as_json:
        typer.echo(json.dumps(out, indent=2))
    else:
        for o in out:
            state = "already stored as " + o["status"] if o["existed"] else o["status"]
            line = f"{o['file']}: {o['id']} {state.upper() if not o['existed'] else state}"
            if o["reason"]:
                line += f" ({o['reason']})"
            typer.echo(line)
    if any(o["status"] == "rejected" for o in out):
        raise typer.Exit(1)


@memory_app.command("export")
def memory_export(
    path: Path = typer.Argument(..., help="JSONL file to write ('-' for stdout)"),
    no_code: bool = typer.Option(False, "--no-code", help="leave the code out"),
    embeddings: bool = typer.Option(False, "--embeddings", help="include the embedding vectors"),
    config: Path = ConfigOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Every environment (accepted and rejected) with its stats, one JSON object a line."""

    async def dump(mem: EnvMemory) -> int:
        n = 0
        if str(path) == "-":
            async for row in mem.export(code=not no_code, embeddings=embeddings):
                typer.echo(json.dumps(row))
                n += 1
            return n
        with atomic_open(path) as fh:  # a reader never sees half a file
            async for row in mem.export(code=not no_code, embeddings=embeddings):
                fh.write(json.dumps(row) + "\n")
                n += 1
        return n

    try:
        n = _read(config, dump)
    except OSError as exc:
        raise fail(f"cannot write {path}: {exc}") from None
    if str(path) == "-":
        return
    if as_json:
        typer.echo(json.dumps({"path": str(path), "rows": n}))
    else:
        typer.echo(f"wrote {n} environments to {path}")
