"""Loading the tree: a TOML file with its `extends` chain, SPADE__SECTION__KEY env-var overrides,
and pydantic's errors translated into one ConfigError naming the key and the file."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from spade_async.core.config.errors import ConfigError
from spade_async.core.config.root import SpadeConfig
from spade_async.core.config.seeds import SEEDS_CONTEXT_KEY, SeedCatalog

ENV_PREFIX = "SPADE__"


def _env_value(key: str, value: str) -> Any:
    """A value that starts with `[` or `{` is a TOML inline array or table (JSON reads the
    same way, `null` aside): SPADE__DAEMON__BOOTSTRAP_FAMILIES='["arithmetic"]',
    SPADE__EVAL__PROBE_VARIANTS='[{family = "arithmetic", params = {digits = 1}}]' (an array
    may span lines, an inline table may not). Anything else stays a string, which the model
    converts or refuses by key; one that starts like an array or table but parses as neither
    is an error naming the variable."""
    text = value.strip()
    if not text.startswith(("[", "{")):
        return value
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError as exc:
        toml_error = exc
    try:
        return json.loads(text)
    except ValueError:
        raise ConfigError(f"env override {key}: starts like an inline array or table but is "
                          f"neither TOML nor JSON ({toml_error})") from None


def _apply_env_overrides(data: dict, environ: dict[str, str]) -> dict:
    """SPADE__MODEL__SERVED_NAME=x sets data["model"]["served_name"] = "x" (validated later);
    a number indexes a list of tables: SPADE__ENDPOINTS__0__BASE_URL=http://h:8001; arrays and
    tables are written inline (`_env_value`), a whole one at a time:
    SPADE__ENDPOINTS__1='{name = "b", base_url = "http://h:8002"}' replaces (or, one past the
    end, appends) that table."""
    for key, raw in sorted(environ.items()):
        if not key.startswith(ENV_PREFIX):
            continue
        value = _env_value(key, raw)
        parts = [p.lower() for p in key[len(ENV_PREFIX) :].split("__")]
        node: Any = data
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                appends = last and part.isdigit() and int(part) == len(node)
                if not part.isdigit() or (int(part) >= len(node) and not appends):
                    raise ConfigError(f"env override {key}: '{part}' is not an index of "
                                      f"{'.'.join(parts[:i])} (it has {len(node)} entries)")
                if last:
                    if not isinstance(value, dict):
                        raise ConfigError(f"env override {key}: names a whole table; give it "
                                          "inline, e.g. '{name = \"x\", base_url = \"...\"}'")
                    if appends:
                        node.append(value)
                    else:
                        node[int(part)] = value
                    break
                node = node[int(part)]
            elif isinstance(node, dict):
                if last:
                    node[part] = value
                else:
                    node = node.setdefault(part, {})
            else:
                raise ConfigError(f"env override {key}: {'.'.join(parts[:i])} is not a section")
    return data


def _merge(base: dict, over: dict) -> dict:
    """`over` on top of `base`: tables merge key by key; anything else (arrays included,
    so [[endpoints]] is replaced whole) takes the overriding value."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_toml(path: Path, chain: tuple[Path, ...] = ()) -> dict:
    """A config file with its `extends = "other.toml"` chain resolved (relative to the file)."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        what = f"extended by {chain[-1]}" if chain else "config file"
        raise ConfigError(f"{path}: {what} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: bad value for 'extends': a path to another config file")
    base_path = (path.parent / parent).resolve()
    if base_path in chain or base_path == path.resolve():
        raise ConfigError(f"{path}: 'extends' makes a cycle through {base_path.name}")
    return _merge(_read_toml(base_path, (*chain, path.resolve())), data)


# pydantic puts the discriminator tag into an error's location; it is not a key of the file.
_SWAP_TAGS = {"vllm-lora", "vllm-reload", "vllm-nccl", "none",
              "stdlib", "jsonl", "parquet", "textdir", "hf"}  # and corpus source tags


def _key_path(loc: tuple) -> str:
    return ".".join(str(p) for p in loc if p not in _SWAP_TAGS)


def load_config(path: str | Path, environ: dict[str, str] | None = None, *,
                seeds: SeedCatalog | None = None) -> SpadeConfig:
    """The config at `path`. With `seeds`, the seed-family names in it (daemon.bootstrap_families,
    eval.probe_variants) are checked against that catalog too; without, the schema only."""
    path = Path(path)
    data = _read_toml(path)
    data = _apply_env_overrides(data, dict(os.environ if environ is None else environ))
    try:
        return SpadeConfig.model_validate(data, context={SEEDS_CONTEXT_KEY: seeds})
    except ValidationError as exc:
        err = exc.errors()[0]
        key = _key_path(err["loc"])
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"{path}: unknown key '{key}'") from None
        if not key:  # a check across sections names its keys in the message
            msg = err["msg"].removeprefix("Value error, ")
            raise ConfigError(f"{path}: {msg}") from None
        raise ConfigError(f"{path}: bad value for '{key}': {err['msg']}") from None
