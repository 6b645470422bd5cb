"""The environment contract of DESIGN §3, shared by the sandbox, the validator, the episode runner
and the gymnasium adapter. It describes what generated code must provide; it never runs that code
(the sandbox does).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

# Modules generated environments may import (and their submodules): standard library only.
ALLOWED_IMPORTS: frozenset[str] = frozenset(
    "math random re json string itertools collections functools heapq bisect fractions decimal "
    "statistics dataclasses typing datetime textwrap enum operator copy".split()
)
REQUIRED_METHODS = ("reset", "step", "hint")
OPTIONAL_METHODS = ("solution",)
DEFAULT_MAX_TURNS = 8


class ContractError(ValueError):
    """A value crossing the sandbox boundary does not have the contract's type or range."""


@dataclass(frozen=True)
class EnvMeta:
    """What the environment says about itself once loaded."""

    name: str
    description: str
    max_turns: int = DEFAULT_MAX_TURNS
    tools: tuple[dict[str, Any], ...] = ()
    has_solution: bool = False


@dataclass(frozen=True)
class ResetResult:
    observation: str
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


def tool_call_action(name: str, arguments: dict[str, Any] | str | None) -> str:
    """The canonical text form of a native tool call, as `step` receives it:
    `{"tool": "<name>", "arguments": {...}}` (arguments given as a JSON string are parsed)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            arguments = {"_raw": arguments}
    if not isinstance(arguments, dict):
        arguments = {"_value": arguments}
    return json.dumps({"tool": name, "arguments": arguments}, sort_keys=True, ensure_ascii=False)


def parse_tool_call(action: str) -> tuple[str, dict[str, Any]] | None:
    """Inverse of `tool_call_action`; None when the action is plain text."""
    try:
        obj = json.loads(action)
    except (ValueError, TypeError):  # JSONDecodeError, and e.g. a >4300-digit integer
        return None
    if isinstance(obj, dict) and isinstance(obj.get("tool"), str) and isinstance(
        obj.get("arguments", {}), dict
    ):
        return obj["tool"], obj.get("arguments", {})
    return None


def episode_score(rewards: list[float]) -> float:
    """An episode's score: the sum of its rewards clipped to [0, 1]."""
    return min(1.0, max(0.0, math.fsum(rewards)))


# ---- checks applied in the daemon to what the (untrusted) worker sends back -----------------


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
    return EnvMeta(name.strip(), desc.strip(), turns, tuple(tools), bool(raw.get("has_solution")))


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
