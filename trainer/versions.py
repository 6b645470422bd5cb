"""Which old version directories (`<data_dir>/weights/vN`) the trainer removes; where they
live is spade_async.core.policy's."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from spade_async.core.policy import version_dir, weights_dir

_VERSION_DIR = re.compile(r"^v(\d+)$")


def prune_versions(data_dir: Path, keep_versions: int, *, keep: int) -> None:
    """Keep the newest `keep_versions` weight directories (vLLM may re-read an unloaded
    adapter's files for requests still running on it), and always version `keep`."""
    versions = sorted(int(m.group(1)) for p in weights_dir(data_dir).iterdir()
                      if p.is_dir() and (m := _VERSION_DIR.match(p.name)))
    for v in versions[: max(0, len(versions) - keep_versions)]:
        if v != keep:
            shutil.rmtree(version_dir(data_dir, v), ignore_errors=True)
