"""`make_source`: the one place a corpus source config becomes its source."""

from __future__ import annotations

from spade_async.core.config.corpus import (
    CorpusConfig,
    HFSourceConfig,
    JsonlSourceConfig,
    ParquetSourceConfig,
    StdlibSourceConfig,
    TextDirSourceConfig,
)
from spade_async.corpus.documents import CorpusSource
from spade_async.corpus.files import JsonlSource, ParquetSource, TextDirSource
from spade_async.corpus.hf import HFDatasetSource
from spade_async.corpus.stdlib import StdlibDocs


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
