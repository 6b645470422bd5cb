"""Corpus sources and the seeded, restartable chunk sampler that feeds the designer (DESIGN §2).

A source yields whole `Document`s in a deterministic order; `chunk_text` cuts them into
`Chunk`s of bounded size; `CorpusSampler` shuffles chunks with a seeded buffer and persists its
cursor atomically so a restarted daemon never resamples a chunk it already used.

Everything here is synchronous and may block (imports in a subprocess, file and network reads):
the daemon calls it off the event loop (`anyio.to_thread.run_sync`). This module must never import
a standard-library module for its docstrings in the daemon's own process (`antigravity` opens a
browser, `this` prints, `tkinter` wants a display): `StdlibDocs` does that in a throwaway child.
"""

from __future__ import annotations

import fnmatch
import gzip
import json
import os
import random
import re
import selectors
import subprocess
import sys
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from spade_async.core.corpus_config import (
    CorpusConfig,
    HFSourceConfig,
    JsonlSourceConfig,
    ParquetSourceConfig,
    StdlibSourceConfig,
    TextDirSourceConfig,
)
from spade_async.core.io import atomic_write_json
from spade_async.core.logs import get_logger

log = get_logger("corpus")


class CorpusError(RuntimeError):
    """A source that cannot be read as configured; the message names the file, row or field."""


class CorpusStateError(CorpusError):
    """A sampler state file that does not belong to this sampler (or cannot be read)."""


@dataclass(frozen=True)
class Document:
    id: str
    source: str
    title: str
    text: str


@dataclass(frozen=True)
class Chunk:
    doc_id: str
    chunk_id: str  # f"{doc_id}#{i}", i counting the chunks kept from that document
    text: str
    title: str
    # where a sampler handed it out: its place in the sampler's stream over all epochs (-1: not
    # from a sampler); `CorpusSampler.commit(chunk)` marks exactly this one as used
    seq: int = field(default=-1, compare=False)


class CorpusSource(ABC):
    """One hook: `iter_documents`, a fresh generator in the same order on every call.

    `name` identifies the source in sampler state files, so it must be stable across restarts
    and different for sources whose documents differ.
    """

    @property
    @abstractmethod
    def name(self) -> str: ...

    @abstractmethod
    def iter_documents(self) -> Iterator[Document]: ...


# --------------------------------------------------------------------------------------------
# Chunking


_PARAGRAPH_BREAK = re.compile(r"(\n\s*\n)")  # a run of blank lines; indentation after it stays
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])(\s+)")
_WHITESPACE = re.compile(r"(\s+)")


def _split_keep(text: str, pattern: re.Pattern[str], first_sep: str) -> list[tuple[str, str]]:
    """(separator before the piece, piece) pairs; the separators are the original whitespace."""
    parts = pattern.split(text)
    pairs = [(first_sep, parts[0])]
    pairs += [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]
    return [(sep, piece) for sep, piece in pairs if piece.strip()]


def _pieces(text: str, max_chars: int) -> Iterator[tuple[str, str]]:
    """Pieces of at most max_chars: paragraphs, else sentences, else words, else hard slices."""
    for para_sep, para in _split_keep(text, _PARAGRAPH_BREAK, "\n\n"):
        if len(para) <= max_chars:
            yield para_sep, para
            continue
        for i, (sent_sep, sent) in enumerate(_split_keep(para, _SENTENCE_BREAK, para_sep)):
            sep = para_sep if i == 0 else sent_sep
            if len(sent) <= max_chars:
                yield sep, sent
                continue
            for j, (word_sep, word) in enumerate(_split_keep(sent, _WHITESPACE, sep)):
                wsep = sep if j == 0 else word_sep
                for k in range(0, len(word), max_chars):
                    yield (wsep if k == 0 else ""), word[k : k + max_chars]


