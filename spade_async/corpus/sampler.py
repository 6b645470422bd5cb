"""The seeded, restartable chunk sampler that feeds the designer (DESIGN §2): chunks of a source
in a shuffled order, epoch after epoch, with its cursor persisted atomically so a restarted
daemon never resamples a chunk it already used."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from spade_async.core.config.corpus import CorpusConfig
from spade_async.core.io import atomic_write_json
from spade_async.core.logs import get_logger
from spade_async.corpus.chunking import chunk_document, chunk_text
from spade_async.corpus.documents import Chunk, CorpusError, CorpusSource, CorpusStateError
from spade_async.corpus.sources import make_source

log = get_logger("corpus")


_STATE_VERSION = 1


def _shuffled(items: Iterable[Chunk], rng: random.Random, buffer_size: int) -> Iterator[Chunk]:
    """A seeded shuffle buffer: uniform when the whole stream fits into the buffer."""
    buffer: list[Chunk] = []
    for item in items:
        if len(buffer) < buffer_size:
            buffer.append(item)
            continue
        i = rng.randrange(buffer_size)
        yield buffer[i]
        buffer[i] = item
    rng.shuffle(buffer)
    yield from buffer


class CorpusSampler(Iterator[Chunk]):
    """Chunks of `source` in a seeded shuffled order, epoch after epoch, restartable.

    The cursor (epoch, position in the epoch, total consumed, plus what identifies the stream:
    source name, seed, chunk sizes, buffer size) is written atomically to `state_path` after
    every `next()` when `autocommit` (a chunk counts as used once handed out), or on `commit()`
    (a chunk counts as used once the caller says so). A restart regenerates the same stream and
    skips what was consumed. Not for concurrent use by two processes on one state file.

    `commit(chunk)` marks one chunk as used, whatever else is still out: the state keeps the
    point up to which every chunk is used plus the used ones after it (`done_ahead`), so after
    a crash exactly the chunks handed out and never committed come again, in stream order, and
    the ones finished out of order do not. `commit()` with no chunk marks everything handed out.
    """

    def __init__(
        self,
        source: CorpusSource,
        state_path: str | Path,
        *,
        seed: int = 0,
        max_chars: int = 2000,
        min_chars: int = 200,
        shuffle_buffer: int = 10_000,
        autocommit: bool = True,
    ) -> None:
        if shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be >= 1, got {shuffle_buffer}")
        chunk_text("", max_chars, min_chars)  # validates the sizes
        self.source = source
        self.state_path = Path(state_path)
        self.seed = seed
        self.max_chars = max_chars
        self.min_chars = min_chars
        self.shuffle_buffer = shuffle_buffer
        self.autocommit = autocommit
        self._lock = threading.Lock()
        self._stream: Iterator[Chunk] | None = None
        self._epoch = 0
        self._position = 0  # chunks consumed in the current epoch
        self._consumed = 0  # over all epochs
        # the committed point: every chunk before stream index `_committed` is used; it sits at
        # `_committed_position` in epoch `_committed_epoch`. `_done_ahead`: used ones after it.
        # `_epoch_starts`: the stream index where each epoch since the committed one began.
        self._committed = 0
        self._committed_epoch = 0
        self._committed_position = 0
        self._done_ahead: set[int] = set()
        self._epoch_starts: dict[int, int] = {}
        self._load_state()

    @classmethod
    def from_config(
        cls, cfg: CorpusConfig, state_path: str | Path, *, autocommit: bool = True
    ) -> CorpusSampler:
        return cls(
            make_source(cfg),
            state_path,
            seed=cfg.seed,
            max_chars=cfg.max_chars,
            min_chars=cfg.min_chars,
            shuffle_buffer=cfg.shuffle_buffer,
            autocommit=autocommit,
        )

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def consumed(self) -> int:
        return self._consumed

    def _identity(self) -> dict[str, Any]:
        return {
            "source": self.source.name,
            "seed": self.seed,
            "max_chars": self.max_chars,
            "min_chars": self.min_chars,
            "shuffle_buffer": self.shuffle_buffer,
        }

    def _load_state(self) -> None:
        try:
            raw = self.state_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        try:
            state = json.loads(raw)
            version = state["version"]
            if version != _STATE_VERSION:
                raise CorpusStateError(
                    f"{self.state_path}: sampler state version {version}, expected {_STATE_VERSION}"
                )
            ours = self._identity()
            theirs = {key: state[key] for key in ours}
            epoch, position, consumed = state["epoch"], state["position"], state["consumed"]
            done_ahead = {int(i) for i in state.get("done_ahead", [])}
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise CorpusStateError(f"{self.state_path}: unreadable sampler state: {exc!r}") from None
        if theirs != ours:
            raise CorpusStateError(
                f"{self.state_path} belongs to source {theirs['source']!r} with seed "
                f"{theirs['seed']} (max_chars={theirs['max_chars']}, min_chars="
                f"{theirs['min_chars']}, shuffle_buffer={theirs['shuffle_buffer']}), but this "
                f"sampler reads source {ours['source']!r} with seed {ours['seed']} (max_chars="
                f"{ours['max_chars']}, min_chars={ours['min_chars']}, shuffle_buffer="
                f"{ours['shuffle_buffer']}); remove the file to start over"
            )
        self._epoch, self._position, self._consumed = int(epoch), int(position), int(consumed)
        self._committed, self._committed_epoch = self._consumed, self._epoch
        self._committed_position = self._position
        self._done_ahead = {i for i in done_ahead if i >= self._consumed}
        self._epoch_starts = {self._epoch: self._consumed - self._position}

    def commit(self, chunk: Chunk | None = None) -> None:
        """Persist that `chunk` (one this sampler handed out) is used; with None, every chunk
        handed out so far."""
        with self._lock:
            if chunk is None:
                self._done_ahead.clear()
                self._committed, self._committed_epoch = self._consumed, self._epoch
                self._committed_position = self._position
                self._epoch_starts = {self._epoch: self._consumed - self._position}
            else:
                if not 0 <= chunk.seq < self._consumed:
                    raise ValueError(f"chunk {chunk.chunk_id} (stream index {chunk.seq}) was "
                                     "not handed out by this sampler")
                if chunk.seq >= self._committed:
                    self._done_ahead.add(chunk.seq)
                    self._advance_committed()
            self._write_state()

    def _advance_committed(self) -> None:
        while self._committed in self._done_ahead:
            self._done_ahead.discard(self._committed)
            self._committed += 1
            self._committed_position += 1
            following = self._epoch_starts.get(self._committed_epoch + 1)
            if following is not None and self._committed >= following:
                # the committed point entered the next epoch
                self._epoch_starts.pop(self._committed_epoch, None)
                self._committed_epoch += 1
                self._committed_position = self._committed - following

    def _commit_locked(self) -> None:
        """autocommit: everything handed out is used."""
        self._committed, self._committed_epoch = self._consumed, self._epoch
        self._committed_position = self._position
        self._epoch_starts = {self._epoch: self._consumed - self._position}
        self._write_state()

    def _write_state(self) -> None:
        state = {
            "version": _STATE_VERSION,
            **self._identity(),
            "epoch": self._committed_epoch,
            "position": self._committed_position,
            "consumed": self._committed,
            "done_ahead": sorted(self._done_ahead),
        }
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.state_path, state, sort_keys=True)

    def _epoch_stream(self, epoch: int) -> Iterator[Chunk]:
        rng = random.Random(f"{self.seed}/{epoch}")
        chunks = (
            chunk
            for doc in self.source.iter_documents()
            for chunk in chunk_document(doc, self.max_chars, self.min_chars)
        )
        return _shuffled(chunks, rng, self.shuffle_buffer)

    def _open_epoch(self, skip: int) -> Iterator[Chunk]:
        stream = self._epoch_stream(self._epoch)
        for skipped in range(skip):
            if next(stream, None) is None:
                raise CorpusStateError(
                    f"{self.state_path}: cursor at chunk {skip} of epoch {self._epoch}, but "
                    f"source {self.source.name!r} now has only {skipped} chunks"
                )
        return stream

    def __iter__(self) -> CorpusSampler:
        return self

    def __next__(self) -> Chunk:
        with self._lock:
            if self._stream is None:
                if self._position:
                    log.info("corpus sampler resumes", source=self.source.name,
                             epoch=self._epoch, position=self._position,
                             done_ahead=len(self._done_ahead))
                self._stream = self._open_epoch(self._position)
            while True:
                chunk = next(self._stream, None)
                if chunk is None:
                    if self._position == 0:
                        raise CorpusError(
                            f"source {self.source.name!r} yields no chunk of at least "
                            f"{self.min_chars} characters"
                        )
                    log.info("corpus epoch done", source=self.source.name, epoch=self._epoch,
                             chunks=self._position)
                    self._close_stream()
                    self._epoch += 1
                    self._position = 0
                    self._epoch_starts[self._epoch] = self._consumed
                    self._stream = self._open_epoch(0)
                    chunk = next(self._stream, None)
                    if chunk is None:
                        raise CorpusError(f"source {self.source.name!r} became empty")
                seq = self._consumed
                self._position += 1
                self._consumed += 1
                if seq not in self._done_ahead:
                    break
                # used before a restart (finished while an earlier one was still out): skipped
            if self.autocommit:
                self._commit_locked()
            return replace(chunk, seq=seq)

    def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        close = getattr(stream, "close", None)
        if close is not None:
            close()  # runs the source generator's finally (StdlibDocs stops its child)

    def close(self) -> None:
        with self._lock:
            self._close_stream()

    def __enter__(self) -> CorpusSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
