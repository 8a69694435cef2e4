"""Test fixtures for the workers area (a pytest plugin module loaded by conftest.py).

* ``demo_models_dir``: one folder per test session where the tiny demo pipelines are built once.
* ``demo_registry``: a :class:`workers.registry.ModelRegistry` on the CPU over that folder.
* ``hash_embedder``: a deterministic bag-of-words prompt embedder (no model download).
* ``MemoryLatentCache`` / ``memory_cache``: an in-memory :class:`cache.api.LatentCacheProtocol`
  with NIRVANA thresholds, used to test the workers' side of approximate caching without a store.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from cache.api import CacheHit, CacheUnavailable, LatentMeta

NIRVANA = ((0.95, 25), (0.90, 20), (0.85, 15), (0.75, 10), (0.65, 5))


def hash_embed(texts: Sequence[str], dim: int = 64) -> np.ndarray:
    """Bag-of-words feature hashing, L2-normalised: equal prompts → similarity 1."""
    out = np.zeros((len(texts), dim), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in text.lower().split():
            h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "little")
            out[i, h % dim] += 1.0
        norm = np.linalg.norm(out[i])
        if norm:
            out[i] /= norm
    return out


class MemoryLatentCache:
    """In-memory latent cache (exact cosine search) with a switch to simulate an outage."""

    def __init__(self, thresholds=NIRVANA, *, min_k_similarity: dict[int, float] | None = None) -> None:
        self.entries: list[tuple[np.ndarray, dict[int, np.ndarray], LatentMeta]] = []
        self.thresholds = thresholds
        self.broken = False
        self.lookups = 0
        self.stores = 0
        self.min_k_similarity = min_k_similarity  # K -> similarity needed (default: NIRVANA scaled)

    def _needed(self, k: int, steps: int | None = None) -> float:
        if self.min_k_similarity is not None and k in self.min_k_similarity:
            return self.min_k_similarity[k]
        from cache.policy import CachePolicy

        k = CachePolicy().scaled_k(k, steps)
        for sim, kk in reversed(self.thresholds):
            if k <= kk:
                return sim
        return 1.0

    def lookup(self, embedding: np.ndarray, k: int, *, model: str, steps: int | None = None) -> CacheHit | None:
        self.lookups += 1
        if self.broken:
            raise CacheUnavailable("memory cache is down (test)")
        best = None
        for idx, (emb, latents, meta) in enumerate(self.entries):
            if meta.model != model or k not in latents:
                continue
            sim = float(np.dot(emb, embedding))
            if best is None or sim > best[0]:
                best = (sim, idx)
        if best is None or best[0] <= self._needed(k, steps) - 1e-6:
            return None
        emb, latents, meta = self.entries[best[1]]
        return CacheHit(
            prompt_id=f"p{best[1]}",
            similarity=best[0],
            k=k,
            latent=latents[k],
            meta=meta,
            lookup_s=1e-4,
            fetch_s=1e-4,
        )

    def store(self, embedding: np.ndarray, latents: Mapping[int, np.ndarray], meta: LatentMeta) -> str:
        if self.broken:
            raise CacheUnavailable("memory cache is down (test)")
        self.stores += 1
        self.entries.append((np.asarray(embedding, dtype=np.float32), dict(latents), meta))
        return f"p{len(self.entries) - 1}"


@pytest.fixture(scope="session")
def demo_models_dir(tmp_path_factory) -> str:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return str(tmp_path_factory.mktemp("demo-models"))


@pytest.fixture(scope="session")
def demo_registry(demo_models_dir):
    import torch

    torch.set_num_threads(1)
    from workers.registry import ModelRegistry

    return ModelRegistry(device="cpu", models_dir=demo_models_dir, max_loaded=4)


@pytest.fixture
def hash_embedder():
    return hash_embed


@pytest.fixture
def memory_cache() -> MemoryLatentCache:
    return MemoryLatentCache()
