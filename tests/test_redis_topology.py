"""The Redis deployments the transport supports, and the leader's fenced side effects: real
redis-server processes (a primary, a replica of it, a cluster-enabled node) on free ports."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time

import pytest
import redis
from fixtures_service import cluster_ports, free_port, stop_process

from workers.messages import WorkItem

pytestmark = pytest.mark.integration


def _start(tmp_path, name: str, *extra: str) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    # a cluster node's bus listens on port + 10000, so its port must be at most 55535 with that one
    # free too (an ephemeral port above it made redis-server exit at once, about 1 run in 5)
    port = cluster_ports(1)[0] if "--cluster-enabled" in extra else free_port()
    workdir = tmp_path / name
    workdir.mkdir()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(workdir),
         "--protected-mode", "no", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(500):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server {name} exited with {proc.returncode} on port {port}")
        time.sleep(0.01)
    stop_process(proc)
    raise RuntimeError(f"redis-server {name} did not start")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "argusdiff", *args], capture_output=True, text=True, timeout=120)


def test_a_cluster_that_serves_no_slots_is_refused_naming_its_state(tmp_path):
    proc, url = _start(tmp_path, "cluster", "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
    try:
        for cmd in (["worker", "--redis", url, "--stand-in", "0.01"], ["serve", "--redis", url, "--port", "0"]):
            out = _cli(*cmd)
            assert out.returncode == 2, out.stderr
            assert "--redis" in out.stderr and "cluster_state:fail" in out.stderr and "Traceback" not in out.stderr
    finally:
        stop_process(proc)


def test_a_three_primary_cluster_passes_and_a_replica_node_url_is_detected(redis_cluster_session):
    from argusdiff.service.transport.redis_client import cluster_mode, sync_client
    from argusdiff.service.transport.redis_topology import inspect_topology

    cluster = redis_cluster_session
    for port in cluster.ports:  # any node's plain URL: the cluster behind it is found
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        assert inspect_topology(client, url) == ([], [])  # AOF on every primary, no eviction
        client.close()
        assert cluster_mode(url) and type(sync_client(url)).__name__ == "RedisCluster"


def test_a_replica_is_refused_and_a_risky_primary_warned(tmp_path):
    from argusdiff.service.transport.redis_topology import inspect_topology

    primary, purl = _start(tmp_path, "primary", "--appendonly", "no", "--maxmemory-policy", "allkeys-lru")
    port = purl.rsplit(":", 1)[1].split("/")[0]
    replica, rurl = _start(tmp_path, "replica", "--replicaof", "127.0.0.1", port)
    try:
        out = _cli("worker", "--redis", rurl, "--stand-in", "0.01")
        assert out.returncode == 2 and "replica" in out.stderr, out.stderr
        client = redis.Redis.from_url(purl)
        for _ in range(500):  # the replica's link comes up
            if client.info("replication").get("connected_slaves"):
                break
            time.sleep(0.02)
        errors, warnings = inspect_topology(client, purl)
        client.close()
        assert errors == [] and len(warnings) == 3
        assert any("replica(s)" in w for w in warnings)
        assert any("no AOF" in w for w in warnings)
        assert any("allkeys-lru" in w for w in warnings)
    finally:
        stop_process(replica)
        stop_process(primary)


def test_the_supported_setup_passes_quietly(redis_server):
    from argusdiff.service.transport.redis_topology import inspect_topology

    client = redis.Redis.from_url(redis_server.url)
    assert inspect_topology(client, redis_server.url) == ([], [])
    client.close()


def test_a_stale_leader_cannot_requeue_a_dead_workers_items(redis_any):
    from argusdiff.service.errors import FencedOut
    from argusdiff.service.transport.redis_streams import RedisKeys, RedisWorkQueue

    keys = RedisKeys()
    leader = RedisWorkQueue(redis_any.url, consumer="control-r2")
    dead = RedisWorkQueue(redis_any.url, consumer="w-dead")
    item = WorkItem(request_id="gen-x-0", prompt="p", level="lv", seed=1, deadline_s=0.0, enqueue_s=1.0)
    leader.put("lv", item)
    assert dead.get("lv", timeout=1) is not None  # the worker took it, then died
    leader.r.set(keys.leader, "r2|7")
    with pytest.raises(FencedOut):
        leader.requeue_consumer("lv", "w-dead", fence=(keys.leader, "r1|6"))  # a stale leader's token
    assert leader.pending_by_consumer("lv") == {"w-dead": 1} and leader.qsize("lv") == 0
    assert leader.requeue_consumer("lv", "w-dead", fence=(keys.leader, "r2|7")) == 1
    assert leader.pending_by_consumer("lv").get("w-dead", 0) == 0 and leader.qsize("lv") == 1
    again = RedisWorkQueue(redis_any.url, consumer="w-new").get("lv", timeout=1)
    assert again is not None and again.request_id == "gen-x-0" and again.attempt == 1
