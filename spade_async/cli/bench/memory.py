"""`spade bench memory`: MMR search over synthetic environments, LanceDB against numpy."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from spade_async.cli.common import JsonOpt, fail


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
        raise fail("--fetch-k must be at least -k", 2)
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


def bench_report(
    gb: float = typer.Option(5.0, "--gb", min=0.01, help="transcripts to generate, GB"),
    workdir: Path = typer.Option(Path(".data/bench/report"), "--workdir",
                                 help="where the synthetic run is written"),
    keep: bool = typer.Option(False, "--keep/--no-keep", help="keep the synthetic run (and "
                              "reuse it next time) instead of deleting it"),
    as_json: bool = JsonOpt,
) -> None:
    """`spade report` on a synthetic run whose transcripts total N GB: its peak RSS and time."""
    from spade_async.bench.report_rss import run_report_bench

    workdir.mkdir(parents=True, exist_ok=True)
    r = run_report_bench(workdir.resolve(), gb=gb, keep=keep,
                         progress=lambda m: typer.echo(f"[bench] {m}", err=True))
    if as_json:
        typer.echo(json.dumps(r, indent=2))
        return
    typer.echo(f"spade report on {r['transcripts_gb']} GB of transcripts "
               f"({r.get('episodes', '?')} episodes): peak RSS {r['report_peak_rss_mb']} MB, "
               f"{r['report_seconds']} s")
