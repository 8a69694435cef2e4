"""The latent cache: a vector index of prompt embeddings plus a blob store of their latents.

:class:`LatentCache` implements :class:`~cache.api.LatentCacheProtocol`:

- ``lookup(embedding, k, model=...)`` finds the nearest earlier prompt of the same model that has a
  latent at ``k`` and whose similarity clears the threshold for ``k`` (NIRVANA, strict ``>``),
  fetches and verifies the blob, and returns a :class:`~cache.api.CacheHit` with the time spent
  in the index and in the store. A blob that turns out missing or damaged is a miss, and the
  index entry is repaired at once (an entry never points to a missing blob for longer than one
  failed lookup).
- ``store(embedding, latents, meta)`` writes the blobs first, then indexes the prompt, so the index
  never names a blob that was not written; before that it evicts by LCBFU (hits × K, least first)
  to stay within the byte / count budget.
- Any failure or timeout of the index or the store raises :class:`~cache.api.CacheUnavailable`,
  the router's signal to switch approximate caching to smaller models (ARGUS §4.6).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from argusdiff.errors import ArgusdiffError, ConfigError
from cache.api import CacheHit, CacheUnavailable, LatentMeta
from cache.index import HnswIndex, Neighbor, QdrantIndex, VectorIndex, new_prompt_id, normalise
from cache.policy import CachePolicy, RetentionPolicy
from cache.stats import CacheStats
from cache.store import (
    BlobCorrupt,
    BlobMissing,
    BlobStore,
    LocalDirStore,
    S3Store,
    blob_key,
    decode_latent,
    encode_latent,
    parse_blob_key,
)

if TYPE_CHECKING:
    from argusdiff.config import CacheConfig

__all__ = ["LatentCache"]

_PASS_THROUGH = (CacheUnavailable, BlobMissing, BlobCorrupt, ValueError, ArgusdiffError)


class LatentCache:
    """Index + store + policy, with timeouts and health counters. Thread-safe."""

    def __init__(
        self,
        index: VectorIndex,
        store: BlobStore,
        policy: CachePolicy | None = None,
        *,
        timeout_s: float | None = 1.0,
        stats: CacheStats | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if timeout_s is not None and not timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0 or None (got {timeout_s})")
        self.index = index
        self.blobs = store
        self.policy = policy or CachePolicy()
        self.timeout_s = timeout_s
        self.stats = stats or CacheStats()
        self._clock = clock
        self._write_lock = threading.RLock()
        self._pool = (
            None if timeout_s is None else cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="latent-cache")
        )

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_config(
        cls, config: CacheConfig, *, read_only: bool = False, index: VectorIndex | None = None
    ) -> LatentCache:
        """The cache a :class:`~argusdiff.config.CacheConfig` describes (creates folders/bucket).
        ``read_only`` opens an HNSW index without taking its writer lock (to inspect a cache
        another process serves from); ``index`` replaces the configured index (e.g. a
        :class:`~cache.replication.ReplicatedIndex`)."""
        root = Path(config.path).expanduser()
        try:
            if index is not None:
                pass
            elif config.index == "hnsw":
                index = HnswIndex(
                    root / "index",
                    config.embedding_dim,
                    m=config.hnsw_m,
                    ef_construction=config.hnsw_ef_construction,
                    ef_search=config.hnsw_ef_search,
                    read_only=read_only,
                )
            else:
                index = QdrantIndex(
                    None if config.qdrant_url else root / "qdrant",
                    config.embedding_dim,
                    url=config.qdrant_url,
                    api_key=config.qdrant_api_key,
                    collection=config.qdrant_collection,
                    timeout_s=config.timeout_s or 5.0,
                )
        except ArgusdiffError:
            raise
        except Exception as exc:
            raise CacheUnavailable(f"cache index ({config.index}) cannot open: {type(exc).__name__}: {exc}") from None
        if config.store == "local":
            store: BlobStore = LocalDirStore(root / "blobs")
        else:
            store = S3Store(
                config.s3_bucket or "",
                prefix=config.s3_prefix,
                endpoint_url=config.s3_endpoint_url,
                region=config.s3_region,
                read_timeout_s=max(1.0, config.timeout_s or 5.0),
            )
        budget = None if config.byte_budget_mb is None else int(config.byte_budget_mb * 1024 * 1024)
        policy = CachePolicy(tuple(config.thresholds), RetentionPolicy(budget, config.max_latents))
        return cls(index, store, policy, timeout_s=config.timeout_s)

    def __enter__(self) -> LatentCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        for part in (self.index, self.blobs):
            with contextlib.suppress(Exception):  # closing is best effort
                part.close()

    @property
    def description(self) -> str:
        return f"{self.index.description} + {self.blobs.description}"

    # -- plumbing -------------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run an index/store call under the timeout; unexpected errors become CacheUnavailable."""
        try:
            if self._pool is None:
                return fn(*args, **kwargs)
            fut = self._pool.submit(fn, *args, **kwargs)
            try:
                return fut.result(timeout=self.timeout_s)
            except cf.TimeoutError:
                fut.cancel()
                raise CacheUnavailable(f"latent cache: {what} timed out after {self.timeout_s:g} s") from None
        except _PASS_THROUGH:
            raise
        except RuntimeError as exc:
            if "shutdown" in str(exc):
                raise CacheUnavailable("latent cache is closed") from None
            raise CacheUnavailable(f"latent cache: {what} failed: {type(exc).__name__}: {exc}") from None
        except Exception as exc:
            raise CacheUnavailable(f"latent cache: {what} failed: {type(exc).__name__}: {exc}") from None

    def _repair(self, prompt_id: str, k: int, *, delete_blob: bool) -> None:
        """Drop a latent whose blob is missing or damaged from the index (and its blob)."""
        self.stats.count("repairs")
        self._call("index repair", self.index.remove_latents, prompt_id, [k])
        if delete_blob:
            with contextlib.suppress(CacheUnavailable):  # an orphan blob is harmless; verify() removes it
                self._call("blob delete", self.blobs.delete, blob_key(prompt_id, k))

    # -- data path ------------------------------------------------------------------------------
    def lookup(self, embedding: np.ndarray, k: int, *, model: str, steps: int | None = None) -> CacheHit | None:
        """See :class:`~cache.api.LatentCacheProtocol`. ``steps`` (the level's N), when given,
        scales K to the thresholds' reference N before the threshold is chosen."""
        k = int(k)
        threshold = self.policy.min_similarity(k, steps)
        if k <= 0 or math.isinf(threshold):
            return None  # K = 0 skips nothing; a K above the table is never servable
        emb = normalise(embedding, getattr(self.index, "dim", None))
        self.stats.count("lookups")
        t0 = time.perf_counter()
        try:
            found: list[Neighbor] = self._call(
                "index lookup", self.index.nearest, emb, model=model, k=k, min_similarity=threshold, limit=1
            )
        except CacheUnavailable:
            self.stats.count("errors")
            raise
        lookup_s = time.perf_counter() - t0
        self.stats.observe("lookup_s", lookup_s)
        if not found:
            self.stats.count("misses")
            return None
        best = found[0]
        t1 = time.perf_counter()
        try:
            data = self._call("blob fetch", self.blobs.get, blob_key(best.prompt_id, k))
            latent, meta = decode_latent(data)
            if meta.model != model or meta.k != k:
                raise BlobCorrupt(f"blob says model {meta.model!r} K={meta.k}, index says {model!r} K={k}")
        except BlobMissing:
            self.stats.count("misses")
            self._repair(best.prompt_id, k, delete_blob=False)
            return None
        except BlobCorrupt:
            self.stats.count("misses")
            self._repair(best.prompt_id, k, delete_blob=True)
            return None
        except CacheUnavailable:
            self.stats.count("errors")
            raise
        fetch_s = time.perf_counter() - t1
        self.stats.observe("fetch_s", fetch_s)
        with contextlib.suppress(Exception):  # hit counts only steer eviction; never fail a hit over them
            self.index.record_hit(best.prompt_id, k, self._clock())
        self.stats.hit(k)
        return CacheHit(
            prompt_id=best.prompt_id,
            similarity=best.similarity,
            k=k,
            latent=latent,
            meta=meta,
            lookup_s=lookup_s,
            fetch_s=fetch_s,
        )

    def checkpoint(self) -> bool:
        """Persist the index's in-memory state where it has one (HNSW graph snapshot), so a crash
        recovers from here plus the SQLite delta; e.g. from the control loop every few minutes.
        Returns False when the index has nothing to checkpoint."""
        fn = getattr(self.index, "checkpoint", None)
        if fn is None:
            return False
        self._call("index checkpoint", fn)
        return True

    def probe(self) -> float:
        """Health check off the request path (ARGUS §4.6): one index query with a random unit
        vector and one store read of a key that does not exist (a healthy store answers
        "missing"), each under the timeout. Returns the seconds taken; raises
        :class:`CacheUnavailable`. Not counted in :attr:`stats`."""
        t0 = time.perf_counter()
        dim = int(getattr(self.index, "dim", 0) or 2)
        vec = np.random.default_rng().standard_normal(dim).astype(np.float32)
        self._call("index probe", self.index.nearest, normalise(vec), limit=1)
        with contextlib.suppress(BlobMissing):
            self._call("store probe", self.blobs.get, blob_key("0" * 32, 0))
        return time.perf_counter() - t0

    def nearest(self, embedding: np.ndarray, *, model: str | None = None) -> Neighbor | None:
        """The most similar cached prompt (any K), e.g. for the router's view of cache similarity."""
        emb = normalise(embedding, getattr(self.index, "dim", None))
        found = self._call("index lookup", self.index.nearest, emb, model=model, limit=1)
        return found[0] if found else None

    def store(self, embedding: np.ndarray, latents: Mapping[int, np.ndarray], meta: LatentMeta) -> str:
        if not latents:
            raise ValueError("store() needs at least one latent (K -> array)")
        emb = normalise(embedding, getattr(self.index, "dim", None))
        blobs: dict[int, bytes] = {}
        for k, lat in latents.items():
            k = int(k)
            if not 0 < k < int(meta.steps):
                raise ValueError(f"latent K={k} is outside 1..{int(meta.steps) - 1} for N={meta.steps} steps")
            arr = np.asarray(lat)
            blobs[k] = encode_latent(arr, replace(meta, k=k, shape=tuple(arr.shape), dtype="float16"))
        incoming = sum(len(b) for b in blobs.values())
        retention = self.policy.retention
        if retention.over_budget(incoming, len(blobs)):
            raise ConfigError(
                f"byte_budget_mb/max_latents: one prompt's latents ({incoming} bytes, {len(blobs)} latents) "
                "exceed the cache budget on their own"
            )
        pid = new_prompt_id()
        t0 = time.perf_counter()
        with self._write_lock:
            self.evict(incoming_bytes=incoming, incoming_count=len(blobs))
            written: list[str] = []
            try:
                for k, data in blobs.items():
                    key = blob_key(pid, k)
                    self._call("blob put", self.blobs.put, key, data)
                    written.append(key)
                self._call(
                    "index add",
                    self.index.add,
                    pid,
                    emb,
                    model=meta.model,
                    sizes={k: len(b) for k, b in blobs.items()},
                    now_s=self._clock(),
                )
            except CacheUnavailable:
                self.stats.count("store_errors")
                for key in written:
                    with contextlib.suppress(CacheUnavailable):
                        self._call("blob delete", self.blobs.delete, key)
                raise
        self.stats.count("stores")
        self.stats.observe("store_s", time.perf_counter() - t0)
        return pid

    # -- maintenance ----------------------------------------------------------------------------
    def evict(self, *, incoming_bytes: int = 0, incoming_count: int = 0) -> int:
        """Evict by LCBFU until the budget holds (with room for ``incoming_*``); returns the count."""
        retention = self.policy.retention
        if retention.byte_budget is None and retention.max_latents is None:
            return 0
        with self._write_lock:
            stats = self._call("index scan", self.index.latent_stats)
            victims = retention.victims(stats, incoming_bytes=incoming_bytes, incoming_count=incoming_count)
            by_prompt: dict[str, list[int]] = defaultdict(list)
            for pid, k in victims:
                by_prompt[pid].append(k)
            for pid, ks in by_prompt.items():
                # Index first: a lookup may never find an entry whose blob is already gone.
                self._call("index evict", self.index.remove_latents, pid, ks)
                for k in ks:
                    with contextlib.suppress(CacheUnavailable):  # orphan blob; verify() removes it
                        self._call("blob delete", self.blobs.delete, blob_key(pid, k))
            if victims:
                self.stats.count("evictions", len(victims))
            return len(victims)

    def remove(self, prompt_id: str) -> None:
        with self._write_lock:
            entry = self._call("index get", self.index.get, prompt_id)
            if entry is None:
                return
            self._call("index remove", self.index.remove, prompt_id)
            for k in entry.ks:
                self._call("blob delete", self.blobs.delete, blob_key(prompt_id, k))

    def clear(self) -> int:
        """Remove every prompt and blob; returns the number of blobs deleted."""
        with self._write_lock:
            self._call("index clear", self.index.clear)
            keys = list(self.blobs.keys())
            self.blobs.delete_many(keys)
            return len(keys)

    def entries(self):
        return self.index.entries()

    def usage(self) -> dict:
        """Prompts, latents, bytes, latents and stored hits per K (from the index)."""
        stats = self._call("index scan", self.index.latent_stats)
        by_k: Counter[int] = Counter(s.k for s in stats)
        hits_k: Counter[int] = Counter()
        for s in stats:
            hits_k[s.k] += s.hits
        return {
            "prompts": len({s.prompt_id for s in stats}),
            "latents": len(stats),
            "bytes": sum(s.size_bytes for s in stats),
            "latents_by_k": dict(sorted(by_k.items())),
            "hits_by_k": dict(sorted(hits_k.items())),
            "byte_budget": self.policy.retention.byte_budget,
            "max_latents": self.policy.retention.max_latents,
        }

    def verify(self, *, repair: bool = True, deep: bool = False) -> dict:
        """Compare index and store: latents whose blob is missing (``dangling``), blobs no index
        entry names (``orphans``) and, with ``deep``, blobs that fail to decode (``corrupt``).
        With ``repair`` the index drops dangling/corrupt latents and orphan/corrupt blobs are deleted."""
        with self._write_lock:
            stats = self._call("index scan", self.index.latent_stats)
            indexed = {(s.prompt_id, s.k) for s in stats}
            stored: set[tuple[str, int]] = set()
            for key in self._call("blob list", lambda: list(self.blobs.keys())):
                stored.add(parse_blob_key(key))
            dangling = sorted(indexed - stored)
            orphans = sorted(stored - indexed)
            corrupt: list[tuple[str, int]] = []
            if deep:
                for pid, k in sorted(indexed & stored):
                    try:
                        decode_latent(self._call("blob fetch", self.blobs.get, blob_key(pid, k)))
                    except (BlobCorrupt, BlobMissing):
                        corrupt.append((pid, k))
            if repair:
                for pid, k in dangling:
                    self._call("index repair", self.index.remove_latents, pid, [k])
                for pid, k in corrupt:
                    self._call("index repair", self.index.remove_latents, pid, [k])
                for pid, k in orphans + corrupt:
                    self._call("blob delete", self.blobs.delete, blob_key(pid, k))
            return {
                "latents": len(indexed),
                "blobs": len(stored),
                "dangling": len(dangling),
                "orphans": len(orphans),
                "corrupt": len(corrupt),
                "repaired": repair,
            }
