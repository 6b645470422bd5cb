"""Maximal marginal relevance (Carbonell & Goldstein 1998) over a candidate set.

LanceDB has no MMR, so the store fetches the top `fetch_k` vector hits (with their embeddings)
and this function re-ranks them greedily:

    next = argmax_{d not in S}  lambda * rel(d)  -  (1 - lambda) * max_{s in S} cos(d, s)

With lambda = 1 the redundancy term vanishes and the order is the relevance order (a stable sort,
so ties keep the search engine's order): MMR then equals plain top-k.
"""

from __future__ import annotations

import numpy as np


def mmr(relevance: np.ndarray, vectors: np.ndarray, k: int, lam: float) -> list[int]:
    """Indices into the candidates, in MMR order. `relevance`: (n,) similarity to the query;
    `vectors`: (n, dim) unit rows (their dot products are the pairwise cosines)."""
    n = len(relevance)
    k = min(k, n)
    if k <= 0:
        return []
    relevance = np.asarray(relevance, dtype=np.float64)
    if lam >= 1.0:
        return [int(i) for i in np.argsort(-relevance, kind="stable")[:k]]
    vectors = np.asarray(vectors, dtype=np.float32)
    chosen: list[int] = []
    taken = np.zeros(n, dtype=bool)
    redundancy = np.full(n, -np.inf)  # max cosine to anything chosen so far
    for _ in range(k):
        # nothing chosen yet: the redundancy term is empty and the most relevant goes first
        score = lam * relevance - (1.0 - lam) * redundancy if chosen else relevance.copy()
        score[taken] = -np.inf
        best = int(np.argmax(score))
        chosen.append(best)
        taken[best] = True
        redundancy = np.maximum(redundancy, vectors @ vectors[best])
    return chosen