def chunk_text(text: str, max_chars: int = 2000, min_chars: int = 200) -> list[str]:
    """Greedy packing of paragraphs into chunks of at most `max_chars` characters.

    A paragraph longer than `max_chars` falls back to sentence boundaries, a sentence to
    whitespace, a word to a hard cut. Pieces are joined with the whitespace that separated
    them in the text. Chunks shorter than `min_chars` (after stripping) are dropped.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    if not 0 <= min_chars <= max_chars:
        raise ValueError(f"min_chars must lie in [0, max_chars={max_chars}], got {min_chars}")
    chunks: list[str] = []
    current = ""
    for sep, piece in _pieces(text.strip(), max_chars):
        if current and len(current) + len(sep) + len(piece) <= max_chars:
            current += sep + piece
        else:
            if current:
                chunks.append(current)
            current = piece
    if current:
        chunks.append(current)
    return [c for c in chunks if len(c.strip()) >= max(min_chars, 1)]


def chunk_document(doc: Document, max_chars: int = 2000, min_chars: int = 200) -> list[Chunk]:
    return [
        Chunk(doc_id=doc.id, chunk_id=f"{doc.id}#{i}", text=text, title=doc.title)
        for i, text in enumerate(chunk_text(doc.text, max_chars, min_chars))
    ]


# --------------------------------------------------------------------------------------------
# Standard-library docstrings


# fnmatch patterns over dotted module names ('*' also matches dots). Denied for side effects
# at import (a browser, printing, a display, a REPL hook), for test suites (slow, they mutate
# global state), for `__main__` modules (they run a program), and for codec tables (hundreds
# of imports whose docstrings are a line each).
DEFAULT_STDLIB_DENY: tuple[str, ...] = (
    "antigravity",
    "this",
    "__hello__",
    "__phello__*",
    "tkinter",
    "tkinter.*",
    "turtle",
    "turtledemo*",
    "idlelib*",
    "readline",
    "test",
    "test.*",
    "*.test",
    "*.test.*",
    "*.tests",
    "*.tests.*",
    "*.idle_test*",
    "*.__main__",
    "encodings.*",
    "pydoc_data*",
    "lib2to3.pgen2",  # builds grammar pickles on import in some installs
)

# The child's script: a real module, run by path (`-I` keeps its directory off sys.path).
_STDLIB_WORKER = Path(__file__).resolve().with_name("worker.py")


class _ImportWorker:
    """A child interpreter that imports one module per request, restarted after a crash or a
    hang (the module that caused it is skipped, the rest of the walk goes on)."""

    def __init__(self, python: str, timeout_s: float) -> None:
        self._python = python
        self._timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._cwd = tempfile.mkdtemp(prefix="spade-stdlib-")

    def _start(self) -> subprocess.Popen[bytes]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
        self._buffer = b""
        self._proc = subprocess.Popen(
            [self._python, "-I", "-S", "-B", str(_STDLIB_WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=self._cwd,  # a module that writes into its cwd writes into a temp dir
            env=env,
            bufsize=0,
        )
        return self._proc

    def query(self, module: str) -> dict[str, Any] | None:
        """The worker's reply, or None when it crashed or ran past the deadline."""
        proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(module.encode() + b"\n")
            proc.stdin.flush()
        except BrokenPipeError:
            self._kill()
            return None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                if not sel.select(self._timeout_s):
                    log.warning("stdlib import timed out", module=module, timeout_s=self._timeout_s)
                    self._kill()
                    return None
                data = os.read(proc.stdout.fileno(), 1 << 16)
                if not data:
                    log.warning("stdlib import worker died", module=module, rc=proc.wait())
                    self._kill()
                    return None
                self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def _kill(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                if pipe is not None:
                    pipe.close()
        self._proc = None

    def close(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            assert proc.stdin is not None
            try:
                proc.stdin.close()  # EOF ends the worker's loop
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        try:
            for leftover in Path(self._cwd).iterdir():
                if leftover.is_file():
                    leftover.unlink()
            os.rmdir(self._cwd)
        except OSError:
            pass  # a module left a directory behind; it is in the system temp dir


class StdlibDocs(CorpusSource):
    """Docstrings of this interpreter's standard library: one document per module (its own
    docstring, then those of its public classes, their methods, and its functions).

    The default source: it needs no download. Modules are walked in sorted order, packages
    depth-first into their submodules; private modules (`_x`) and `deny` matches are skipped;
    modules are imported in a child interpreter, never in this process.
    """

    def __init__(
        self,
        *,
        min_doc_chars: int = 300,
        include_submodules: bool = True,
        deny: Iterable[str] = DEFAULT_STDLIB_DENY,
        import_timeout_s: float = 30.0,
        python: str | None = None,
    ) -> None:
        self.min_doc_chars = min_doc_chars
        self.include_submodules = include_submodules
        self.deny = tuple(deny)
        self.import_timeout_s = import_timeout_s
        self.python = python or sys.executable
        v = sys.version_info
        # The docs change with the interpreter's version, so the name does too.
        self._name = f"stdlib:py{v.major}.{v.minor}" + ("" if include_submodules else ":top")

    @property
    def name(self) -> str:
        return self._name

    def is_denied(self, module: str) -> bool:
        if any(p.startswith("_") and p != "__future__" for p in module.split(".")):
            return True  # private modules repeat their public face (`_pydecimal`, `_pyio`)
        return any(fnmatch.fnmatchcase(module, pattern) for pattern in self.deny)

    def iter_documents(self) -> Iterator[Document]:
        worker = _ImportWorker(self.python, self.import_timeout_s)
        stack = sorted(sys.stdlib_module_names, reverse=True)  # pop() takes the smallest
        skipped = 0
        try:
            while stack:
                module = stack.pop()
                if self.is_denied(module):
                    continue
                reply = worker.query(module)
                if reply is None or not reply["ok"]:
                    skipped += 1
                    if reply is not None:
                        log.debug("stdlib module skipped", module=module, error=reply["error"])
                    continue
                if self.include_submodules:
                    stack.extend(sorted(reply["children"], reverse=True))
                text = reply["text"]
                if len(text) >= self.min_doc_chars:
                    yield Document(id=f"stdlib:{module}", source=self.name, title=module, text=text)
        finally:
            worker.close()
            log.debug("stdlib walk ended", skipped=skipped)


# --------------------------------------------------------------------------------------------
# File sources


def _field_text(row: dict, field: str, where: str) -> str | None:
    if field not in row:
        raise CorpusError(f"{where}: no field {field!r} (fields: {sorted(row)[:20]})")
    value = row[field]
    if value is None:
        return None
    if not isinstance(value, str):
        raise CorpusError(f"{where}: field {field!r} is {type(value).__name__}, not a string")
    return value


class JsonlSource(CorpusSource):
    """One JSON object per line (`.jsonl` or `.jsonl.gz`). Rows whose text is null are skipped;
    a missing field or a line that is not JSON is an error naming the line."""

    def __init__(
        self,
        path: str | Path,
        text_field: str = "text",
        id_field: str | None = None,
        title_field: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.text_field = text_field
        self.id_field = id_field
        self.title_field = title_field

    @property
    def name(self) -> str:
        return f"jsonl:{self.path.resolve()}:{self.text_field}"

    def iter_documents(self) -> Iterator[Document]:
        if not self.path.is_file():
            raise CorpusError(f"{self.path}: JSONL corpus file not found")
        opener = gzip.open if self.path.suffix == ".gz" else open
        with opener(self.path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{self.path}:{lineno}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise CorpusError(f"{where}: not valid JSON: {exc}") from None
                if not isinstance(row, dict):
                    raise CorpusError(f"{where}: a line must hold a JSON object")
                text = _field_text(row, self.text_field, where)
                if text is None:
                    continue
                if self.id_field:
                    if self.id_field not in row:
                        raise CorpusError(f"{where}: no field {self.id_field!r}")
                    doc_id = str(row[self.id_field])
                else:
                    doc_id = f"{self.path.name}:{lineno}"
                title = _field_text(row, self.title_field, where) if self.title_field else None
                yield Document(id=doc_id, source=self.name, title=title or doc_id, text=text)


class ParquetSource(CorpusSource):
    """A Parquet file, or every `*.parquet` under a directory in sorted order, streamed in
    record batches of `batch_size` rows (only the named columns are read)."""

    def __init__(
        self,
        path: str | Path,
        text_column: str = "text",
        id_column: str | None = None,
        title_column: str | None = None,
        batch_size: int = 1024,
    ) -> None:
        self.path = Path(path)
        self.text_column = text_column
        self.id_column = id_column
        self.title_column = title_column
        self.batch_size = batch_size

    @property
    def name(self) -> str:
        return f"parquet:{self.path.resolve()}:{self.text_column}"

    def _files(self) -> list[Path]:
        if self.path.is_file():
            return [self.path]
        if self.path.is_dir():
            files = sorted(p for p in self.path.rglob("*.parquet") if p.is_file())
            if files:
                return files
        raise CorpusError(f"{self.path}: no Parquet file there")

    def iter_documents(self) -> Iterator[Document]:
        import pyarrow.parquet as pq  # only this source needs pyarrow

        columns = [c for c in (self.text_column, self.id_column, self.title_column) if c]
        for file in self._files():
            pf = pq.ParquetFile(file)
            try:
                present = set(pf.schema_arrow.names)
                missing = [c for c in columns if c not in present]
                if missing:
                    raise CorpusError(
                        f"{file}: no column {missing[0]!r} (columns: {sorted(present)[:20]})"
                    )
                row = 0
                for batch in pf.iter_batches(batch_size=self.batch_size, columns=columns):
                    data = batch.to_pydict()
                    for i in range(batch.num_rows):
                        text = data[self.text_column][i]
                        where = f"{file} row {row + i}"
                        if text is not None and not isinstance(text, str):
                            raise CorpusError(f"{where}: column {self.text_column!r} is not text")
                        if text is None:
                            continue
                        doc_id = (
                            str(data[self.id_column][i]) if self.id_column
                            else f"{file.name}:{row + i}"
                        )
                        title = data[self.title_column][i] if self.title_column else None
                        yield Document(
                            id=doc_id, source=self.name, title=str(title or doc_id), text=text
                        )
                    row += batch.num_rows
            finally:
                pf.close()


class TextDirSource(CorpusSource):
    """Text files under a directory matching any `|`-separated glob, in sorted path order;
    hidden files and directories are skipped. The title is a Markdown file's first `# ` heading,
    else the file's stem; the id is the path relative to the directory."""

    def __init__(self, dir: str | Path, glob: str = "**/*.txt|**/*.md") -> None:
        self.dir = Path(dir)
        self.globs = tuple(g.strip() for g in glob.split("|") if g.strip())
        if not self.globs:
            raise CorpusError(f"TextDirSource({self.dir}): empty glob")

    @property
    def name(self) -> str:
        return f"textdir:{self.dir.resolve()}:{'|'.join(self.globs)}"

    def _files(self) -> list[Path]:
        if not self.dir.is_dir():
            raise CorpusError(f"{self.dir}: text corpus directory not found")
        found = {
            p.relative_to(self.dir)
            for pattern in self.globs
            for p in self.dir.glob(pattern)
            if p.is_file()
        }
        return sorted(
            (rel for rel in found if not any(part.startswith(".") for part in rel.parts)),
            key=lambda rel: rel.as_posix(),
        )

    def iter_documents(self) -> Iterator[Document]:
        for rel in self._files():
            text = (self.dir / rel).read_text(encoding="utf-8", errors="replace")
            title = rel.stem
            if rel.suffix.lower() in (".md", ".markdown"):
                heading = re.search(r"^#\s+(.+?)\s*#*\s*$", text, re.MULTILINE)
                if heading:
                    title = heading.group(1)
            yield Document(id=rel.as_posix(), source=self.name, title=title, text=text)


class HFDatasetSource(CorpusSource):
    """A Hugging Face dataset split, streamed (`datasets.load_dataset(..., streaming=True)`).
    `datasets` is imported only here; pin `revision` for a reproducible order."""

    def __init__(
        self,
        name: str,
        split: str = "train",
        text_field: str = "text",
        config: str | None = None,
        *,
        revision: str | None = None,
        id_field: str | None = None,
        title_field: str | None = None,
    ) -> None:
        self.dataset = name
        self.split = split
        self.text_field = text_field
        self.config = config
        self.revision = revision
        self.id_field = id_field
        self.title_field = title_field

    @property
    def name(self) -> str:
        parts = [self.dataset, self.config or "", self.split, self.revision or "", self.text_field]
        return "hf:" + ":".join(parts)

    def iter_documents(self) -> Iterator[Document]:
        try:
            import datasets
        except ImportError:
            raise CorpusError(
                f"corpus source 'hf' ({self.dataset}) needs the `datasets` package: "
                "pip install datasets (or use a jsonl/parquet/textdir source)"
            ) from None
        kwargs: dict[str, Any] = {"split": self.split, "streaming": True}
        if self.config is not None:
            kwargs["name"] = self.config
        if self.revision is not None:
            kwargs["revision"] = self.revision
        rows = datasets.load_dataset(self.dataset, **kwargs)
        for i, row in enumerate(rows):
            where = f"{self.dataset}[{self.split}] row {i}"
            text = _field_text(row, self.text_field, where)
            if text is None:
                continue
            if self.id_field:
                if self.id_field not in row:
                    raise CorpusError(f"{where}: no field {self.id_field!r}")
                doc_id = str(row[self.id_field])
            else:
                doc_id = f"{self.dataset}:{self.split}:{i}"
            title = _field_text(row, self.title_field, where) if self.title_field else None
            yield Document(id=doc_id, source=self.name, title=title or doc_id, text=text)


# --------------------------------------------------------------------------------------------
# Sampler


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


def make_source(cfg: CorpusConfig | StdlibSourceConfig | JsonlSourceConfig | ParquetSourceConfig
                | TextDirSourceConfig | HFSourceConfig) -> CorpusSource:
    src = cfg.source if isinstance(cfg, CorpusConfig) else cfg
    match src:
        case StdlibSourceConfig():
            return StdlibDocs(
                min_doc_chars=src.min_doc_chars,
                include_submodules=src.include_submodules,
                import_timeout_s=src.import_timeout_s,
            )
        case JsonlSourceConfig():
            return JsonlSource(src.path, src.text_field, src.id_field, src.title_field)
        case ParquetSourceConfig():
            return ParquetSource(
                src.path, src.text_column, src.id_column, src.title_column, src.batch_size
            )
        case TextDirSourceConfig():
            return TextDirSource(src.dir, src.glob)
        case HFSourceConfig():
            return HFDatasetSource(
                src.name, src.split, src.text_field, src.config,
                revision=src.revision, id_field=src.id_field, title_field=src.title_field,
            )
    raise TypeError(f"not a corpus source config: {src!r}")
