"""Which endpoints each role uses, by which path, and the start-up check that they can.

Three roles (DESIGN §5): the agent is the trained policy and needs the tokens path (exact ids and
behaviour log-probs) and, where it trains, a weight-swap API; the designer is the policy too by
default (trained on, so tokens), or a frozen model on any server (`roles.designer.model`), which
is then not trained on; evaluation is the policy version under test, or a named model. A named
model takes the chat path unless told otherwise: our tokenizer and chat template are the policy's,
so token-id prompts would be wrong for another model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from spade_async.inference.capabilities import SWAP_ROUTES

if TYPE_CHECKING:
    from spade_async.core.config import SpadeConfig
    from spade_async.inference.pool import EndpointPool

ROLES = ("agent", "designer", "eval")

SWAP_HINT = {
    "vllm-lora": "start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True",
    "vllm-reload": "start vLLM with VLLM_SERVER_DEV_MODE=1",
    "vllm-nccl": "start vLLM with VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config",
}


class RoleCapabilityError(RuntimeError):
    """A role's endpoint cannot do what the role needs; one line per endpoint and role."""


@dataclass(frozen=True)
class RoleRoute:
    role: str
    group: str
    model: str | None  # None: the trained policy (its current or evaluated version)
    path: str          # "tokens" or "chat"

    @property
    def trained(self) -> bool:
        """Its samples train the policy (the agent; the designer unless frozen)."""
        return self.model is None and self.role in ("agent", "designer")

    def as_dict(self) -> dict[str, object]:
        return {"role": self.role, "group": self.group, "model": self.model, "path": self.path,
                "trained": self.trained}


def role_route(cfg: SpadeConfig, role: str) -> RoleRoute:
    rc = getattr(cfg.roles, role)
    path = rc.path
    if path == "auto":
        path = "tokens" if rc.model is None else "chat"
    return RoleRoute(role, rc.group, rc.model, path)


def role_problems(cfg: SpadeConfig, pool: EndpointPool, roles: tuple[str, ...] = ROLES,
                  *, swaps: bool = True) -> list[str]:
    """One line per (role, endpoint) that cannot serve the role, from the probed capabilities;
    an endpoint not probed yet (down) is checked when it comes up, by the pool's routing."""
    problems: list[str] = []
    for role in roles:
        route = role_route(cfg, role)
        for name in pool.group_endpoints(route.group):
            caps = pool.capabilities(name)
            if caps is None:
                continue
            where = f"endpoint '{name}' ({caps.server}, group {route.group})"
            missing = caps.missing(route.path)
            if missing:
                why = ("the agent is trained on exact token ids and log-probs" if role == "agent"
                       else "the designer is the trained policy (roles.designer.model unset)"
                       if route.trained else "")
                problems.append(f"{where} cannot serve roles.{role} on the {route.path} path: "
                                f"it lacks {', '.join(missing)}" + (f"; {why}" if why else ""))
            if route.model is not None:
                served = pool.models_of(name)
                if served is not None and route.model not in served:
                    problems.append(f"{where} does not serve model '{route.model}' "
                                    f"(roles.{role}.model); it lists {', '.join(sorted(served))}")
            if role == "agent" and swaps:
                swap = pool.config(name).weight_swap.type
                if swap != "none" and caps.swap is not None and swap not in caps.swap:
                    problems.append(f"{where} has weight_swap {swap} but the server has no "
                                    f"{SWAP_ROUTES[swap]} route: {SWAP_HINT[swap]}, or set "
                                    "weight_swap.type = \"none\" if nothing trains through it")
    return problems


def group_has(pool: EndpointPool, group: str, capability: str) -> bool:
    """Every probed endpoint of `group` has `capability` (tools, structured, ...), and at
    least one was probed."""
    caps = [pool.capabilities(n) for n in pool.group_endpoints(group)]
    known = [c for c in caps if c is not None]
    return bool(known) and all(getattr(c, capability) for c in known)


def check_roles(cfg: SpadeConfig, pool: EndpointPool, roles: tuple[str, ...] = ROLES,
                *, swaps: bool = True) -> dict[str, RoleRoute]:
    """The routes of `roles`; RoleCapabilityError (every problem, one line each) if an
    endpoint that answered lacks what its role needs. Call after `pool.check()`."""
    problems = role_problems(cfg, pool, roles, swaps=swaps)
    if problems:
        raise RoleCapabilityError("\n".join(problems))
    return {r: role_route(cfg, r) for r in roles}
