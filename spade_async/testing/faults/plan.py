"""What a fault is: its kinds, the paths it hits, and the `Fault` value a test arms (alone with
`FaultProxy.inject`, or as timed `Phase`s of a schedule). Validation only; nothing here touches a
socket."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal, get_args

FaultKind = Literal["stall", "drop", "status", "truncate", "garbage", "down"]
KINDS: tuple[FaultKind, ...] = get_args(FaultKind)
# Requests a fault spares unless its `paths` say otherwise: the pool's health checks keep
# seeing the server "up" while its real requests fail.
SPARED_PATHS: tuple[str, ...] = ("/health", "/v1/models")
ALL_PATHS: tuple[str, ...] = ("*",)


@dataclass(frozen=True)
class Fault:
    """One armed fault. `count`: the next N matching requests (None: no limit). `duration`:
    seconds the fault stays armed from when it is injected (None: until `count` is used up or
    `clear()`); for `down`, how long the proxy stays down (None: until `up()`/`clear()`).
    `seconds`: `stall` only, how long each request is held before it is forwarded (None: until
    the fault ends by `clear()`, its duration or the next schedule phase, or the client hangs
    up). `status`: `status` only (default 500). `paths`: glob patterns of the paths hit
    (None: all but `SPARED_PATHS`; `ALL_PATHS`: every path); not for `down`."""

    kind: FaultKind
    count: int | None = None
    duration: float | None = None
    seconds: float | None = None
    status: int | None = None
    paths: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        kind = "down" if self.kind == "die" else self.kind
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {', '.join(KINDS)}")
        object.__setattr__(self, "kind", kind)
        if isinstance(self.paths, str):
            object.__setattr__(self, "paths", (self.paths,))
        elif self.paths is not None:
            object.__setattr__(self, "paths", tuple(self.paths))
        if self.count is not None and self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")
        for name in ("duration", "seconds"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.seconds is not None and kind != "stall":
            raise ValueError(f"seconds is the hold of a stall; a {kind} fault lasts `duration`")
        if kind == "status":
            status = 500 if self.status is None else self.status
            if not 200 <= status <= 599:
                raise ValueError(f"status must be 200..599, got {status}")
            object.__setattr__(self, "status", status)
        elif self.status is not None:
            raise ValueError(f"status is for `status` faults, not {kind}")
        if kind == "down" and (self.count is not None or self.paths is not None):
            raise ValueError("a down fault closes the whole proxy: no count, no paths")

    def matches(self, path: str) -> bool:
        if self.paths is None:
            return path not in SPARED_PATHS
        return any(fnmatchcase(path, pattern) for pattern in self.paths)


# A schedule phase: (start offset in seconds from `schedule()`, the fault to arm then).
Phase = tuple[float, Fault]
