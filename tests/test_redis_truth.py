"""Distributed mode tells the truth when Redis stalls or restarts: real redis-server processes frozen
with SIGSTOP/SIGCONT and restarted, a real router and `argusdiff worker` processes.

* an enqueue refused with 503 ``queue_unavailable`` ("not accepted") never runs later, even though
  its bytes were already in Redis's socket when the router gave up;
* ``/readyz`` turns 503 while Redis is frozen, and 200 again when it resumes;
* a restarted Redis leaves no stale pooled connection that refuses a request later;
* ``argusdiff_queue_errors_total`` counts every refusal the queue caused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re

import httpx
import pytest
import redis
from fixtures_service import service_settings

from argusdiff.service.transport.redis_client import sync_client
from argusdiff.service.worker import wait_until
from workers.messages import WorkItem

pytestmark = pytest.mark.integration


def _records(url: str, namespace: str = "argusdiff") -> int:
    r = sync_client(url)
    try:
        return sum(1 for _ in r.scan_iter(f"{{{namespace}}}:req:*"))
    finally:
        r.close()


def _entries(url: str, namespace: str = "argusdiff") -> int:
    r = sync_client(url)
    try:
        return sum(r.xlen(k) for k in r.scan_iter(f"{{{namespace}:q:*", _type="STREAM"))
    finally:
        r.close()


def _item(rid: str, level: str = "lv") -> WorkItem:
    return WorkItem(request_id=rid, prompt="a frozen lake", level=level, seed=1, deadline_s=0.0, enqueue_s=1.0)


def test_enqueue_refused_during_a_freeze_never_runs_later(redis_server):
    from argusdiff.service.errors import QueueUnavailable
    from argusdiff.service.transport.redis_dispatch import AsyncRedisDispatch

    async def scenario() -> tuple[bool, list]:
        aio = AsyncRedisDispatch(redis_server.url, socket_timeout_s=0.5)
        try:
            first = await aio.enqueue([_item("gen-a-0")], ("gen-a", {"id": "gen-a"}, 60.0))
            redis_server.freeze()
            try:
                # the whole step is written to Redis's socket, then the router gives up waiting
                await aio.enqueue([_item("gen-b-0"), _item("gen-b-1")], ("gen-b", {"id": "gen-b"}, 60.0))
                refused = False
            except QueueUnavailable:
                refused = True
            finally:
                redis_server.thaw()
            return refused, first
        finally:
            await aio.close()

    refused, first = asyncio.run(scenario())
    assert refused and first[0] is not None
    # Redis resumed and read the buffered step: it must not have run
    r = redis.Redis.from_url(redis_server.url)
    assert r.ping()
    assert r.exists("{argusdiff}:req:gen-a") == 1 and r.exists("{argusdiff}:req:gen-b") == 0
    assert _entries(redis_server.url) == 1
    r.close()


def test_enqueue_retried_after_it_ran_queues_once(redis_any):
    from argusdiff.service.transport.redis_dispatch import AsyncRedisDispatch

    async def scenario() -> tuple[list, list]:
        aio = AsyncRedisDispatch(redis_any.url)
        try:
            record = ("gen-c", {"id": "gen-c"}, 60.0)
            return await aio.enqueue([_item("gen-c-0")], record), await aio.enqueue([_item("gen-c-0")], record)
        finally:
            await aio.close()

    once, again = asyncio.run(scenario())
    assert once[0] is not None and again == [None]
    assert _entries(redis_any.url) == 1 and _records(redis_any.url) == 1


def _node_of(cluster, key: str) -> int:
    """The index (in ``cluster.ports``) of the primary that serves ``key``'s slot."""
    from redis.crc import key_slot

    slot = key_slot(key.encode())
    for start, end, primary, *_ in redis.Redis(port=cluster.port).execute_command("CLUSTER", "SLOTS"):
        if start <= slot <= end:
            return cluster.ports.index(int(primary[1]))
    raise AssertionError(f"no node serves slot {slot}")


