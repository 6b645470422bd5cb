"""`spade-train` / `python -m trainer`: the trainer process, under torchrun or alone.

    torchrun --standalone --nproc-per-node 2 -m trainer --config configs/embedded.toml
    python -m trainer --config configs/embedded.toml            # one process, gloo or NCCL

The only module that knows torchrun (through the environment it sets: RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR). SIGTERM / SIGINT ask the loop to stop after the current batch, with a
final checkpoint; on one rank, a step with nothing unsaved before it is abandoned at once instead
(its batch stays unacknowledged, so it is trained on restart). The process group is destroyed on
every way out.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from spade_async.core.config import ConfigError, load_config
from spade_async.core.config.trainer import TrainerConfigError, load_trainer_config
from spade_async.core.logs import configure_logging, get_logger

log = get_logger("trainer.launcher")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="spade-train", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", "-c", type=Path, default=Path("configs/embedded.toml"),
                    help="the SPADE TOML config (endpoints, data_dir, model, trainer)")
    ap.add_argument("--trainer-config", type=Path, default=None,
                    help="TOML with a [trainer] table; replaces the config's trainer section")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="stop once the optimizer has taken this many steps (in total)")
    ap.add_argument("--exit-when-idle", type=float, default=None, metavar="SECONDS",
                    help="stop when no new batch arrives for this long (after a step on "
                    "whatever samples it holds)")
    ap.add_argument("--log-level", default="info")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(args.log_level)
    try:
        cfg = load_config(args.config)
        tcfg = (load_trainer_config(args.trainer_config) if args.trainer_config
                else cfg.trainer)
    except (ConfigError, TrainerConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    # Heavy imports after the config is known to be good.
    from trainer.loop import StepInterrupted, Trainer
    from trainer.nccl_transfer import NcclTransferError
    from trainer.parallel import process_group
    from trainer.publish import PublishConfigError

    # Rank 0 may spend up to every publish attempt inside one step while the others wait in
    # the next collective; the group's timeout must outlast that.
    timeout_s = max(1800.0, tcfg.publish_attempts * tcfg.publish_timeout_s + 600.0)
    try:
        with process_group(tcfg.backend, timeout_s=timeout_s) as d:
            trainer = Trainer(cfg, tcfg, d, max_steps=args.max_steps,
                              exit_when_idle_s=args.exit_when_idle)

            def stop(signum: int, _frame: object) -> None:
                log.info("trainer_stop_requested", signal=signal.Signals(signum).name,
                         abandon_step=trainer.interruptible)
                trainer.stop_requested = True
                signal.signal(signum, signal.SIG_DFL)  # a second signal ends it at once
                if trainer.interruptible:  # a CPU step takes longer than honcho waits
                    raise StepInterrupted

            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, stop)
            trainer.run()
    except (PublishConfigError, NcclTransferError) as exc:  # endpoints this trainer cannot
        print(f"error: {exc}", file=sys.stderr)             # publish to: one line, exit 2
        return 2
    return 0
