"""The seed families (spade_async/envs/seeds/) and the probe's variants of them, read as text:
their knobs come from the module's literal `params`, never from running it. Pure: the config's
validation of `eval.probe_variants` uses it, so it imports nothing that imports the config."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memory_db.schema import env_id as content_id
from memory_db.schema import variant_id
from spade_async.envs.contract import ContractError, ParamSpec
from spade_async.envs.knobs import declared_params, easiest_point, resolve_params

SEEDS_DIR = Path(__file__).resolve().parent / "seeds"


def seed_families(root: Path = SEEDS_DIR) -> dict[str, Path]:
    """Every seed environment by family (its file stem), sorted."""
    return {p.stem: p for p in sorted(root.glob("*.py")) if p.name != "__init__.py"}


def family_knobs(code: str) -> tuple[ParamSpec, ...]:
    return declared_params(code)


def default_probe_variants(root: Path = SEEDS_DIR,
                           rungs: Sequence[str] = ("easiest", "default")) -> list[dict[str, Any]]:
    """The default probe list: every seed family at its easiest point, then at its defaults
    (`rungs` picks which; one entry when the two coincide, as for a family without knobs)."""
    out: list[dict[str, Any]] = []
    for family, path in seed_families(root).items():
        specs = family_knobs(path.read_text())
        points = {"easiest": easiest_point(specs), "default": resolve_params(specs, None)}
        for params in (points[r] for r in rungs):
            entry = {"family": family, "params": params}
            if entry not in out:
                out.append(entry)
    return out


@dataclass(frozen=True)
class ProbeVariant:
    """One probe variant: a seed family's code at resolved params, under the ids the memory
    would give it (so its probe results can be put beside its training stats)."""

    family: str
    params: dict[str, Any]
    code: str = field(repr=False)
    env_id: str
    variant_id: str

    @property
    def label(self) -> str:
        knobs = ",".join(f"{k}={json.dumps(v)}" for k, v in self.params.items())
        return f"{self.family}[{knobs}]" if knobs else self.family


def resolve_probe_variants(given: Sequence[dict[str, Any]] | None,
                           root: Path = SEEDS_DIR,
                           rungs: Sequence[str] = ("easiest", "default")) -> list[ProbeVariant]:
    """The probe list (`eval.probe_variants`; None: `default_probe_variants`) as variants with
    every knob resolved. ValueError naming the entry: an unknown family, params that do not fit
    its knobs, or the same variant twice."""
    families = seed_families(root)
    entries = default_probe_variants(root, rungs) if given is None else list(given)
    out: list[ProbeVariant] = []
    for i, entry in enumerate(entries):
        family, params = entry.get("family"), entry.get("params") or {}
        where = f"probe variant {i} ({family})"
        if family not in families:
            raise ValueError(f"{where}: no seed environment named {family!r} (one of "
                             f"{', '.join(families) or 'none'})")
        code = families[family].read_text()
        try:
            resolved = resolve_params(family_knobs(code), params)
        except ContractError as exc:
            raise ValueError(f"{where}: {exc}") from None
        eid = content_id(code)
        v = ProbeVariant(family, resolved, code, eid, variant_id(eid, resolved))
        if any(o.variant_id == v.variant_id for o in out):
            raise ValueError(f"{where}: the same variant twice ({v.label})")
        out.append(v)
    return out
