"""Where published versions live: `<data_dir>/weights/vN` (one directory per version) and
`current.json` (the version the daemon samples with), and which old directories to remove.
Plain paths and files: no torch, no HTTP.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from spade_async.core.config import SpadeConfig
from spade_async.core.policy import CURRENT

_VERSION_DIR = re.compile(r"^v(\d+)$")


def weights_root(cfg: SpadeConfig) -> Path:
    return cfg.paths.data_dir / "weights"


def version_dir(root: Path, version: int) -> Path:
    return root / f"v{version}"


def read_current(root: Path) -> int:
    """The version the daemon samples with (0: the base model, nothing published)."""
    try:
        return int(json.loads((root / CURRENT).read_text())["version"])
    except FileNotFoundError:
        return 0


def prune_versions(root: Path, keep_versions: int, *, keep: int) -> None:
    """Keep the newest `keep_versions` weight directories (vLLM may re-read an unloaded
    adapter's files for requests still running on it), and always version `keep`."""
    versions = sorted(int(m.group(1)) for p in root.iterdir()
                      if p.is_dir() and (m := _VERSION_DIR.match(p.name)))
    for v in versions[: max(0, len(versions) - keep_versions)]:
        if v != keep:
            shutil.rmtree(version_dir(root, v), ignore_errors=True)
