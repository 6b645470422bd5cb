"""The corpus section of the config: where designer documents come from and how they are cut
and shuffled (the sources themselves live in spade_async.corpus)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from spade_async.core.strict import Strict


class StdlibSourceConfig(Strict):
    type: Literal["stdlib"] = "stdlib"
    min_doc_chars: int = Field(300, ge=0, description="modules with less docstring text are left out")
    include_submodules: bool = Field(True, description="walk packages into their submodules")
    import_timeout_s: float = Field(30.0, gt=0, description="deadline of one module's import")


class JsonlSourceConfig(Strict):
    type: Literal["jsonl"] = "jsonl"
    path: Path = Field(description="a .jsonl or .jsonl.gz file, one JSON object a line")
    text_field: str = Field("text", min_length=1)
    id_field: str | None = Field(None, description="default: file name and line number")
    title_field: str | None = None


class ParquetSourceConfig(Strict):
    type: Literal["parquet"] = "parquet"
    path: Path = Field(description="a Parquet file, or a directory of them")
    text_column: str = Field("text", min_length=1)
    id_column: str | None = Field(None, description="default: file name and row number")
    title_column: str | None = None
    batch_size: int = Field(1024, ge=1, description="rows per record batch read")


class TextDirSourceConfig(Strict):
    type: Literal["textdir"] = "textdir"
    dir: Path
    glob: str = Field("**/*.txt|**/*.md", min_length=1, description="'|'-separated globs")


class HFSourceConfig(Strict):
    type: Literal["hf"] = "hf"
    name: str = Field(min_length=1, description="dataset repository, e.g. 'wikimedia/wikipedia'")
    split: str = "train"
    text_field: str = Field("text", min_length=1)
    config: str | None = Field(None, description="the dataset's configuration name")
    revision: str | None = Field(None, description="pin a commit for a reproducible order")
    id_field: str | None = None
    title_field: str | None = None


SourceConfig = Annotated[
    StdlibSourceConfig | JsonlSourceConfig | ParquetSourceConfig | TextDirSourceConfig
    | HFSourceConfig,
    Field(discriminator="type"),
]


class CorpusConfig(Strict):
    """Where designer documents come from and how they are cut and shuffled."""

    source: SourceConfig = Field(default_factory=StdlibSourceConfig)
    max_chars: int = Field(2000, ge=64, description="longest chunk handed to the designer")
    min_chars: int = Field(200, ge=0, description="shorter chunks are dropped")
    seed: int = Field(0, description="shuffle seed; part of the sampler's state identity")
    shuffle_buffer: int = Field(10_000, ge=1, description="chunks held for the shuffle")

    @model_validator(mode="after")
    def _sizes(self) -> CorpusConfig:
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) exceeds max_chars ({self.max_chars})")
        return self
