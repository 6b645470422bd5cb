"""Curves over a run's numbers for the plots: a rolling mean, the diversity of a growing set of
embeddings, a 2-D projection. Plain numpy; they read no file and draw nothing."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def rolling_mean(values: Iterable[float], window: int) -> np.ndarray:
    """Mean of the last `window` values at each position (fewer at the start)."""
    x = np.asarray(values if isinstance(values, np.ndarray) else list(values),
                   dtype=np.float64)
    if not len(x):
        return x
    c = np.concatenate([[0.0], np.cumsum(x)])
    idx = np.arange(1, len(x) + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def diversity_curve(vectors: np.ndarray) -> np.ndarray:
    """Mean pairwise cosine distance of the first i+1 unit vectors, for every i (NaN for i=0):
    with s = sum of the vectors, sum_{a != b} v_a . v_b = |s|^2 - n, so each point is O(d)."""
    n = len(vectors)
    out = np.full(n, np.nan)
    if n == 0:
        return out
    v = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    s = np.cumsum(v.astype(np.float64), axis=0)
    k = np.arange(1, n + 1, dtype=np.float64)
    sq = np.einsum("ij,ij->i", s, s)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_sim = (sq - k) / (k * (k - 1))
    out[1:] = 1.0 - mean_sim[1:]
    return out


def pca_2d(vectors: np.ndarray) -> np.ndarray:
    """The first two principal components (n x 2); fewer than 3 points sit on a line."""
    if len(vectors) == 0:
        return np.zeros((0, 2))
    x = vectors - vectors.mean(axis=0, keepdims=True)
    if len(vectors) < 3:
        return np.column_stack([x[:, 0], np.zeros(len(x))])
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    return x @ vt[:2].T
