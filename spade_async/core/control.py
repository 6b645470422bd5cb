"""Requests to a running daemon from outside its process, as a file in its run dir: a stop with
a reason (what `spade experiment run` sends when an arm's budget is spent), optionally after a
held-out evaluation of the version it stopped on. Signals stop it too, without the evaluation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spade_async.core.io import atomic_write_json

STOP_REQUEST = "stop-request.json"


def request_stop(run_dir: Path, reason: str, *, final_eval: bool = False) -> None:
    """Ask the daemon whose run dir this is to stop (it drains, then exits 0)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / STOP_REQUEST, {"reason": reason, "final_eval": final_eval})


def clear_stop_request(run_dir: Path) -> None:
    (run_dir / STOP_REQUEST).unlink(missing_ok=True)


def read_stop_request(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir / STOP_REQUEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
