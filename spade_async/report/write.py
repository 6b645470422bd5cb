"""`spade report`'s one call: read the run, draw every figure, and write the page and the
summary (index.html, summary.json) next to the PNG files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spade_async.core.config import SpadeConfig
from spade_async.report.data import load_run
from spade_async.report.figures import draw_figures
from spade_async.report.html import page_html
from spade_async.report.summary import summary


def write_report(cfg: SpadeConfig, out: Path,
                 progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Render every plot into `out` and the page `out/index.html`; returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    progress("reading the run's logs, the memory and the trainer's metrics")
    d = load_run(cfg)
    files = draw_figures(cfg, d, out, progress)
    s = summary(cfg, d)
    s["files"] = files + [str(out / "index.html")]
    (out / "index.html").write_text(page_html(s), encoding="utf-8")
    (out / "summary.json").write_text(json.dumps(s, indent=2))
    return s
