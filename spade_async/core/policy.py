"""The policy-version record: `<data_dir>/weights/current.json`, `{"version": N, "model":
"<the name requests use>"}`, written by the trainer once every endpoint serves version N and
read by the daemon, the CLI and the evaluation. Absent: version 0, the base model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spade_async.core.io import atomic_write_json
from spade_async.core.logs import get_logger

log = get_logger("policy")

CURRENT = "current.json"


def weights_dir(data_dir: Path) -> Path:
    return data_dir / "weights"


def current_path(data_dir: Path) -> Path:
    return weights_dir(data_dir) / CURRENT


def version_dir(data_dir: Path, version: int) -> Path:
    """Where the trainer exports version N (`weights/vN`: an adapter or a full checkpoint)."""
    return weights_dir(data_dir) / f"v{version}"


def current_version(data_dir: Path) -> int:
    """The published version (0: none yet, the base model). A record that is there but cannot
    be read raises: the trainer must not guess which version it published."""
    try:
        return int(json.loads(current_path(data_dir).read_text())["version"])
    except FileNotFoundError:
        return 0


def read_current(data_dir: Path) -> dict[str, Any] | None:
    """The record as written, or None when there is none (or it cannot be read)."""
    try:
        data = json.loads(current_path(data_dir).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_current(data_dir: Path, record: dict[str, Any]) -> None:
    atomic_write_json(current_path(data_dir), record)


class PolicyVersion:
    """The newest published policy, as `refresh()` last read it: `version` and the `model` name
    requests use (absent record: version 0, `base_model`). Versions only go forward."""

    def __init__(self, path: Path, base_model: str) -> None:
        self.path, self.base_model = path, base_model
        self.version, self.model = 0, base_model

    def refresh(self) -> bool:
        """Read the record again; True when it names a newer version."""
        try:
            data = json.loads(self.path.read_text())
            version, model = int(data["version"]), str(data.get("model") or self.base_model)
        except (OSError, ValueError, KeyError, TypeError):
            return False
        if version > self.version:
            self.version, self.model = version, model
            log.info("policy_version", version=version, model=model)
            return True
        return False
