"""What an experiment has done, in `<experiment dir>/experiment.json`, rewritten atomically at
every change so a killed `spade experiment run` resumes where it stopped: each arm's status
(pending, running, done), the wall time its loop has run (summed over restarts), its runs (start,
end, how each ended) and, while one runs, the process group of its stack."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spade_async.core.io import atomic_write_json

STATE_FILE = "experiment.json"


class ExperimentMismatch(ValueError):
    """The experiment dir holds another experiment (other arms or budget)."""


@dataclass
class ArmRun:
    started: float
    ended: float | None = None
    how: str = ""  # budget, stack exit <rc>, interrupted


@dataclass
class ArmState:
    status: str = "pending"  # pending, running, done
    elapsed_s: float = 0.0  # the loop's wall time (from its daemon's start), all runs
    runs: list[ArmRun] = field(default_factory=list)
    pgid: int | None = None  # the stack's process group while it runs
    first_started: float | None = None  # when its loop first ran (the report's time origin)
    budget_spent: str = ""  # what the budget read when it stopped


@dataclass
class ExperimentState:
    name: str
    arms: list[str]
    budget: str
    config: str
    created: float = field(default_factory=time.time)
    arm: dict[str, ArmState] = field(default_factory=dict)

    @classmethod
    def open(cls, exp_dir: Path, *, name: str, arms: list[str], budget: str,
             config: Path) -> ExperimentState:
        """The state on disk, or a new one; refuses a dir that holds another experiment."""
        path = exp_dir / STATE_FILE
        if not path.exists():
            st = cls(name=name, arms=list(arms), budget=budget, config=str(config.resolve()))
            st.arm = {a: ArmState() for a in arms}
            st.save(exp_dir)
            return st
        st = cls.load(exp_dir)
        if st.arms != list(arms) or st.budget != budget:
            raise ExperimentMismatch(
                f"{path}: this experiment ran arms {','.join(st.arms)} on budget {st.budget}, "
                f"not {','.join(arms)} on {budget}: give another experiment.name, or delete "
                f"{exp_dir} to start it over")
        return st

    @classmethod
    def load(cls, exp_dir: Path) -> ExperimentState:
        raw: dict[str, Any] = json.loads((exp_dir / STATE_FILE).read_text())
        arms = {a: ArmState(**{**s, "runs": [ArmRun(**r) for r in s.get("runs", [])]})
                for a, s in raw.pop("arm", {}).items()}
        return cls(**raw, arm=arms)

    def save(self, exp_dir: Path) -> None:
        exp_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(exp_dir / STATE_FILE, asdict(self))
