"""What every corpus source yields and how it fails: `Document`, `Chunk`, the `CorpusSource`
hook, the corpus errors, and `field_text`, the row-field reader the row-based sources share."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field


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


def field_text(row: dict, field: str, where: str) -> str | None:
    """`row[field]` as text (None when null); a missing or non-text field is an error naming
    `where`."""
    if field not in row:
        raise CorpusError(f"{where}: no field {field!r} (fields: {sorted(row)[:20]})")
    value = row[field]
    if value is None:
        return None
    if not isinstance(value, str):
        raise CorpusError(f"{where}: field {field!r} is {type(value).__name__}, not a string")
    return value
