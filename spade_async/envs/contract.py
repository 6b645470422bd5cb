"""The environment contract of DESIGN §3, shared by the sandbox, the validator, the episode runner
and the gymnasium adapter: the types of what generated code provides and returns, and the error
a value that breaks them raises. It describes what generated code must provide; it never runs
that code (the sandbox does). Parsing the knobs is `knobs.py`; checking replies is `replies.py`.
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
class ParamSpec:
    """One difficulty knob, checked: `min`/`max` for int and float knobs, `choices` for choice
    knobs, neither for bool knobs."""

    name: str
    type: str
    min: int | float | None = None
    max: int | float | None = None
    choices: tuple[str | int | float, ...] | None = None
    default: Any = None
    description: str = ""
    easy: Any = None  # the knob's easiest value when it is not the usual end (see `easiest`)

    @property
    def easiest(self) -> Any:
        """The value that makes the task easiest: `easy` when the spec names it, else the
        convention: an int or float knob's min, a choice knob's first choice, false (most
        knobs make a task harder as they grow; "guesses allowed" is one that does not, and
        says `"easy": <its max>`)."""
        if self.easy is not None:
            return self.easy
        if self.type in ("int", "float"):
            return self.min
        if self.type == "bool":
            return False
        return (self.choices or (self.default,))[0]

    def as_dict(self) -> dict[str, Any]:
        """The spec in the form an environment declares it (`knobs.check_params_schema` reads
        it back to an equal ParamSpec)."""
        out: dict[str, Any] = {"type": self.type}
        if self.type in ("int", "float"):
            out |= {"min": self.min, "max": self.max}
        elif self.type == "choice":
            out["choices"] = list(self.choices or ())
        out["default"] = self.default
        if self.easy is not None:
            out["easy"] = self.easy
        if self.description:
            out["description"] = self.description
        return out

    def allowed(self) -> str:
        """The allowed values, as an error message shows them."""
        if self.type in ("int", "float"):
            return f"{'an' if self.type == 'int' else 'a'} {self.type} in [{self.min}, {self.max}]"
        if self.type == "bool":
            return "true or false"
        return "one of " + json.dumps(list(self.choices or ()), ensure_ascii=False)


@dataclass(frozen=True)
class EnvMeta:
    """What the environment says about itself once loaded."""

    name: str
    description: str
    max_turns: int = DEFAULT_MAX_TURNS
    tools: tuple[dict[str, Any], ...] = ()
    has_solution: bool = False
    params: tuple[ParamSpec, ...] = ()


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
