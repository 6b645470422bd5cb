"""One daemon run on a test's config: its endpoints, a real sandbox, a file spool and run
records under one directory, the memory the test hands in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spade_async.core.config import SpadeConfig
from spade_async.core.spool.files import FileSpool
from spade_async.corpus.sampler import CorpusSampler
from spade_async.inference.chat_tokens import ChatTokens
from spade_async.inference.pool import EndpointPool
from spade_async.loop.daemon import Daemon
from spade_async.loop.ports import MemoryPort
from spade_async.sandbox.placement import make_sandbox


async def run_daemon(cfg: SpadeConfig, chat: ChatTokens, memory: MemoryPort, root: Path, *,
                     iterations: int) -> tuple[Daemon, FileSpool]:
    """`iterations` of the daemon; its batches in root/spool, its records in root/run."""
    spool = FileSpool(root / "spool", writer=True)
    sampler = CorpusSampler.from_config(cfg.corpus, root / "corpus.json", autocommit=False)
    async with EndpointPool(cfg.endpoints, cfg.pool) as pool, make_sandbox(cfg.sandbox) as sb:
        daemon = Daemon(cfg, pool=pool, sandbox=sb, memory=memory, spool=spool, corpus=sampler,
                        chat=chat, run_dir=root / "run")
        await daemon.run(max_iterations=iterations)
    return daemon, spool


def run_records(root: Path, name: str) -> list[dict[str, Any]]:
    """root/run/<name>.jsonl (designs, episodes, plays) as dicts."""
    path = root / "run" / f"{name}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x]
