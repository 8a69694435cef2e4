"""The service's latent caches, built from its settings: the cache its AC workers write
(:func:`build_cache`, one per process), its index replicated through Redis
(:func:`replicated_index`), and a router's view of the cache every worker writes
(:func:`shared_cache_view`). The executors themselves come from :class:`workers.executor.ExecutorFactory`.
"""

from __future__ import annotations

from typing import Any

from argusdiff.domain import Profile, Strategy

__all__ = ["build_cache", "replicated_index", "shared_cache_view"]


def build_cache(settings: Any, profile: Profile) -> Any:
    """The latent cache of an approximate-caching deployment (None for other profiles or when
    ``[cache] enabled = false``); its index replicated through Redis where
    :func:`replicated_index` applies."""
    if Strategy.AC not in profile.strategies or not settings.cache.enabled:
        return None
    from cache.latent_cache import LatentCache

    return LatentCache.from_config(settings.cache, index=replicated_index(settings))


def replicated_index(settings: Any) -> Any:
    """The process's replica of the shared cache index (:mod:`cache.replication`) when the
    deployment uses Redis, the embedded HNSW index and ``[cache] replication = "auto"``; else
    None (the configured index: per process, or the Qdrant server every process shares)."""
    c = settings.cache
    url = settings.service.redis_url
    if not (url and c.enabled and c.index == "hnsw" and c.replication == "auto"):
        return None
    from argusdiff.service.transport import redis_client
    from cache.index import HnswIndex
    from cache.replication import CacheLog, ReplicatedIndex

    local = HnswIndex(
        None, c.embedding_dim, m=c.hnsw_m, ef_construction=c.hnsw_ef_construction, ef_search=c.hnsw_ef_search
    )
    return ReplicatedIndex(
        local,
        CacheLog(  # a cluster-aware client; the control keys' hash tag (one slot of a cluster)
            redis_client.sync_client(url, socket_timeout=c.timeout_s or 5.0, socket_connect_timeout=c.timeout_s or 5.0),
            redis_client.control_prefix(settings.service.namespace),
        ),
        snapshot_every=c.replication_snapshot_every,
    )


def shared_cache_view(settings: Any) -> Any:
    """A router's view of the cache every worker writes, for a router without local workers:
    the replicated index or the Qdrant server (``qdrant_url``); None when there is none."""
    c = settings.cache
    if not c.enabled:
        return None
    index = replicated_index(settings)
    if index is None and not (c.index == "qdrant" and c.qdrant_url):
        return None
    from cache.latent_cache import LatentCache

    return LatentCache.from_config(c, index=index)
