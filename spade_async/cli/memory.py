"""`spade memory ...` and `spade bench memory`: the environment memory from the terminal.

Read commands open the memory read-only (no writer), so they work while the daemon writes;
`add` validates files in the sandbox and inserts them through a writer of its own (LanceDB
serialises its commits with the daemon's). Every command takes `--json`; errors go to stderr
as `error: ...` with exit 2 (usage, config, sandbox) or 1 (everything else).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import typer

from memory_db.config import MemoryConfig
from memory_db.records import EnvRecord, Hit, NewEnv, VariantStats
from memory_db.schema import SchemaError
from spade_async.core.config import ConfigError, SpadeConfig, load_config, memory_config
from spade_async.core.io import atomic_open

if TYPE_CHECKING:  # LanceDB loads when a command opens the memory, not for `spade --help`
    from memory_db.store import EnvMemory

memory_app = typer.Typer(help="Environment memory: search, list, show, stats, add, export.",
                         no_args_is_help=True)

DEFAULT_CONFIG = Path("configs/embedded.toml")
ConfigOpt = typer.Option(DEFAULT_CONFIG, "--config", "-c", help="TOML config file")
JsonOpt = typer.Option(False, "--json", help="machine-readable output")
T = TypeVar("T")


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _progress(message: str) -> None:
    typer.echo(f"[memory] {message}", err=True)


def _load(config: Path) -> tuple[SpadeConfig, MemoryConfig, str]:
    try:
        cfg = load_config(config)
    except ConfigError as exc:
        raise _fail(str(exc), 2) from None
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
        raise _fail(str(exc)) from None
    except (OSError, ValueError, RuntimeError) as exc:  # LanceDB raises these for bad URIs
        raise _fail(f"{uri}: {exc}") from None


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _print_records(records: list[EnvRecord], title: str, hits: list[Hit] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    if hits is not None:
        table.add_column("#", justify="right")
        table.add_column("sim", justify="right")
    for col in ("id", "name", "status", "regret", "solve", "eps u/h", "created", "description"):
        table.add_column(col)
    for i, r in enumerate(records):
        s = r.stats
        row = [r.id, r.name, r.status if r.status == "accepted" else f"[red]{r.status}[/]",
               _num(s.regret_ema), _num(s.mean_unhinted, ".2f"),
               f"{s.episodes_unhinted}/{s.episodes_hinted}", r.created_at.strftime("%Y-%m-%d %H:%M"),
               _short(r.description if r.status == "accepted" else r.reason, 60)]
        if hits is not None:
            row = [str(hits[i].rank), f"{hits[i].similarity:.3f}", *row]
        table.add_row(*row)
    Console(width=200).print(table)


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
        raise _fail(f"--status must be accepted, rejected or all, not {status!r}", 2)
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
    _print_records([h.record for h in hits], f"{query!r} ({mode})", hits)


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
        raise _fail(f"--sort must be regret, created or played, not {sort!r}", 2)
    if status not in ("accepted", "rejected", "all"):
        raise _fail(f"--status must be accepted, rejected or all, not {status!r}", 2)
    records = _read(config, lambda mem: mem.list(
        sort=sort, status=None if status == "all" else status, tags=tag, limit=limit))
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in records], indent=2))
    elif not records:
        typer.echo("no environments")
    else:
        _print_records(records, f"environments by {sort} ({status})")


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
        raise _fail(got)
    rec, variants = got
    if as_json:
        typer.echo(json.dumps({**rec.as_dict(), "variants": [v.as_dict() for v in variants]},
                              indent=2))
        return
    s = rec.stats
    lines = [
        f"{rec.id}  {rec.name}  [{rec.status}]" + (f"  {rec.reason}" if rec.reason else ""),
        f"description:    {rec.description}",
        f"created:        {rec.created_at.isoformat()}   policy version: "
        f"{'-' if rec.policy_version is None else rec.policy_version}",
        f"source:         {rec.source_doc_id or '-'}"
        + (f"  \"{_short(rec.source_excerpt, 80)}\"" if rec.source_excerpt else ""),
        f"tags:           {', '.join(rec.tags) or '-'}",
        f"episodes:       {s.episodes_unhinted} unhinted (mean {_num(s.mean_unhinted)}), "
        f"{s.episodes_hinted} hinted (mean {_num(s.mean_hinted)})",
        f"regret:         EMA {_num(s.regret_ema)}, last {_num(s.regret_last)};  "
        f"learnability {_num(s.learnability)}",
        f"hint leak:      {_leak(s.hint_leak)}",
        f"failed:         {s.sandbox_failures or 0} episodes failed on the environment's code "
        "(counted, never scored)"
        + ("  BROKEN: it has failed and never been scored"
           if s.sandbox_failures and not (s.episodes_unhinted or s.episodes_hinted) else ""),
        f"replay:         {s.times_replayed} times, last played "
        f"{s.last_played.isoformat() if s.last_played else 'never'}",
        *_variant_lines(variants),
    ]
    typer.echo("\n".join(lines))
    if code:
        typer.echo("\n" + (rec.code or ""))


def _leak(value: float | None) -> str:
    """The share of hinted wins copied from the hint, flagged from 0.5 (regret.leak_threshold's
    default)."""
    if value is None:
        return "not measured"
    return f"{value:.3f}" + ("  FLAGGED: hinted play wins by copying the hint" if value >= 0.5
                             else "")


def _variant_lines(variants: list[VariantStats]) -> list[str]:
    """The variants as a small table, most played first (the order `variants()` gives)."""
    if not variants:
        return ["variants:       none played"]
    out = [f"variants:       {len(variants)} (the stats above are over all of them)",
           f"  {'variant':27s} {'eps u/h':>9s} {'mean u':>7s} {'learn':>6s} {'regret':>7s}  params"]
    for v in variants:
        st = v.stats
        params = json.dumps(v.params, sort_keys=True) if v.params else "{} (defaults)"
        out.append(f"  {v.id:27s} {f'{st.episodes_unhinted}/{st.episodes_hinted}':>9s} "
                   f"{_num(st.mean_unhinted):>7s} {_num(st.learnability):>6s} "
                   f"{_num(st.regret_ema):>7s}  {_short(params, 80)}")
    return out


def _histogram_line(dist: dict[str, Any]) -> str:
    if not dist.get("n"):
        return "none yet"
    bars = " ▁▂▃▄▅▆▇█"
    counts = dist["histogram"]["counts"]
    top = max(counts) or 1
    spark = "".join(bars[round(c / top * 8)] for c in counts)
    return (f"n={dist['n']} mean {dist['mean']:.3f}  p10 {dist['p10']:.3f}  p50 "
            f"{dist['p50']:.3f}  p90 {dist['p90']:.3f}  [0 {spark} 1]")


@memory_app.command("stats")
def memory_stats(config: Path = ConfigOpt, as_json: bool = JsonOpt) -> None:
    """Counts by status and reason, regret and solve-rate distributions, diversity, replay."""
    s = _read(config, lambda mem: mem.summary())
    if as_json:
        typer.echo(json.dumps(s.as_dict(), indent=2))
        return
    c = s.counts
    out = [f"environments:   {c.get('total', 0)} ({c.get('accepted', 0)} accepted, "
           f"{c.get('rejected', 0)} rejected); {s.played} played; {s.variants} variants"]
    if s.reasons:
        out.append("rejected for:   " + ", ".join(f"{k} {v}" for k, v in s.reasons.items()))
    out.append(f"regret EMA:     {_histogram_line(s.regret)}")
    out.append(f"solve unhinted: {_histogram_line(s.solve_rate.get('unhinted', {}))}")
    out.append(f"solve hinted:   {_histogram_line(s.solve_rate.get('hinted', {}))}")
    broken = s.sandbox_failing
    if broken.get("envs"):
        out.append(f"failing:        {broken['envs']} environments with episodes failed on their "
                   f"own code, {broken['never_scored']} of them never scored")
    leak = s.hint_leak
    out.append(f"hint leak:      {_histogram_line(leak.get('distribution', {}))}"
               + (f"  ({leak['flagged']} flagged >= {leak['threshold']})" if leak.get("n")
                  else ""))
    d = s.diversity.get("mean_pairwise_cosine_distance")
    out.append(f"diversity:      mean pairwise cosine distance of accepted envs "
               f"{'-' if d is None else f'{d:.3f}'} (n={s.diversity.get('n', 0)})")
    if s.replay:
        top = ", ".join(f"{t['id']} {t['p']:.3f}" for t in s.replay["top"])
        out.append(f"replay:         pool {s.replay['pool']} variants (effective "
                   f"{s.replay['effective_pool']}), by {s.replay['score']}; top: {top}")
    st = s.storage
    ix = st.get("index")
    out.append(f"storage:        {st['uri']} v{st['version']}, {st['fragments']} fragments "
               f"({st['small_fragments']} small), {st['bytes'] / 2**20:.1f} MiB; index: "
               + ("none (flat search)" if not ix else
                  f"{ix['type']} {ix['distance']}, {ix['indexed_rows']} indexed, "
                  f"{ix['unindexed_rows']} not yet"))
    typer.echo("\n".join(out))


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
            raise _fail(f"cannot read environment file {f}: {exc}", 2) from None
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
        raise _fail(str(exc), 2) from None
    except SchemaError as exc:
        raise _fail(str(exc)) from None
    except (OSError, ValueError, RuntimeError) as exc:  # LanceDB / object-store failures
        raise _fail(f"{uri}: {exc}") from None
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
        raise _fail(f"cannot write {path}: {exc}") from None
    if str(path) == "-":
        return
    if as_json:
        typer.echo(json.dumps({"path": str(path), "rows": n}))
    else:
        typer.echo(f"wrote {n} environments to {path}")


def bench_memory(
    rows: int = typer.Option(100_000, "--rows", min=1000, help="synthetic environments"),
    queries: int = typer.Option(200, "--queries", min=10, help="queries timed"),
    k: int = typer.Option(10, "-k", min=1, help="results per query"),
    fetch_k: int = typer.Option(50, "--fetch-k", min=2, help="vector hits MMR re-ranks"),
    novelty_rows: int = typer.Option(1000, "--novelty-rows", min=10,
                                     help="inserts timed with the novelty filter on"),
    keep: Path = typer.Option(None, "--keep", help="build the memory here and keep it "
                              "(default: a temporary directory, removed)"),
    as_json: bool = JsonOpt,
) -> None:
    """MMR top-k over N synthetic envs: LanceDB (IVF-PQ) vs numpy brute force; recall@k of the
    ANN search; insert rates."""
    from spade_async.bench.memory import run_memory_bench

    if fetch_k < k:
        raise _fail("--fetch-k must be at least -k", 2)
    typer.echo(f"[bench] {rows} synthetic environments, {queries} queries ...", err=True)
    r = run_memory_bench(rows=rows, queries=queries, k=k, fetch_k=fetch_k,
                         novelty_rows=novelty_rows, workdir=keep,
                         progress=lambda m: typer.echo(f"[bench] {m}", err=True))
    if as_json:
        typer.echo(json.dumps(r, indent=2))
        return
    a, b, f = r["lancedb_ann_mmr"], r["numpy_bruteforce_mmr"], r["lancedb_flat_mmr"]
    ix, ins, nov = r["index"], r["insert"], r["insert_with_novelty"]
    typer.echo("\n".join([
        f"MMR top-{k} of fetch_k={fetch_k} over {rows} envs (dim {r['dim']}, lambda "
        f"{r['mmr_lambda']}):",
        f"  {'LanceDB, ' + ix['type'] + ' index:':34s}median {a['median_ms']:8.2f} ms   "
        f"p90 {a['p90_ms']:8.2f} ms",
        f"  numpy brute force (in RAM):       median {b['median_ms']:8.2f} ms   "
        f"p90 {b['p90_ms']:8.2f} ms",
        f"  LanceDB / numpy:                  {r['ratio_lancedb_over_numpy']:.2f}x",
        f"  LanceDB, index + status filter:   median "
        f"{r['lancedb_ann_mmr_status_filter']['median_ms']:8.2f} ms",
        f"  LanceDB, no index (flat scan):    median {f['median_ms']:8.2f} ms",
        f"recall@{k} of the ANN search vs exact: {r['recall_at_k']:.3f}   (MMR lists agree "
        f"{r['mmr_agreement']:.3f})",
        f"insert rate (bulk, novelty off): {ins['rows_per_s']:.0f} envs/s",
        f"insert rate (novelty filter on): {nov['rows_per_s']:.0f} envs/s "
        f"({nov['rejected_as_duplicates']} duplicates)",
        f"index: trained in {ix['seconds']:.1f} s ({ix['partitions']} IVF partitions, "
        f"{ix['sub_vectors']} PQ sub-vectors, "
        f"nprobes {ix['nprobes']}, exact re-rank of {ix['refine_candidates']} candidates); "
        f"{r['storage']['fragments']} fragments after optimize",
    ]))
