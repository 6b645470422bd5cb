"""The `probe` suite: a fixed set of *training* variants, played the same way on every policy
version, so their solve rate is a learning curve on what the loop trains on.

Unlike the held-out suites it measures nothing outside training: its variants are seed
environments (spade_async/envs/seeds/) at fixed knob settings, the kind of task the agent plays
every day. What makes it a measure is that nothing moves but the policy: the same variants, the
same episode seeds (PROBE_SEED_BASE + 0..n-1; training draws its seeds at random), the same
per-request sampling seeds, the same prompt, sampler settings (`rollout`) and episode runner as
training, through the real sandbox. One task is one unhinted episode; solved = score >= 1.0.
`probe` samples at the rollout's temperature; `probe-greedy` plays the same tasks at 0: two
readings of one policy, each paired task by task across versions (evals/paired.py).

It reads the seed files as text and plays them only in the sandbox; it never writes into the
memory or the run's logs (its results go to <data_dir>/eval/ like every suite's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spade_async.envs.contract import ContractError
from spade_async.envs.variants import (  # noqa: F401 (the probe's public names)
    SEEDS_DIR,
    ProbeVariant,
    default_probe_variants,
    family_knobs,
    resolve_probe_variants,
    seed_families,
)
from spade_async.evals.base import EvalPolicy, EvalTask, TaskResult

if TYPE_CHECKING:
    from spade_async.core.config import RolloutConfig, SandboxConfig, SpadeConfig
    from spade_async.sandbox.runtime import Sandbox

PROBE_SEED_BASE = 424_242_000  # episode seeds of the probe: base + 0, 1, 2, ...


def probe_seeds(n: int) -> tuple[int, ...]:
    return tuple(PROBE_SEED_BASE + i for i in range(n))


@dataclass
class ProbeSuite:
    """`seeds` episodes of every variant. Use as `async with suite:` around the run: it plays
    in `sandbox` when one is given, else in its own Sandbox (`sandbox_cfg`) for the run.
    `temperature`: the sampling temperature of its episodes, None for the rollout's (the
    `probe` suite: sampled as training samples); `probe-greedy` plays the same tasks at 0."""

    variants: list[ProbeVariant]
    seeds: tuple[int, ...]
    rollout: RolloutConfig
    sandbox_cfg: SandboxConfig
    sandbox: Sandbox | None = None
    name: str = "probe"
    pass_mark: float = 1.0  # solved: the episode's score reaches 1
    temperature: float | None = None
    _own: Sandbox | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, cfg: SpadeConfig, sandbox: Sandbox | None = None,
                    root: Path = SEEDS_DIR, *, greedy: bool = False) -> ProbeSuite:
        """The config's probe (eval.probe_*); `greedy`: the probe-greedy suite."""
        e = cfg.eval
        given = None if e.probe_variants is None else [v.model_dump() for v in e.probe_variants]
        return cls(resolve_probe_variants(given, root, e.probe_rungs), probe_seeds(e.probe_seeds),
                   cfg.rollout, cfg.sandbox, sandbox,
                   name="probe-greedy" if greedy else "probe",
                   temperature=0.0 if greedy else None)

    @property
    def play_cfg(self) -> RolloutConfig:
        """The rollout settings its episodes are played with: the rollout's, at `temperature`."""
        if self.temperature is None:
            return self.rollout
        return self.rollout.model_copy(update={"temperature": self.temperature})

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
        from spade_async.sandbox.errors import SandboxError

        if self.sandbox is None:
            raise RuntimeError("use `async with ProbeSuite(...)` around the run: it needs a "
                               "sandbox")
        v, seed = self.variants[task.payload["variant"]], task.payload["seed"]
        play_cfg = self.play_cfg
        detail: dict[str, Any] = {"family": v.family, "params": v.params, "seed": seed,
                                  "env_id": v.env_id, "variant_id": v.variant_id,
                                  "temperature": play_cfg.temperature}
        try:
            async with self.sandbox.open(v.code) as env:
                ep = await policy.play(env, env_id=v.env_id, seed=seed, cfg=play_cfg,
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