def test_cluster_a_request_refused_while_the_control_node_froze_never_runs(redis_cluster_session):
    """On a Redis Cluster a request's items are queued at their level's node, then its record (the
    acceptance) at the control node. The control node freezes after the items were queued: the
    router answers 503 "not accepted", and that stays true: when the node resumes, the workers
    drop the items (no record by the deadline), and nothing is generated."""
    import os
    import signal

    from argusdiff.service.errors import QueueUnavailable
    from argusdiff.service.transport.redis_dispatch import AsyncRedisDispatch
    from argusdiff.service.transport.redis_streams import RedisKeys, RedisWorkQueue

    cluster = redis_cluster_session
    cluster.flush()
    keys = RedisKeys("ct")
    control = _node_of(cluster, keys.leader)
    level = next(f"lv{i}" for i in range(100) if _node_of(cluster, keys.stream(f"lv{i}")) != control)
    frozen = cluster.procs[control]

    async def scenario() -> bool:
        aio = AsyncRedisDispatch(cluster.url, namespace="ct", socket_timeout_s=0.5)
        try:
            await aio.enqueue([_item("gen-a-0", level)], ("gen-a", {"id": "gen-a"}, 60.0))  # clock, groups
            os.kill(frozen.pid, signal.SIGSTOP)
            try:
                await aio.enqueue([_item("gen-b-0", level)], ("gen-b", {"id": "gen-b"}, 60.0))
                return False
            except QueueUnavailable:
                return True
            finally:
                os.kill(frozen.pid, signal.SIGCONT)
        finally:
            await aio.close()

    assert asyncio.run(scenario())
    r = sync_client(cluster.url)
    assert r.exists("{ct}:req:gen-a") == 1 and r.exists("{ct}:req:gen-b") == 0
    assert r.xlen(keys.stream(level)) == 2  # both queued at the level's node; only gen-a accepted
    worker = RedisWorkQueue(cluster.url, namespace="ct", consumer="w")
    taken = [worker.get(level, timeout=0.2) for _ in range(3)]
    assert [t.request_id for t in taken if t is not None] == ["gen-a-0"]  # gen-b-0 dropped, never run
    assert r.xlen(keys.stream(level)) == 1 and worker.pending(level) == 1  # gen-a-0, taken


def _settings(url: str, **kw):
    return service_settings(redis_url=url, workers=0, **kw)


def _wait_workers(server, n: int, timeout: float = 30.0) -> None:
    def ok() -> bool:
        plan = server.service.router.plan
        joined = plan is not None and sum(lv is not None for lv in plan.assignment.values()) >= n
        return joined and len(server.service.serving) >= n

    assert wait_until(ok, timeout), f"fewer than {n} workers joined the plan and serve a level"


def _queue_errors(server) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    m = re.search(r"^argusdiff_queue_errors_total (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _post_many(url: str, n: int, prompt: str) -> list[int]:
    def one(i: int) -> int:
        try:
            return httpx.post(url, json={"prompt": f"{prompt} {i}", "wait": False}, timeout=30).status_code
        except httpx.HTTPError:
            return -1

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_freeze_turns_readyz_503_and_no_refused_request_is_generated(redis_server, live_service, worker_procs):
    server = live_service(_settings(redis_server.url), ready=False)
    worker_procs(redis_server.url, "w1", scale=0.01)
    _wait_workers(server, 1)
    assert wait_until(lambda: httpx.get(f"{server.url}/readyz").status_code == 200, 30, 0.1)
    url = f"{server.url}/v1/argusdiff/generations"
    before = _post_many(url, 3, "before")
    assert before == [202, 202, 202]
    redis_server.freeze()
    try:
        during = _post_many(url, 4, "during the freeze")  # they reach the enqueue before the router notices
        assert set(during) == {503}, during
    finally:
        redis_server.thaw()
    assert wait_until(lambda: httpx.get(f"{server.url}/readyz").status_code == 200, 30, 0.1)
    # a freeze with no traffic: the results listener alone notices it
    redis_server.freeze()
    try:
        assert wait_until(lambda: httpx.get(f"{server.url}/readyz").status_code == 503, 15, 0.1)
        body = httpx.get(f"{server.url}/readyz").json()
        assert body["queue_healthy"] is False and body["ready"] is False
    finally:
        redis_server.thaw()
    assert wait_until(lambda: httpx.get(f"{server.url}/readyz").status_code == 200, 30, 0.1)
    after = _post_many(url, 1, "after")
    assert after == [202]
    # every accepted request has its record; none of the refused ones does (none will be generated)
    assert _records(redis_server.url) == 4
    assert _queue_errors(server) >= 4


def test_restarted_redis_leaves_no_stale_connection(redis_server, live_service, worker_procs):
    server = live_service(_settings(redis_server.url), ready=False)
    worker_procs(redis_server.url, "w1", scale=0.01)
    _wait_workers(server, 1)
    url = f"{server.url}/v1/argusdiff/generations"
    assert set(_post_many(url, 8, "fills the pool")) == {202}  # several pooled connections
    errors = _queue_errors(server)
    redis_server.stop()
    redis_server.start()  # same port, AOF keeps the data
    assert wait_until(lambda: httpx.get(f"{server.url}/readyz").status_code == 200, 30, 0.1)
    statuses = _post_many(url, 8, "after the restart") + _post_many(url, 8, "and again")
    assert statuses.count(202) == len(statuses), statuses
    assert _queue_errors(server) - errors <= 1  # the listener saw the outage once; no request refused
