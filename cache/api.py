"""The latent cache's interface, as workers and the router use it.

Approximate caching (NIRVANA, ARGUS §4.5): each served prompt stores its intermediate latents
after the configured K steps; a later prompt looks up the most similar earlier prompt by text
embedding and, if similar enough for the K its level skips, resumes from that latent.

Latents cross this interface as NumPy arrays (fp16 on disk), never torch tensors, so the cache
stays free of torch. Embeddings are computed by the caller (the serving model's CLIP text encoder
or the MiniLM encoder) and passed in as 1-D float32 arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from argusdiff.errors import ArgusdiffError

__all__ = [
    "EMBEDDING_META_KEY",
    "CacheHit",
    "CacheUnavailable",
    "LatentCacheProtocol",
    "LatentMeta",
    "decode_embedding",
    "encode_embedding",
]

#: the work-item meta key that carries the router's prompt embedding to the AC executor
EMBEDDING_META_KEY = "embedding"


def encode_embedding(vector: np.ndarray) -> str:
    """A prompt embedding as text for a work item's meta (base64 of little-endian float32)."""
    import base64

    return base64.b64encode(np.asarray(vector, dtype="<f4").reshape(-1).tobytes()).decode("ascii")


def decode_embedding(text: str | None, dim: int | None = None) -> np.ndarray | None:
    """The embedding :func:`encode_embedding` wrote, or None when absent, malformed, not finite
    or not ``dim`` long (the caller then embeds the prompt itself)."""
    import base64
    import binascii

    if not text:
        return None
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return None
    if len(raw) % 4:
        return None
    vec = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if vec.size == 0 or (dim is not None and vec.size != dim) or not np.all(np.isfinite(vec)):
        return None
    return vec


class CacheUnavailable(ArgusdiffError):
    """The index or the blob store failed or timed out. The router treats it as the signal to
    switch approximate caching (AC) to smaller models (SM) (ARGUS §4.6)."""


@dataclass(frozen=True, slots=True)
class LatentMeta:
    """What a stored latent was made with; a worker refuses to resume from a mismatch."""

    model: str  # registry model name
    scheduler: str  # scheduler class name, e.g. "EulerDiscreteScheduler"
    steps: int  # N the latent's trajectory was run with
    k: int  # steps completed when the latent was captured
    shape: tuple[int, ...]
    dtype: str = "float16"
    extra: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CacheHit:
    """A cached latent for a similar earlier prompt."""

    prompt_id: str  # the cache's id of the earlier prompt (never user text)
    similarity: float  # cosine similarity of the two prompts' embeddings
    k: int
    latent: np.ndarray
    meta: LatentMeta
    lookup_s: float  # time spent in the vector index
    fetch_s: float  # time spent fetching the latent blob


@runtime_checkable
class LatentCacheProtocol(Protocol):
    def lookup(self, embedding: np.ndarray, k: int, *, model: str, steps: int | None = None) -> CacheHit | None:
        """Nearest earlier prompt with a latent at ``k`` for ``model`` whose similarity is high
        enough for ``k`` (of ``steps``, the level's N, when given) under the cache's threshold
        policy; None on a miss.
        Raises :class:`CacheUnavailable` when the index or store fails."""
        ...

    def store(self, embedding: np.ndarray, latents: Mapping[int, np.ndarray], meta: LatentMeta) -> str:
        """Store a served prompt's latents (K → latent) and index its embedding; returns its id."""
        ...
