"""The trainer's sample buffer: a step is a sample budget, not a spool batch.

Batches are claimed in sequence order while the buffer holds fewer agent samples than one step
needs; a step takes the oldest `samples_per_step` agent samples (across batches) and designer
samples up to `designer_max_share` of that (or, with `designer_steps = "separate"`, designer
steps of their own). Every sample taken from the spool ends trained or dropped with a named
reason: `stale` (older than max_staleness versions when its step came), `designer_cap`
(designer samples beyond two steps' worth, oldest first), and the selection's own
(`zero_weight_<role>`, `no_trainable_token`). When a full step does not come, the loop trains
what the buffer holds once its oldest sample has waited `step_wait_s` (a designer-only phase
fills no agent step, yet its samples are trained while fresh).

Exactly once: the trainer state remembers, per batch past `last_seq` (the last batch wholly
done), which of its rows are done; it is saved inside each checkpoint, and a batch is
acknowledged only when it is wholly done in a committed checkpoint. A restart claims the
batches after `last_seq` again and skips their done rows, so a sample is never trained twice
into the same weights and never lost. Every rank runs the same buffer on the same batches and
takes the same steps (rank 0 decides when, trainer/loop.py).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field

from spade_async.core.config.trainer import TrainerConfig
from spade_async.core.spool.batch import Batch
from trainer.data import TrainSample, select_samples


@dataclass
class OpenBatches:
    """Batches after `last_seq` with some rows done: seq -> (rows in it, done rows)."""

    last_seq: int = 0
    open: dict[int, tuple[int, set[int]]] = field(default_factory=dict)

    def done(self, seq: int) -> set[int]:
        return self.open.get(seq, (0, set()))[1]

    def mark(self, seq: int, rows: int, done: list[int]) -> None:
        total, have = self.open.setdefault(seq, (rows, set()))
        have.update(done)
        while self.last_seq + 1 in self.open:  # advance over wholly done batches
            total, have = self.open[self.last_seq + 1]
            if len(have) < total:
                break
            del self.open[self.last_seq + 1]
            self.last_seq += 1

    def as_json(self) -> dict[str, dict[str, object]]:
        return {str(seq): {"rows": n, "done": sorted(rows)}
                for seq, (n, rows) in sorted(self.open.items())}

    @classmethod
    def from_json(cls, last_seq: int, data: dict | None) -> OpenBatches:
        return cls(last_seq, {int(k): (int(v["rows"]), set(map(int, v["done"])))
                              for k, v in (data or {}).items()})


@dataclass(frozen=True)
class StepPlan:
    samples: list[TrainSample]
    dropped: Counter[str]  # drops decided when the step was formed (and at claims before it)


class SampleBuffer:
    def __init__(self, tcfg: TrainerConfig, role_weights: dict[str, float],
                 batches: OpenBatches) -> None:
        self.tcfg, self.role_weights, self.batches = tcfg, role_weights, batches
        self.pending: list[TrainSample] = []
        self.claimed_seq = batches.last_seq  # the last batch claimed into the buffer
        self.dropped: Counter[str] = Counter()  # since the last step was planned
        self.last_step_role = "designer"  # separate mode: an agent step comes first
        self.designer_cap = math.ceil(tcfg.designer_max_share * tcfg.samples_per_step)
        self.claimed_at: dict[int, float] = {}  # batch seq -> when it was claimed (monotonic)

    # ---- claiming --------------------------------------------------------------------------

    def agent_pending(self) -> int:
        return sum(s.role != "designer" for s in self.pending)

    def wants_more(self) -> bool:
        """Claim another batch? While one step's worth of agent samples is missing."""
        return self.agent_pending() < self.tcfg.samples_per_step

    def claim(self, batch: Batch, version: int) -> None:
        """The batch's samples into the buffer, minus rows already done (a restart) and the
        ones the selection drops (those are done at once, with their reason)."""
        if batch.seq != self.claimed_seq + 1:
            raise RuntimeError(f"batch {batch.seq} claimed after {self.claimed_seq}: out of "
                               "order")
        self.claimed_seq = batch.seq
        done = self.batches.done(batch.seq)
        sel = select_samples(batch, current_version=version,
                             max_staleness=self.tcfg.max_staleness,
                             role_weights=self.role_weights)
        drops = [(row, why) for row, why in sel.dropped_rows if row not in done]
        for _, why in drops:
            self.dropped[why] += 1
        self.pending.extend(s for s in sel.samples if s.row not in done)
        self.batches.mark(batch.seq, len(batch), [row for row, _ in drops])
        self.claimed_at[batch.seq] = time.monotonic()
        self._drop(version)  # designer samples beyond two steps' worth go now, not at a step

    def waited_s(self) -> float:
        """How long the oldest pending sample has waited since its batch was claimed (0 when
        the buffer is empty): the loop trains what is here once it passes step_wait_s."""
        if not self.pending:
            self.claimed_at.clear()
            return 0.0
        oldest = min(s.seq for s in self.pending)
        for seq in [q for q in self.claimed_at if q < oldest]:
            del self.claimed_at[seq]
        return time.monotonic() - self.claimed_at.get(oldest, time.monotonic())

    # ---- steps -----------------------------------------------------------------------------

    def ready(self, *, force: bool = False) -> bool:
        """Is there a step to take: a full one, or (force) whatever the buffer holds."""
        agents = self.agent_pending()
        designers = len(self.pending) - agents
        if self.tcfg.designer_steps == "separate" and self.last_step_role == "agent" and (
                designers >= max(1, self.designer_cap) or (force and designers and not agents)):
            return True
        return agents >= self.tcfg.samples_per_step or (force and bool(self.pending))

    def take(self, version: int, *, force: bool = False) -> StepPlan | None:
        """The next step's samples (None: not enough yet, unless forced); stale samples and
        designer samples beyond two steps' worth are dropped first."""
        self._drop(version)
        if not self.ready(force=force):
            return None
        agents = [s for s in self.pending if s.role != "designer"]
        designers = [s for s in self.pending if s.role == "designer"]
        cap = self.designer_cap
        if self.tcfg.designer_steps == "separate":
            if self.last_step_role == "agent" and designers and (
                    len(designers) >= max(1, cap) or not agents):
                chosen, self.last_step_role = designers[:max(1, cap)], "designer"
            else:
                chosen, self.last_step_role = agents[:self.tcfg.samples_per_step], "agent"
        else:
            chosen = agents[:self.tcfg.samples_per_step] + designers[:cap]
            if not chosen and designers:  # a designer-only buffer, forced: up to the cap
                chosen = designers[:max(1, cap)]
        taken = {id(s) for s in chosen}
        self.pending = [s for s in self.pending if id(s) not in taken]
        chosen.sort(key=lambda s: (s.seq, s.row))
        dropped, self.dropped = self.dropped, Counter()
        return StepPlan(chosen, dropped)

    def done(self, samples: list[TrainSample]) -> None:
        """The step's samples are trained into the weights."""
        by_seq: dict[int, list[int]] = {}
        for s in samples:
            by_seq.setdefault(s.seq, []).append(s.row)
        for seq, rows in by_seq.items():
            self.batches.mark(seq, self._rows(seq), rows)

    def _rows(self, seq: int) -> int:
        return self.batches.open[seq][0] if seq in self.batches.open else 0

    def _drop(self, version: int) -> None:
        keep: list[TrainSample] = []
        gone: list[tuple[TrainSample, str]] = []
        for s in self.pending:
            if version - s.policy_version > self.tcfg.max_staleness:
                gone.append((s, "stale"))
            else:
                keep.append(s)
        limit = 2 * self.designer_cap
        designers = [s for s in keep if s.role == "designer"]
        if len(designers) > limit:
            over = {id(s) for s in designers[:len(designers) - limit]}  # the oldest go
            gone += [(s, "designer_cap") for s in keep if id(s) in over]
            keep = [s for s in keep if id(s) not in over]
        self.pending = keep
        for s, reason in gone:
            self.dropped[reason] += 1
            self.batches.mark(s.seq, self._rows(s.seq), [s.row])
