"""Redis clients for one URL: a standalone server, or a node of a Redis Cluster.

A plain ``redis://host:port/0`` URL may point at either. :func:`cluster_mode` asks the server
(``INFO cluster``) once per URL, and the clients built here are redis-py's ``Redis`` or
``RedisCluster`` (sync or asyncio) accordingly, so every part of the transport works against both
unchanged. On a cluster every atomic step (a Lua script, a ``MULTI``) touches keys of one hash slot:
:class:`~argusdiff.service.transport.redis_streams.RedisKeys` tags the control keys with one hash tag
(``{ns}``) and each level's streams with one of their own (``{ns:q:<level>}``), so a cluster shards
the work queues by level (docs/operations.md, "Redis topologies").
"""

from __future__ import annotations

import threading
from typing import Any

import redis

__all__ = ["async_client", "cluster_mode", "control_prefix", "is_cluster_client", "sync_client"]

_modes: dict[str, bool] = {}
_lock = threading.Lock()


def control_prefix(namespace: str) -> str:
    """The prefix of a namespace's control keys: its name as a hash tag (``{argusdiff}``), so that
    every control key lives in one slot of a cluster. Idempotent."""
    if namespace.startswith("{") and namespace.endswith("}"):
        return namespace
    return "{" + namespace + "}"


def cluster_mode(url: str, timeout_s: float = 3.0) -> bool:
    """Whether the server at ``url`` is a Redis Cluster node (asked once per URL; an unreachable
    server counts as standalone and is asked again next time)."""
    with _lock:
        known = _modes.get(url)
    if known is not None:
        return known
    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    except ValueError:
        return False
    try:
        mode = bool(int(client.info("cluster").get("cluster_enabled", 0) or 0))
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()
    with _lock:
        _modes[url] = mode
    return mode


def is_cluster_client(client: Any) -> bool:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster | AsyncRedisCluster)


def sync_client(url: str, **kwargs: Any) -> Any:
    """``redis.Redis`` or ``redis.cluster.RedisCluster`` for ``url`` (``kwargs``: connection options)."""
    if cluster_mode(url):
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(url, **kwargs)
    return redis.Redis.from_url(url, **kwargs)


def async_client(url: str, **kwargs: Any) -> Any:
    """``redis.asyncio.Redis`` or ``redis.asyncio.cluster.RedisCluster`` for ``url``."""
    import redis.asyncio as aioredis

    if cluster_mode(url):
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(url, **kwargs)
    return aioredis.Redis.from_url(url, **kwargs)
