"""Corpus sources read from local files: JSONL, Parquet and a directory of text files."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from pathlib import Path

from spade_async.corpus.documents import CorpusError, CorpusSource, Document, field_text


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
                text = field_text(row, self.text_field, where)
                if text is None:
                    continue
                if self.id_field:
                    if self.id_field not in row:
                        raise CorpusError(f"{where}: no field {self.id_field!r}")
                    doc_id = str(row[self.id_field])
                else:
                    doc_id = f"{self.path.name}:{lineno}"
                title = field_text(row, self.title_field, where) if self.title_field else None
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
