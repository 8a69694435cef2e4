"""What a Redis deployment must be for the Redis transport, checked when a router or worker starts.

Supported: **one standalone primary with AOF** (``appendonly yes``) and ``maxmemory-policy
noeviction``, or a **Redis Cluster** of such primaries (a plain ``redis://`` URL of any of its
nodes: the clients detect it, :mod:`argusdiff.service.transport.redis_client`). Everything the
transport does atomically (the enqueue, the fenced plan writes and re-queues, a worker's ack) is a
Lua script or a transaction over keys of one hash slot, and a restart keeps accepted work only
with AOF.

* **Refused** (the command exits 2 naming ``--redis``): a replica of a standalone primary
  (read-only), and a cluster whose state is not ``ok`` (slots uncovered).
* **Warned**: replicas (a failover to an asynchronous replica can roll back the leader lease's
  epoch, a plan version and accepted requests: the transport does not ``WAIT``), no AOF (a restart
  loses every queued request), and an eviction policy that may evict queued work, records or the
  lease; on a cluster, of each primary.
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
        return _inspect_cluster(client, shown)
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
    warnings += _durability(client, shown)
    return errors, warnings


def _durability(client: Any, shown: str) -> list[str]:
    warnings = []
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
    return warnings


def _inspect_cluster(client: Any, shown: str) -> tuple[list[str], list[str]]:
    """A Redis Cluster: its state must be ``ok``; each primary is checked as a standalone one is
    (AOF, eviction), and replicas are warned about (failover)."""
    import redis

    info = client.execute_command("CLUSTER", "INFO")
    text = info.decode() if isinstance(info, bytes) else str(info)
    state = dict(line.split(":", 1) for line in text.splitlines() if ":" in line).get("cluster_state", "")
    if state.strip() != "ok":
        return [f"Redis Cluster at {shown} is not ok (cluster_state:{state.strip()}): every slot must be served"], []
    nodes = client.execute_command("CLUSTER", "NODES")
    rows = [line.split() for line in (nodes.decode() if isinstance(nodes, bytes) else str(nodes)).splitlines()]
    masters = [r[1].split("@", 1)[0] for r in rows if len(r) > 2 and "master" in r[2].split(",")]
    replicas = sum(1 for r in rows if len(r) > 2 and "slave" in r[2].split(","))
    warnings = []
    if replicas:
        warnings.append(
            f"Redis Cluster at {shown} has {replicas} replica(s): a failover to one can roll back accepted "
            "requests, the leader lease's epoch and the plan version (replication is asynchronous)"
        )
    kwargs = client.connection_pool.connection_kwargs
    for addr in masters:
        host, _, port = addr.rpartition(":")
        node = redis.Redis(
            host=host, port=int(port), username=kwargs.get("username"), password=kwargs.get("password"),
            socket_timeout=kwargs.get("socket_timeout"), socket_connect_timeout=kwargs.get("socket_connect_timeout"),
        )  # fmt: skip
        try:
            warnings += _durability(node, f"{shown} (cluster primary {addr})")
        finally:
            node.close()
    return [], warnings
