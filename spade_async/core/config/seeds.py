"""The seed families a config names (daemon.bootstrap_families, eval.probe_variants) are checked
against a `SeedCatalog` the loader is given: the envs package provides the one that reads the
seed files (spade_async.envs.seed_checks), so the core never reads them, and a load without one
(the trainer's, which needs only the schema) checks the schema alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pydantic import ValidationInfo

SEEDS_CONTEXT_KEY = "seeds"  # where load_config puts the catalog in pydantic's validation context


class SeedCatalog(Protocol):
    def check_families(self, names: Sequence[str]) -> None:
        """ValueError naming every name that is no seed family."""

    def check_probe_variants(self, entries: Sequence[dict[str, Any]]) -> None:
        """ValueError naming the first entry that is no seed family at knob values it declares
        (or the same variant twice)."""


def seed_catalog(info: ValidationInfo) -> SeedCatalog | None:
    """The catalog this validation was given, if any."""
    return (info.context or {}).get(SEEDS_CONTEXT_KEY)
