"""The report's HTML page from its summary: a table of the run's counts, then each figure with
its title, caption and, for the curriculum and the probe, a table of their numbers."""

from __future__ import annotations

import html
from typing import Any

from spade_async.report.curriculum import (
    CURRICULUM_HEAD,
    curriculum_cells,
    moves_text,
    probe_paired_text,
    probe_text,
    rate_text,
)
from spade_async.report.figures import PLOTS
from spade_async.report.frontier import frontier_text
from spade_async.report.training import ledger_text, training_text


def _html_table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "\n".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                     for r in rows)
    return f"<table><tr>{cells}</tr>\n{body}</table>"


def page_html(s: dict[str, Any]) -> str:
    rows = [("run data", s["data_dir"]), ("minutes covered", s["minutes"]),
            ("designs", f"{s['designs']} ({s['accepted']} accepted)"),
            ("rejections", ", ".join(f"{k} {v}" for k, v in s["rejected_by_reason"].items())
             or "none"),
            ("memory", f"{s['memory']['stored']} stored, {s['memory']['accepted']} accepted"
             + (f" (unreadable: {s['memory']['error']})" if s["memory"]["error"] else "")),
            ("episodes", f"{s['episodes']} on policy versions {s['episode_versions']}"),
            ("environments played", f"{s['envs_played']}, mean regret {s['regret_mean']}"),
            ("trainer", f"{s['trainer_steps']} steps, versions published "
             f"{s['versions_published']}"),
            ("training", training_text(s["training"])),
            ("samples", ledger_text(s["training"]["ledger"])),
            ("evaluations", s["evaluations"]),
            ("designer moves", moves_text(s["moves"])),
            ("frontier", frontier_text(s["frontier"])),
            ("probe", "; ".join(probe_text(r) for r in s["probe"]) or "not run yet"),
            ("probe greedy", "; ".join(probe_text(r) for r in s["probe_greedy"])
             or "not run yet"),
            ("probe, last vs first version (paired)",
             "; ".join(probe_paired_text(k, p) for k, p in s["probe_paired"].items())
             or "needs two evaluated versions")]
    table = "\n".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                      for k, v in rows)
    extra = {
        "curriculum.png": _html_table(CURRICULUM_HEAD,
                                      [curriculum_cells(r) for r in s["curriculum"]])
        if s["curriculum"] else "<p>No family with knobs played yet.</p>",
        "probe.png": _html_table(
            ("suite", "version", "solved", "n", "solve rate", "95% interval"), [
                (suite, str(r["version"]), str(r["solved"]), str(r["n"]),
                 rate_text(r["solved"] / r["n"] if r["n"] else None, r["n"]),
                 f"[{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]")
                for suite, key in (("probe", "probe"), ("probe-greedy", "probe_greedy"))
                for r in s[key]])
        + "".join(f"<p>{html.escape(probe_paired_text(k, p))}</p>"
                  for k, p in s["probe_paired"].items())
        if s["probe"] or s["probe_greedy"] else "",
    }
    sections = "\n".join(
        f'<section><h2>{html.escape(title)}</h2><p>{html.escape(caption)}</p>'
        f'<a href="{name}"><img src="{name}" alt="{html.escape(title)}"></a>'
        f'{extra.get(name, "")}</section>'
        for name, title, caption in PLOTS)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>SPADE-async run report</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;color:#222}}
table{{border-collapse:collapse}}th,td{{text-align:left;padding:2px 12px 2px 0}}
img{{max-width:100%;border:1px solid #ddd}}section{{margin-top:2em}}</style></head>
<body><h1>SPADE-async run report</h1>
<table>
{table}
</table>
{sections}
</body></html>
"""
