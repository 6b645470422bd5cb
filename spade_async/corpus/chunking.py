"""Cutting a document's text into chunks of bounded size, at paragraph, sentence or word
boundaries, keeping the original whitespace between the pieces."""

from __future__ import annotations

import re
from collections.abc import Iterator

from spade_async.corpus.documents import Chunk, Document

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
