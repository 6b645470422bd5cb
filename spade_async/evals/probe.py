"""The `probe` suite: a fixed set of *training* variants, played the same way on every policy
version, so their solve rate is a learning curve on what the loop trains on.

Unlike the held-out suites it measures nothing outside training: its variants are seed
environments (spade_async/envs/seeds/) at fixed knob settings, the kind of task the agent plays
every day. What makes it a measure is that nothing moves but the policy: the same variants, the
same episode seeds (PROBE_SEED_BASE + 0..n-1; training draws its seeds at random), the same
per-request sampling seeds, the same prompt, sampler settings (`rollout`) and episode runner as
training, through the real sandbox. One task is one unhinted episode; solved = score >= 1.0.

It reads the seed files as text and plays them only in the sandbox; it never writes into the
memory or the run's logs (its results go to <data_dir>/eval/ like every suite's).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memory_db.schema import env_id as content_id
from memory_db.schema import variant_id
from spade_async.envs.contract import ContractError, ParamSpec, easiest_point, resolve_params
from spade_async.evals.base import EvalPolicy, EvalTask, TaskResult

if TYPE_CHECKING:
    from spade_async.config import RolloutConfig, SandboxConfig, SpadeConfig
    from spade_async.sandbox.runtime import Sandbox

SEEDS_DIR = Path(__file__).resolve().parents[1] / "envs" / "seeds"
PROBE_SEED_BASE = 424_242_000  # episode seeds of the probe: base + 0, 1, 2, ...


def seed_families(root: Path = SEEDS_DIR) -> dict[str, Path]:
    """Every seed environment by family (its file stem), sorted."""
    return {p.stem: p for p in sorted(root.glob("*.py")) if p.name != "__init__.py"}


def family_knobs(code: str) -> tuple[ParamSpec, ...]:
    from spade_async.envs.validate import declared_params

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


def probe_seeds(n: int) -> tuple[int, ...]:
    return tuple(PROBE_SEED_BASE + i for i in range(n))


@dataclass
class ProbeSuite:
    """`seeds` episodes of every variant. Use as `async with suite:` around the run: it plays
    in `sandbox` when one is given, else in its own Sandbox (`sandbox_cfg`) for the run."""

    variants: list[ProbeVariant]
    seeds: tuple[int, ...]
    rollout: RolloutConfig
    sandbox_cfg: SandboxConfig
    sandbox: Sandbox | None = None
    name: str = "probe"
    pass_mark: float = 1.0  # solved: the episode's score reaches 1
    _own: Sandbox | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, cfg: SpadeConfig, sandbox: Sandbox | None = None,
                    root: Path = SEEDS_DIR) -> ProbeSuite:
        e = cfg.eval
        given = None if e.probe_variants is None else [v.model_dump() for v in e.probe_variants]
        return cls(resolve_probe_variants(given, root, e.probe_rungs), probe_seeds(e.probe_seeds),
                   cfg.rollout,
                   cfg.sandbox, sandbox)

    async def __aenter__(self) -> ProbeSuite:
        if self.sandbox is None:
            from spade_async.sandbox.runtime import Sandbox

            self._own = Sandbox(self.sandbox_cfg)
            self.sandbox = await self._own.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._own is not None:
            own, self._own, self.sandbox = self._own, None, None
            await own.__aexit__(*exc)

    def tasks(self, limit: int | None = None) -> list[EvalTask]:
        """Seed by seed over every variant, so a `limit` still samples every variant."""
        out = [EvalTask(f"{v.label}/{seed}", {"variant": i, "seed": seed})
               for seed in self.seeds for i, v in enumerate(self.variants)]
        return out[:limit] if limit is not None else out

    def texts(self) -> list[str]:
        """Nothing: the probe is training material by design, not a held-out set."""
        return []

    async def run_task(self, task: EvalTask, policy: EvalPolicy) -> TaskResult:
        from spade_async.sandbox.runtime import SandboxError

        if self.sandbox is None:
            raise RuntimeError("use `async with ProbeSuite(...)` around the run: it needs a "
                               "sandbox")
        v, seed = self.variants[task.payload["variant"]], task.payload["seed"]
        detail: dict[str, Any] = {"family": v.family, "params": v.params, "seed": seed,
                                  "env_id": v.env_id, "variant_id": v.variant_id}
        try:
            async with self.sandbox.open(v.code) as env:
                ep = await policy.play(env, env_id=v.env_id, seed=seed, cfg=self.rollout,
                                       params=v.params, request_seed=seed)
        except SandboxError as exc:  # no worker, or the seed failed to load: not a score
            return TaskResult(task.task_id, 0.0, False, error=f"sandbox {exc.kind}: {exc}",
                              detail=detail, failed=True)
        except ContractError as exc:  # the loaded knobs differ from the ones read statically
            return TaskResult(task.task_id, 0.0, False, error=f"params: {exc}", detail=detail,
                              failed=True)
        solved = ep.score >= self.pass_mark
        detail |= {"episode_score": ep.score, "episode_id": ep.episode_id,
                   "terminated": ep.terminated, "truncated": ep.truncated}
        # As in training, an episode that failed in the sandbox or by deadline is no score.
        return TaskResult(task.task_id, float(solved), solved,
                          answer="\n".join(t.action for t in ep.turns)[-500:],
                          turns=len(ep.turns),
                          completion_tokens=ep.generated_tokens,
                          error=ep.error, detail=detail, failed=ep.error is not None)
