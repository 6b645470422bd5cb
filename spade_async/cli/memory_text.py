"""How `spade memory ...` prints what it reads: the records table, one environment in full, the
summary with its histograms. Plain formatting over memory_db's records; no queries."""

from __future__ import annotations

import json
from typing import Any

from memory_db.records import EnvRecord, Hit, Summary, VariantStats


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def print_records(records: list[EnvRecord], title: str, hits: list[Hit] | None = None) -> None:
    """The records as one table; search hits add their rank and similarity."""
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


def show_lines(rec: EnvRecord, variants: list[VariantStats]) -> list[str]:
    """`spade memory show`: one environment, its stats over all its variants, each variant."""
    s = rec.stats
    return [
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


def stats_lines(s: Summary) -> list[str]:
    """`spade memory stats`: counts, distributions, diversity, replay and storage."""
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
    return out
