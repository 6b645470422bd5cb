"""The base of every config model of ours: unknown keys are errors (a typo never passes
silently) and a loaded config is immutable. memory_db keeps its own copy: it imports nothing of
ours."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
