"""What a Redis deployment must be for the Redis transport, checked when a router or worker starts.

Supported: **one standalone primary with AOF** (``appendonly yes``) and ``maxmemory-policy
noeviction``. Everything the transport does atomically (the enqueue, the fenced plan writes and
re-queues, a worker's ack) is a Lua script or a transaction over keys of one server, and a
restart keeps accepted work only with AOF.

* **Refused** (the command exits 2 naming ``--redis``): a Redis Cluster node (the keys of one
  atomic step are not hash-tagged into one slot, so the steps would fail with CROSSSLOT), and a
  replica (read-only).
* **Warned**: a primary with replicas (a failover to an asynchronous replica can roll back the
  leader lease's epoch, a plan version and accepted requests: the transport does not ``WAIT``),
  no AOF (a restart loses every queued request), and an eviction policy that may evict queued
  work, records or the lease.
"""

from __future__ import annotations

from typing import Any

__all__ = ["inspect_topology"]


def inspect_topology(client: Any, shown: str) -> tuple[list[str], list[str]]:
    """(errors, warnings) about the Redis ``client`` talks to (``shown``: its URL for messages)."""
    errors: list[str] = []
    warnings: list[str] = []
    cluster = client.info("cluster")
    if int(cluster.get("cluster_enabled", 0) or 0):
        errors.append(
            f"Redis at {shown} runs in cluster mode, which the Redis transport does not support (an "
            "enqueue, a plan write or a re-queue touches keys of several hash slots); use a standalone "
            "primary with AOF (docs/operations.md, 'Redis topologies')"
        )
        return errors, warnings
    replication = client.info("replication")
    if replication.get("role") not in (None, "master"):
        errors.append(f"Redis at {shown} is a replica (read-only): point it at the primary")
        return errors, warnings
    replicas = int(replication.get("connected_slaves", 0) or 0)
    if replicas:
        warnings.append(
            f"Redis at {shown} has {replicas} replica(s): a failover to one can roll back accepted "
            "requests, the leader lease's epoch and the plan version (replication is asynchronous); "
            "the supported setup is a single primary with AOF"
        )
    persistence = client.info("persistence")
    if not int(persistence.get("aof_enabled", 0) or 0):
        warnings.append(
            f"Redis at {shown} has no AOF (appendonly no): a restart loses every queued request; set appendonly yes"
        )
    policy = str(client.info("memory").get("maxmemory_policy", "noeviction"))
    if policy != "noeviction":
        warnings.append(
            f"Redis at {shown} has maxmemory-policy {policy}: it may evict queued work, request records "
            "or the leader lease; set noeviction"
        )
    return errors, warnings
