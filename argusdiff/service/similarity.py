"""The router's live view of the latent cache: how similar a prompt is to its nearest cached
prompt, for the policies whose ``route()`` reads :attr:`RouteView.cache_similarity`
(``nirvana`` picks K by it; ``argus+`` checks that a fast AC level would hit before it moves a
request there for its deadline).

The prompt is embedded with the same encoder the AC workers store under (MiniLM by default) and
the index is asked for the nearest entry of the serving model, any K; the lookups are
micro-batched on one thread. The simulator gives the same number (``Simulator.similarity``).
A failing index raises :class:`cache.api.CacheUnavailable` to the caller, which counts it
against the cache's health and routes as if the prompt missed.

With a level classifier on the same encoder, :class:`argusdiff.service.prompt_pass.PromptPass`
runs one encoder pass for both (``argus+``) and uses :meth:`CacheSimilarity.nearest` only.

The embedding travels on with the work item (``meta["embedding"]``, see
:func:`cache.api.encode_embedding`), so the AC executor looks up and stores under it without
running the encoder a second time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from argusdiff.batching import MicroBatcher
from argusdiff.domain import Profile, Strategy

__all__ = ["CacheSimilarity", "ac_model"]


def ac_model(profile: Profile) -> str | None:
    """The model the profile's approximate-caching levels resume (None without AC levels)."""
    for lv in profile.levels:
        if lv.strategy is Strategy.AC:
            return lv.model
    return None


class CacheSimilarity:
    """``await lookup(prompt)`` → (cosine similarity of the nearest cached prompt of ``model``,
    or None when nothing of it is cached yet; the prompt's embedding)."""

    def __init__(
        self,
        cache: Any,
        *,
        model: str | None,
        embed: Callable[[Sequence[str]], np.ndarray] | None = None,
        max_batch: int = 32,
        max_wait_s: float = 0.002,
    ) -> None:
        self.cache = cache
        self.model = model
        self._embed = embed
        self._batcher: MicroBatcher[str, tuple[float | None, np.ndarray]] = MicroBatcher(
            self._batch,
            max_batch=max_batch,
            max_wait_s=max_wait_s,
            retry_singly=False,  # a failing index fails the whole batch; retrying each would only wait longer
            name="cache-similarity",
        )

    def embed(self, prompts: Sequence[str]) -> np.ndarray:
        if self._embed is None:
            from workers.ac import default_embedder

            self._embed = default_embedder()
        return np.asarray(self._embed(list(prompts)), dtype=np.float32).reshape(len(prompts), -1)

    def nearest(self, vec: np.ndarray) -> float | None:
        """The similarity of the cached prompt of ``model`` nearest to ``vec`` (None: none cached)."""
        nb = self.cache.nearest(vec, model=self.model)
        return None if nb is None else float(nb.similarity)

    def _batch(self, prompts: list[str]) -> list[tuple[float | None, np.ndarray]]:
        return [(self.nearest(vec), vec) for vec in self.embed(prompts)]

    async def lookup(self, prompt: str) -> tuple[float | None, np.ndarray]:
        return await asyncio.wrap_future(self._batcher.submit(prompt))

    async def similarity(self, prompt: str) -> float | None:
        return (await self.lookup(prompt))[0]

    def close(self) -> None:
        self._batcher.close()
