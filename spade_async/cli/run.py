"""`spade run`: the self-play daemon, wired from the config and driven until a signal or its
iteration bound, then drained."""

from __future__ import annotations

from pathlib import Path

import anyio
import typer

from spade_async.cli.common import ConfigOpt, check_endpoint_secrets, config_or_exit, fail


def run_daemon(
    config: Path = ConfigOpt,
    max_iterations: int = typer.Option(None, "--max-iterations", min=1,
                                       help="stop after N documents went through every stage"),
) -> None:
    """The self-play daemon: designer, sandbox, memory, episodes, regret, batches to the spool.
    SIGTERM/SIGINT finish the documents in flight (daemon.drain_timeout_s), then stop."""
    import signal

    from spade_async.core.config import checkpoint_dir, run_dir
    from spade_async.core.logs import get_logger
    from spade_async.core.spool.batch import SpoolError
    from spade_async.core.spool.files import FileSpool
    from spade_async.corpus.sampler import CorpusSampler
    from spade_async.inference.chat_tokens import ChatTokens
    from spade_async.inference.pool import EndpointPool
    from spade_async.inference.roles import RoleCapabilityError, check_roles
    from spade_async.loop.daemon import Daemon
    from spade_async.memory.port import open_memory
    from spade_async.sandbox.isolation import SandboxUnavailable
    from spade_async.sandbox.placement import make_sandbox

    cfg = config_or_exit(config)
    check_endpoint_secrets(cfg)
    log = get_logger("cli")
    data = cfg.paths.data_dir
    rdir = run_dir(cfg)
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "config.resolved.json").write_text(cfg.model_dump_json(indent=2))
    tokenizer = cfg.model.tokenizer or checkpoint_dir(cfg)
    if not (Path(tokenizer) / "tokenizer_config.json").is_file():
        raise fail(f"no tokenizer at {tokenizer}: run `spade model prepare` or set "
                   "model.tokenizer", 2)

    async def main() -> None:
        chat = await anyio.to_thread.run_sync(ChatTokens.from_pretrained, tokenizer)
        sampler = CorpusSampler.from_config(cfg.corpus, data / "corpus-state.json",
                                            autocommit=False)
        with FileSpool(data / "spool", writer=True) as spool:
            async with EndpointPool(cfg.endpoints, cfg.pool) as pool, \
                    open_memory(cfg) as memory, make_sandbox(cfg.sandbox) as sandbox, \
                    anyio.create_task_group() as tg:
                await tg.start(pool.run)
                roles = ("agent",) if cfg.daemon.mode == "fixed" else ("agent", "designer")
                check_roles(cfg, pool, roles + (("eval",) if cfg.eval.every_versions else ()))
                daemon = Daemon(cfg, pool=pool, sandbox=sandbox, memory=memory, spool=spool,
                                corpus=sampler, chat=chat, run_dir=rdir)

                async def on_signals() -> None:
                    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                        async for sig in signals:
                            if daemon.stop_requested.is_set():
                                log.warning("second_signal_cancelling", signal=sig.name)
                                tg.cancel_scope.cancel()
                                return
                            daemon.stop(f"signal {sig.name}")

                async def deadline() -> None:
                    # A signal or a bounded run's end asks for the drain; it gets this long.
                    await daemon.stop_requested.wait()
                    log.info("draining", reason=daemon.stop_reason,
                             timeout_s=cfg.daemon.drain_timeout_s)
                    await anyio.sleep(cfg.daemon.drain_timeout_s)
                    log.warning("drain_deadline_passed")
                    daemon.cut_drain()
                    if daemon.final_eval and cfg.eval.every_versions:
                        # the version it stopped on is being evaluated (a budget stop)
                        await anyio.sleep(cfg.experiment.final_eval_timeout_s)
                        log.warning("final_eval_deadline_passed")
                    tg.cancel_scope.cancel()

                tg.start_soon(on_signals)
                tg.start_soon(deadline)
                await daemon.run(max_iterations)
                tg.cancel_scope.cancel()

    try:
        anyio.run(main)
    except SandboxUnavailable as exc:
        raise fail(str(exc), 2) from None
    except SpoolError as exc:
        raise fail(str(exc), 2) from None
    except Exception as exc:  # a bug: fail fast, with the traceback and then one line saying so
        import traceback

        leaf = _first_leaf(exc)
        if isinstance(leaf, RoleCapabilityError):  # a config the servers cannot serve
            log.error("roles_unservable", error=str(leaf))
            for line in str(leaf).splitlines():
                typer.echo(f"error: {line}", err=True)
            raise typer.Exit(2) from None
        traceback.print_exception(exc)
        log.error("daemon_failed", error=f"{type(leaf).__name__}: {leaf}")
        raise fail(f"the daemon failed: {type(leaf).__name__}: {leaf}") from None


def _first_leaf(exc: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups: what went wrong."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
