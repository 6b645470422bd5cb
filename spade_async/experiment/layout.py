"""Where an experiment lives: `<experiment dir>/<name>/` holds `experiment.json` (its state),
`report/`, and one data dir per arm, `arms/<arm>/`, with the arm's own config file `arm.toml`:
the experiment's config (by `extends`) with the arm's tables laid over it, its data dir, the
shared base checkpoint, the prefix of its adapters (`<served_name>-<arm>`), and the held-out
evaluation the experiment asks for."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spade_async.core.config import SpadeConfig, checkpoint_dir
from spade_async.core.io import atomic_write_text


def experiment_dir(cfg: SpadeConfig) -> Path:
    root = cfg.experiment.dir or cfg.paths.data_dir / "experiments"
    return (root / cfg.experiment.name).resolve()


def arm_dir(exp_dir: Path, arm: str) -> Path:
    return exp_dir / "arms" / arm


def arm_config_path(exp_dir: Path, arm: str) -> Path:
    return arm_dir(exp_dir, arm) / "arm.toml"


def arm_tables(cfg: SpadeConfig, config_path: Path, exp_dir: Path, arm: str) -> dict[str, Any]:
    """Everything the arm's config sets on top of the experiment's config."""
    tables = cfg.experiment.arm_tables(arm)
    paths = {"data_dir": str(arm_dir(exp_dir, arm)),
             # every arm starts from the one prepared base checkpoint
             "models_dir": str(checkpoint_dir(cfg).parent.resolve())}
    from spade_async.evals import expand_suites

    suites = expand_suites(list(cfg.experiment.suites))
    evals = {"every_versions": cfg.experiment.eval_every_versions,
             # groups (`paper`, `held-out`) as their suites: the arm's [eval] names suites
             "suites": suites,
             "bookend_suites": [s for s in expand_suites(list(cfg.experiment.bookend_suites))
                                if s not in suites]}
    # the arm's adapters are its own, even on a vllm-lora server the arms share
    model = {"adapter_prefix": f"{cfg.model.served_name}-{arm}", **tables.get("model", {})}
    return {"extends": str(config_path.resolve()), **tables,
            "paths": {**tables.get("paths", {}), **paths},
            "model": model,
            "eval": {**tables.get("eval", {}), **evals}}


def _key_paths(tables: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for k, v in tables.items():
        if isinstance(v, dict) and v:
            out += _key_paths(v, (*prefix, str(k).lower()))
        else:
            out.append((*prefix, str(k).lower()))
    return out


def arm_environment(environ: Mapping[str, str], tables: dict[str, Any],
                    ) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The environment of an arm's processes: without the SPADE__* overrides of a key the arm
    sets itself (its data dir, adapter prefix, mode, evaluation, overrides), which would
    otherwise win over arm.toml and put every arm in one data dir. Returns (environment,
    [(variable, the arm's key)] left out)."""
    own = _key_paths({k: v for k, v in tables.items() if k != "extends"})
    kept, dropped = {}, []
    for name, value in environ.items():
        if name.startswith("SPADE__"):
            path = tuple(p.lower() for p in name[len("SPADE__"):].split("__"))
            hit = next((k for k in own if k[:len(path)] == path or path[:len(k)] == k), None)
            if hit is not None:
                dropped.append((name, ".".join(hit)))
                continue
        kept[name] = value
    return kept, sorted(dropped)


def write_arm_config(cfg: SpadeConfig, config_path: Path, exp_dir: Path, arm: str) -> Path:
    path = arm_config_path(exp_dir, arm)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = (f"# arm {arm!r} of experiment {cfg.experiment.name!r}, written by `spade experiment "
            "run`:\n# the experiment's config with the arm's tables laid over it.\n"
            + toml_dumps(arm_tables(cfg, config_path, exp_dir, arm)))
    atomic_write_text(path, text)
    return path


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str | Path):
        return json.dumps(str(v))  # a JSON string is a valid TOML basic string
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML for {type(v).__name__}: {v!r}")


def toml_dumps(data: dict[str, Any]) -> str:
    """Top-level keys, then one [table] per dict of the top level (nested dicts inline)."""
    lines = [f"{json.dumps(k)} = {_value(v)}" for k, v in data.items()
             if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines += ["", f"[{json.dumps(k)}]"] + [f"{json.dumps(str(x))} = {_value(y)}"
                                                   for x, y in v.items()]
    return "\n".join(lines) + "\n"
