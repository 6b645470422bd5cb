"""Checks applied in the daemon to what the (untrusted) sandbox worker sends back: each reply
becomes a contract type or raises ContractError.
"""

from __future__ import annotations

import json
import math
from typing import Any

from spade_async.envs.contract import ContractError, EnvMeta, ResetResult, StepResult
from spade_async.envs.knobs import check_params_schema


def _json_dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ContractError(f"{what} must be a dict, got {type(value).__name__}")
    return value


def check_meta(raw: Any) -> EnvMeta:
    raw = _json_dict(raw, "environment metadata")
    name, desc, turns, tools = (raw.get(k) for k in ("name", "description", "max_turns", "tools"))
    if not isinstance(name, str) or not name.strip():
        raise ContractError("Environment.name must be a non-empty string")
    if not isinstance(desc, str) or not desc.strip():
        raise ContractError("Environment.description must be a non-empty string")
    if isinstance(turns, bool) or not isinstance(turns, int) or not 1 <= turns <= 64:
        raise ContractError(f"Environment.max_turns must be an int in [1, 64], got {turns!r}")
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ContractError("Environment.tools must be a list of OpenAI function-tool dicts")
    for t in tools:
        fn = t.get("function") if t.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ContractError(f"tool schema {json.dumps(t)[:120]} lacks type=function and a name")
    params = check_params_schema(raw.get("params"))
    return EnvMeta(name.strip(), desc.strip(), turns, tuple(tools), bool(raw.get("has_solution")),
                   params)


def check_reset(raw: Any) -> ResetResult:
    raw = _json_dict(raw, "reset result")
    obs, info = raw.get("observation"), raw.get("info")
    if not isinstance(obs, str):
        raise ContractError(f"reset() must return (str, dict); observation is {type(obs).__name__}")
    return ResetResult(obs, _json_dict(info, "reset() info"))


def check_step(raw: Any) -> StepResult:
    raw = _json_dict(raw, "step result")
    obs, reward = raw.get("observation"), raw.get("reward")
    term, trunc, info = raw.get("terminated"), raw.get("truncated"), raw.get("info")
    if not isinstance(obs, str):
        raise ContractError(f"step() observation must be str, got {type(obs).__name__}")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise ContractError(f"step() reward must be a float, got {type(reward).__name__}")
    if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
        raise ContractError(f"step() reward {reward!r} is outside [0, 1]")
    if not isinstance(term, bool) or not isinstance(trunc, bool):
        raise ContractError("step() terminated and truncated must be bools")
    return StepResult(obs, float(reward), term, trunc, _json_dict(info, "step() info"))
