"""The training loop: claim spool batches into the sample buffer, take an optimizer step
whenever it holds one step's samples, checkpoint, publish. One readable loop; rank 0 decides
what happens next (claim batch N, step, wait, stop) and every rank follows.

  claim (all ranks read the same immutable batch file; trainer/buffer.py selects by staleness
  and role, skipping rows a checkpoint already holds) ... until `samples_per_step` agent
  samples wait -> one step (trainer/step.py: pack -> split across ranks -> micro-batches ->
  forward/backward -> clip -> AdamW step) -> its samples are done
Every `publish_every_steps` steps: export version N (trainer/export.py: collective gather,
rank 0 writes `weights/vN` atomically) -> rank 0 pushes vN to every endpoint and writes
`current.json` (naming the checkpoint lineage). Every `checkpoint_every_steps` steps or
`checkpoint_every_minutes`, and at a clean stop, a checkpoint; a publish does not force one (a
20 MB LoRA checkpoint a step is 1.4 GB an hour of writes on the embedded default). A restart
whose checkpoint is behind the published version (same lineage) trains the steps after the
checkpoint again from the same unacknowledged batches and does not publish those versions
again; one whose current.json is behind its checkpoint pushes that version again from disk.
The spool is acknowledged only up to the last batch a committed checkpoint holds wholly; it is
marked taken (the daemon's back-pressure) as soon as a batch is claimed.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import torch

from spade_async.core.config import SpadeConfig, checkpoint_dir
from spade_async.core.config.trainer import TrainerConfig, trainer_root
from spade_async.core.logs import get_logger
from spade_async.core.policy import current_version, read_current, version_dir, weights_dir
from spade_async.core.rolling import Retention, rolling
from spade_async.core.spool.batch import Batch, SpoolError
from spade_async.core.spool.files import FileSpool
from trainer.buffer import OpenBatches, SampleBuffer, StepPlan
from trainer.checkpoint import Checkpointer, TrainerState
from trainer.export import export_version
from trainer.parallel import Dist, broadcast_int
from trainer.publish import (
    Publisher,
    PublishError,
    artifact_kind,
    nccl_group_swap,
    publishes_files,
)
from trainer.step import StepRunner

log = get_logger("trainer")

# Rank 0's decisions, broadcast to every rank: a positive number claims that batch.
STOP, WAIT, STEP, STEP_NOW = -1, 0, -2, -3  # STEP_NOW: whatever the buffer holds


def base_model_dir(cfg: SpadeConfig, tcfg: TrainerConfig) -> Path:
    return (tcfg.base_model or checkpoint_dir(cfg)).resolve()


class StepInterrupted(Exception):
    """Raised by the signal handler into a step that may be dropped (Trainer.interruptible)."""


class Trainer:
    def __init__(self, cfg: SpadeConfig, tcfg: TrainerConfig, d: Dist, *,
                 max_steps: int | None = None, exit_when_idle_s: float | None = None) -> None:
        self.cfg, self.tcfg, self.d = cfg, tcfg, d
        self.max_steps, self.exit_when_idle_s = max_steps, exit_when_idle_s
        self.root = trainer_root(cfg, tcfg)
        self.base_dir = base_model_dir(cfg, tcfg)
        self.weights = weights_dir(cfg.paths.data_dir)
        self.publishing = tcfg.publish_every_steps > 0
        self.kind = artifact_kind(cfg, tcfg) if self.publishing else None
        # weights/vN on disk: not when every publishing endpoint takes them over NCCL
        self._files = not self.publishing or publishes_files(cfg)
        self.stop_requested = False
        # True while a step may be abandoned at once on SIGTERM/SIGINT: one rank, and the
        # weights not yet changed by it, so the stop checkpoints the steps before it and its
        # samples are trained on the next start. See launcher.main.
        self.interruptible = False
        self.pending: tuple[int, Path] | None = None  # a version not yet served everywhere
        self.next_publish_try = 0.0
        self.next_serve_check = 0.0  # when to check that the endpoints still serve our version
        self._batch: Batch | None = None

    # ---- the loop ------------------------------------------------------------------------------

    def run(self) -> TrainerState:
        d, tcfg = self.d, self.tcfg
        if d.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            self.weights.mkdir(parents=True, exist_ok=True)
        self.runner = StepRunner(tcfg, d, self.base_dir, model_dtype=self.cfg.model.dtype)
        if d.is_main:
            log.info("trainer_precision", **self.runner.precision.as_dict())
        self.ckpt = Checkpointer(self.root, d, lora=self.runner.lora, keep=tcfg.keep_checkpoints,
                                 keep_every_s=tcfg.keep_checkpoint_every_hours * 3600.0)
        self.state = self.ckpt.load(self.runner.model, self.runner.optim)
        self.batches = OpenBatches.from_json(self.state.last_seq, self.state.open)
        self.buffer = SampleBuffer(tcfg, self.runner.role_weights, self.batches)
        self._dirty = False  # claimed, trained or dropped since the last checkpoint
        self._last_checkpoint = (self.state.step, time.monotonic())
        self.version = self.state.step // tcfg.publish_every_steps if self.publishing else 0
        self.spool = FileSpool(self.cfg.paths.data_dir / "spool")
        self._metrics = rolling(self.root / "metrics.jsonl", Retention.of(self.cfg.retention))
        with contextlib.ExitStack() as stack:
            self.publisher = None
            if self.publishing and d.is_main:
                self.publisher = stack.enter_context(Publisher(self.cfg, tcfg,
                                                               **self._transfers()))
                self.publisher.lineage = self.ckpt.lineage
            self._resume_publish()
            self._generation(True)  # a server a crashed trainer left paused generates again
            log.info("trainer_started", rank=d.rank, world_size=d.world_size, mode=tcfg.mode,
                     parallel=tcfg.parallel, backend=d.backend, step=self.state.step,
                     last_seq=self.state.last_seq, version=self.version,
                     # how this host is shared (README "The CPU shared"): say which runs
                     phases=tcfg.phases, swap=self.kind, torch_threads=torch.get_num_threads(),
                     samples_per_step=tcfg.samples_per_step, lr=tcfg.lr,
                     lora_targets=tcfg.lora_targets if tcfg.mode == "lora" else None)
            idle_since = time.monotonic()
            while True:
                decision = self._decide(idle_since) if d.is_main else WAIT
                decision = broadcast_int(decision, d)
                if decision == STOP:
                    break
                if decision == WAIT:
                    continue
                idle_since = time.monotonic()
                if decision > 0:
                    self.buffer.claim(self._claim(decision), self.version)
                    self._dirty = True
                    if d.is_main:  # the daemon's back-pressure reads it
                        self.spool.mark_taken(decision)
                    continue
                plan = self.buffer.take(self.version, force=decision == STEP_NOW)
                if plan is None:
                    continue
                try:
                    self._train(plan)
                except StepInterrupted:
                    self.runner.optim.zero_grad(set_to_none=True)
                    log.info("trainer_step_abandoned", step=self.state.step,
                             samples=len(plan.samples),
                             note="not acknowledged: trained again on restart")
                    if self._dirty:  # the steps before it are kept (the weights are theirs)
                        self._checkpoint()
                    return self.state
            if self._dirty:
                self._checkpoint()  # a clean stop keeps everything it consumed
        log.info("trainer_stopped", rank=d.rank, step=self.state.step,
                 last_seq=self.state.last_seq, version=self.version)
        return self.state

    def _decide(self, idle_since: float) -> int:
        """Rank 0: claim the next batch (its seq), STEP, STEP_NOW, WAIT or STOP."""
        if self.pending is not None and time.monotonic() >= self.next_publish_try:
            self._publish(*self.pending, started=time.perf_counter())
        elif (self.publisher is not None and self.tcfg.serve_check_s
              and time.monotonic() >= self.next_serve_check):
            self.next_serve_check = time.monotonic() + self.tcfg.serve_check_s
            self.publisher.restore_lost(self.version)
        if self.stop_requested or (self.max_steps is not None
                                   and self.state.step >= self.max_steps):
            return STOP
        if self.buffer.ready():
            return STEP
        if self.buffer.wants_more():
            batch = self.spool.wait_next(self.buffer.claimed_seq,
                                         timeout_s=self.tcfg.poll_interval_s,
                                         poll_interval_s=min(0.05, self.tcfg.poll_interval_s))
            if self.stop_requested:
                return STOP  # asked while waiting: the batch stays for the next run
            if batch is not None:
                self._batch = batch
                return batch.seq
        else:
            time.sleep(self.tcfg.poll_interval_s)
        idle = (self.exit_when_idle_s is not None
                and time.monotonic() - idle_since > self.exit_when_idle_s)
        if self.buffer.pending and (idle or self.buffer.waited_s() > self.tcfg.step_wait_s):
            return STEP_NOW  # the oldest sample has waited long enough (or leaving): train it
        if idle:
            log.info("trainer_idle_exit", idle_s=self.exit_when_idle_s)
            return STOP
        return WAIT

    def _claim(self, seq: int) -> Batch:
        if self._batch is not None and self._batch.seq == seq:
            batch, self._batch = self._batch, None
            return batch
        # Other ranks read the same file; a shared filesystem may show it a little later.
        batch = self.spool.wait_next(seq - 1, timeout_s=60)
        if batch is None:
            raise SpoolError(f"rank {self.d.rank}: batch {seq} announced by rank 0 is not "
                             f"visible in {self.spool.dir} after 60 s")
        return batch

    # ---- one step ------------------------------------------------------------------------------

    def _train(self, plan: StepPlan) -> None:
        tcfg, st = self.tcfg, self.state
        for k, v in plan.dropped.items():
            st.dropped[k] = st.dropped.get(k, 0) + v
        if not plan.samples:
            return
        # Until the weights change the step may be dropped on a stop (one rank: the others
        # would wait in a collective): its samples are not done, so the stop's checkpoint
        # leaves them to the next start.
        self.interruptible = self.d.world_size == 1

        def closing() -> None:
            self.interruptible = False

        self._generation(False)
        try:
            if self.interruptible and self.stop_requested:
                raise StepInterrupted
            result = self.runner.step(plan.samples, step_index=st.step, before_update=closing)
        except BaseException:
            self._generation(True)
            raise
        finally:
            self.interruptible = False
        self.buffer.done(plan.samples)
        self._dirty = True
        st.step += 1
        st.samples += result.samples
        st.tokens += int(result.metrics["tokens"])
        step_end = time.perf_counter()
        seqs = [s.seq for s in plan.samples]
        line: dict[str, Any] = {
            "event": "step", "step": st.step, "seqs": [min(seqs), max(seqs)],
            "version": self.version, "samples": result.samples,
            "agent_samples": (result.roles or {}).get("agent", 0),
            "designer_samples": (result.roles or {}).get("designer", 0),
            "dropped": dict(plan.dropped),
            "real_tokens": result.real_tokens, "computed_tokens": result.padded_tokens,
            "padded_tokens": result.padded_tokens,
            "padding_ratio": round(result.padded_tokens / max(1, result.real_tokens), 3),
            "micro_batches": result.micro_batches,
            "grad_norm": result.grad_norm, "lr": result.lr,
            "step_s": round(result.seconds, 4),
            "tokens_per_s": round(result.metrics["tokens"] / result.seconds, 1),
            "seq_tokens_per_s": round(result.real_tokens / result.seconds, 1),
            "kl_base": None, "logprob_abs_diff_base": None,
            **{k: (round(v, 6) if isinstance(v, float) else v)
               for k, v in result.metrics.items()},
            **{k: round(v, 6) for k, v in (result.base or {}).items()},
        }
        publish = self.publishing and st.step % tcfg.publish_every_steps == 0
        path = None
        if publish and st.step // tcfg.publish_every_steps <= self.version:
            # retrained after a restart behind the published version: that version is served
            # already (from these samples), so it is not made or pushed again
            line["publish"] = {"version": st.step // tcfg.publish_every_steps, "ok": True,
                               "skipped": f"published before the restart (v{self.version})"}
            publish = False
        if publish:
            version = st.step // tcfg.publish_every_steps
            path = self._export(version)
        if self._checkpoint_due():
            self._checkpoint()
        if publish:
            assert path is not None
            self.version = version
            if self.d.is_main:
                line["publish"] = self._publish(version, path, started=step_end)
        self._generation(True)
        line["totals"] = {"trained": st.samples, "dropped": dict(sorted(st.dropped.items()))}
        line["buffered"] = len(self.buffer.pending)
        self._log(line)

    def _generation(self, on: bool) -> None:
        """alternate phases: the servers generate while the trainer waits, and wait while
        it trains and publishes (rank 0 switches them)."""
        if self.tcfg.phases == "alternate" and self.publisher is not None:
            self.publisher.generation(on)

    def _checkpoint_due(self) -> bool:
        """`checkpoint_every_steps` steps or `checkpoint_every_minutes` since the last one.
        A publish does not force one: version N's weights are on disk (weights/vN), and a
        restart from an older checkpoint trains the steps after it again."""
        steps, at = self._last_checkpoint
        minutes = self.tcfg.checkpoint_every_minutes
        return (self.state.step - steps >= self.tcfg.checkpoint_every_steps
                or (minutes > 0 and time.monotonic() - at >= minutes * 60.0))

    def _checkpoint(self) -> None:
        st = self.state
        st.last_seq, st.open = self.batches.last_seq, self.batches.as_json()
        self.ckpt.save(self.runner.model, self.runner.optim, st)
        self._dirty = False
        self._last_checkpoint = (st.step, time.monotonic())
        if self.d.is_main:
            # Only now may the spool let go of what this checkpoint holds.
            self.spool.ack(self.state.last_seq)
            self.spool.gc()

    # ---- versions ------------------------------------------------------------------------------

    def _transfers(self) -> dict[str, Any]:
        """The Publisher's NCCL arguments: the one transfer of the group over every
        vllm-nccl endpoint, built on this rank's device, and the vLLM version check (both only
        where such endpoints exist)."""
        group = nccl_group_swap(self.cfg)
        if group is None:
            return {}
        from trainer.nccl_transfer import (
            NcclWeightTransfer,
            check_vllm_version,
            resolve_master_address,
        )

        def make(endpoints: list[Any]) -> NcclWeightTransfer:
            # one rendezvous address, reachable from every server (checked against each)
            address = {resolve_master_address(group.master_address, e.name, e.base_url)
                       for e in endpoints}.pop()
            return NcclWeightTransfer(self.d.device, master_address=address,
                                      port_range=group.port_range,
                                      bucket_bytes=group.bucket_bytes,
                                      bucket_buffers=group.bucket_buffers)

        return {"transfer": make, "server_version_check": check_vllm_version}

    def _export(self, version: int) -> Path:
        transfer = (self.publisher if self.publisher is not None
                    and self.publisher.transfer is not None else None)
        return export_version(self.runner, self.kind or "adapter", self.cfg.paths.data_dir, version,
                              transfer=transfer, files=self._files)

    def _resume_publish(self) -> None:
        """After a restart: push the checkpoint's version if current.json is behind it."""
        if not self.publishing:
            return
        published = current_version(self.cfg.paths.data_dir)  # every rank: one shared decision
        if published > self.version and self._own_version():
            # Published after this checkpoint, by this lineage: the steps since are trained
            # again (from the same unacknowledged batches) and the versions up to `published`
            # are not published again; the servers keep serving it.
            log.info("resumed_behind_published", checkpoint_version=self.version,
                     published=published, step=self.state.step)
            self.version = published
            if self.d.is_main and self.publisher is not None:
                self.publisher.adopt_server_state(self.version)
            return
        if published > self.version:
            raise RuntimeError(
                f"{self.weights / 'current.json'} names version {published}, but the latest "
                f"checkpoint in {self.ckpt.dir} is at version {self.version}: those weights "
                "come from another run; remove that file (and the run's weights) or restore "
                "its checkpoints")
        if published == self.version or self.version == 0:
            if not self._files and self.version > 0:
                self._export(self.version)  # the group's transfer holds it, for restore_lost
            if self.d.is_main and self.publisher is not None:
                self.publisher.adopt_server_state(self.version)
            return
        path = version_dir(self.cfg.paths.data_dir, self.version)
        # No directory cannot happen when the export precedes the checkpoint, unless only NCCL
        # publishes: then nothing is on disk and the export hands the weights to the group.
        if not path.is_dir() or not self._files:
            path = self._export(self.version)
        if self.d.is_main and self.publisher is not None:
            self.publisher.adopt_server_state(self.version)
            log.info("republishing_after_restart", version=self.version, published=published)
            self._publish(self.version, path, started=time.perf_counter())

    def _own_version(self) -> bool:
        """current.json names a version this checkpoint lineage published (not another run's)."""
        current = read_current(self.cfg.paths.data_dir) or {}
        return current.get("lineage") == self.ckpt.lineage

    def _publish(self, version: int, path: Path, *, started: float) -> dict[str, Any]:
        assert self.publisher is not None
        try:
            report = self.publisher.publish(version, path, started=started)
        except PublishError as exc:
            self.pending = (version, path)
            self.next_publish_try = time.monotonic() + self.tcfg.publish_retry_s
            log.error("publish_failed", version=version, failures=exc.failures,
                      retry_in_s=self.tcfg.publish_retry_s)
            return {"version": version, "ok": False, "failures": exc.failures}
        self.pending = None
        return {"version": version, "ok": True, "model": report.model,
                "seconds": round(report.seconds, 4), "swap_s": report.swap_seconds,
                "attempts": report.attempts}

    def _log(self, line: dict[str, Any]) -> None:
        if not self.d.is_main:
            return
        line["time"] = time.time()
        self._metrics.append(line)
        log.info(f"train_{line['event']}", **{k: v for k, v in line.items()
                                                if k not in ("event", "time")})
