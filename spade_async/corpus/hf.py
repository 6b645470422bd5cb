"""The Hugging Face dataset corpus source; the only module that imports `datasets` (lazily)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from spade_async.corpus.documents import CorpusError, CorpusSource, Document, field_text


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
            text = field_text(row, self.text_field, where)
            if text is None:
                continue
            if self.id_field:
                if self.id_field not in row:
                    raise CorpusError(f"{where}: no field {self.id_field!r}")
                doc_id = str(row[self.id_field])
            else:
                doc_id = f"{self.dataset}:{self.split}:{i}"
            title = field_text(row, self.title_field, where) if self.title_field else None
            yield Document(id=doc_id, source=self.name, title=title or doc_id, text=text)
