"""Where the daemon's environments run, as the config says (`sandbox.placement`): this host's
sandbox, or sandbox nodes on a Ray cluster behind the same interface. Ray is imported only when
asked for."""

from __future__ import annotations

from spade_async.core.config import SandboxConfig
from spade_async.sandbox.isolation import SandboxUnavailable
from spade_async.sandbox.runtime import Sandbox


def make_sandbox(cfg: SandboxConfig):
    """`Sandbox` (placement = "local") or `ray_pool.RaySandbox` (placement = "ray"): both are
    async context managers with the same `open(code)`, sessions and `capacity`."""
    if cfg.placement == "ray":
        try:
            from spade_async.sandbox.ray_pool import RaySandbox
        except ImportError as exc:
            raise SandboxUnavailable("sandbox.placement = 'ray' needs Ray: pip install "
                                     f"'spade-async[ray]' ({exc})") from None
        return RaySandbox(cfg)
    return Sandbox(cfg)
