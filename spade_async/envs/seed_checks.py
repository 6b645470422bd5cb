"""The config's seed-family names checked against the seed files: `SeedFiles` is the catalog
spade_async.core.config.load_config checks them with, and `load_checked_config` the loader the
daemon and the `spade` commands use. The trainer needs only the schema: it loads with
load_config alone and never reads the seed files."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spade_async.core.config import SpadeConfig, load_config
from spade_async.envs.variants import SEEDS_DIR, resolve_probe_variants, seed_families


@dataclass(frozen=True)
class SeedFiles:
    """The seed families of a directory (spade_async/envs/seeds/) as a config's SeedCatalog."""

    root: Path = SEEDS_DIR

    def check_families(self, names: Sequence[str]) -> None:
        known = list(seed_families(self.root))
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"no seed family {', '.join(map(repr, unknown))} "
                             f"(known: {', '.join(known)})")

    def check_probe_variants(self, entries: Sequence[dict[str, Any]]) -> None:
        resolve_probe_variants(entries, self.root)


def load_checked_config(path: str | Path, environ: dict[str, str] | None = None) -> SpadeConfig:
    """`load_config` with every seed-family name in the config checked against the seed files;
    a bad one is a ConfigError naming its key, like any bad value."""
    return load_config(path, environ, seeds=SeedFiles())
