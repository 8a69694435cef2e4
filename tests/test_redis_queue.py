"""RedisWorkQueue against a real redis-server: delivery, ack, re-queue of a dead consumer,
migration between levels, results with expiry, plan and heartbeats."""

from __future__ import annotations

import json

import pytest

from argusdiff.service.errors import QueueUnavailable
from argusdiff.service.images import LocalImageStore
from argusdiff.service.transport.redis_control import RedisControlStore
from argusdiff.service.transport.redis_streams import RedisWorkQueue
from workers.messages import WorkItem, WorkResult

pytestmark = pytest.mark.integration


def _item(i: int, level: str = "a") -> WorkItem:
    return WorkItem(request_id=f"r{i}", prompt=f"prompt {i}", level=level, seed=i)


def test_put_get_ack_fifo(redis_any, tmp_path):
    images = LocalImageStore(tmp_path)
    q = RedisWorkQueue(redis_any.url, namespace="t1", consumer="w1", images=images)
    rid = "gen-" + "0" * 24 + "-0"
    q.put("a", WorkItem(request_id=rid, prompt="prompt 0", level="a", seed=0))
    for i in range(1, 3):
        q.put("a", _item(i))
    assert q.qsize("a") == 3
    got = q.get("a", timeout=0.1)
    assert got is not None and got.request_id == rid and got.receipt.startswith("a|")
    assert got.enqueue_s > 0
    assert q.qsize("a") == 2 and q.pending("a") == 1
    q.result(rid, WorkResult(request_id=rid, level="a", image_png=b"png"))
    q.ack(got)
    assert q.pending("a") == 0
    # the claim check: Redis names the image, the image store holds it
    stored = json.loads(q.r.get(q.keys.result(rid)))
    assert stored["image_png"] is None and stored["image_ref"] == f"{rid}.png" and images.get(f"{rid}.png") == b"png"
    assert q.wait_result(rid, timeout=1).image_png == b"png"
    assert [q.get("a", timeout=0.1).request_id for _ in range(2)] == ["r1", "r2"]
    assert q.get("a", timeout=0.05) is None


def test_dead_consumer_entries_are_requeued(redis_any):
    dead = RedisWorkQueue(redis_any.url, namespace="t2", consumer="dead")
    alive = RedisWorkQueue(redis_any.url, namespace="t2", consumer="alive")
    control = RedisWorkQueue(redis_any.url, namespace="t2", consumer="control")
    for i in range(4):
        control.put("a", _item(i))
    taken = [dead.get("a", timeout=0.1) for _ in range(2)]
    assert all(taken)
    assert control.pending_by_consumer("a") == {"dead": 2}
    assert control.requeue_consumer("a", "dead") == 2
    assert control.pending("a") == 0

    def names() -> set[str]:
        return {c["name"].decode() for c in control.r.xinfo_consumers(control.keys.stream("a"), control.keys.group)}

    assert "dead" in names()
    control.drop_consumer("a", "dead")  # the control loop forgets the dead worker's consumer
    assert "dead" not in names()
    ids = []
    while (item := alive.get("a", timeout=0.05)) is not None:
        ids.append((item.request_id, item.attempt))
        alive.ack(item)
    assert sorted(ids) == [("r0", 1), ("r1", 1), ("r2", 0), ("r3", 0)]


def test_autoclaim_of_long_idle_entries(redis_any):
    dead = RedisWorkQueue(redis_any.url, namespace="t3", consumer="dead")
    other = RedisWorkQueue(redis_any.url, namespace="t3", consumer="other", claim_idle_s=0.0)
    dead.put("a", _item(0))
    assert dead.get("a", timeout=0.1) is not None
    got = other.get("a", timeout=0.1)
    assert got is not None and got.request_id == "r0" and got.attempt == 1
    other.ack(got)
    assert other.pending("a") == 0


def test_nack_and_migrate(redis_any):
    q = RedisWorkQueue(redis_any.url, namespace="t4", consumer="w")
    q.put("a", _item(0))
    q.put("a", _item(1))
    got = q.get("a", timeout=0.1)
    q.nack(got)
    assert q.pending("a") == 0 and q.qsize("a") == 2
    assert q.migrate("a", "b") == 2
    assert q.qsize("a") == 0 and q.qsize("b") == 2
    moved = q.get("b", timeout=0.1)
    assert moved.level == "b" and moved.meta["migrated_from"] == "a"


def test_plan_and_heartbeats(redis_any):
    q = RedisControlStore(redis_any.url, namespace="t5")
    assert q.read_plan_data() is None
    q.publish_plan_data({"version": 3, "assignment": {"w": "a"}})
    assert q.read_plan_data()["version"] == 3
    q.beat("w1", {"level": "a"}, ttl_s=10)
    q.beat("w2", {"level": None}, ttl_s=0.001)
    import time

    time.sleep(0.01)
    alive, dead = q.heartbeats()
    assert set(alive) == {"w1"} and alive["w1"]["level"] == "a" and dead == {"w2"}


def test_unreachable_redis_raises_queue_unavailable(redis_server):
    q = RedisWorkQueue(redis_server.url, namespace="t6", consumer="w", socket_timeout_s=0.5)
    redis_server.stop()
    with pytest.raises(QueueUnavailable):
        q.put("a", _item(0))
    assert not q.ping()


def _tiered(rid: str, tier: str | None, level: str = "a") -> WorkItem:
    return WorkItem(request_id=rid, prompt=rid, level=level, meta={"tier": tier} if tier else {})


def test_workers_pull_the_highest_priority_tier_first(redis_any):
    """One stream per (level, tier), untiered and standard work on the level's plain stream; a
    worker takes interactive work first, FIFO within a tier; the counts cover every stream."""
    q = RedisWorkQueue(redis_any.url, namespace="t7", consumer="w")
    for rid, tier in [("b1", "batch"), ("s1", "standard"), ("u1", None), ("b2", "batch"), ("i1", "interactive"),
                      ("s2", "standard"), ("i2", "interactive")]:  # fmt: skip
        q.put("a", _tiered(rid, tier))
    assert q.r.xlen(q.keys.stream("a")) == 3 and q.r.xlen(q.keys.stream("a", "interactive")) == 2
    assert q.keys.stream("a", None) == q.keys.stream("a", "standard") == "{t7:q:a}"  # the level's hash tag
    assert q.keys.stream("a", "batch") == "{t7:q:a}@batch"
    assert q.qsize("a") == 7
    first, nxt = q.get("a", timeout=0.1), q.get("a", timeout=0.1)
    assert (first.request_id, nxt.request_id) == ("i1", "i2") and first.tier == "interactive"
    assert (q.qsize("a"), q.pending("a"), q.pending_by_consumer("a")) == (5, 2, {"w": 2})
    q.nack(nxt)  # back at the end of the interactive stream: still ahead of every other tier
    q.ack(first)
    taken = []
    while (item := q.get("a", timeout=0.05)) is not None:
        taken.append(item.request_id)
        q.ack(item)
    assert taken == ["i2", "s1", "u1", "s2", "b1", "b2"]
    assert (q.qsize("a"), q.pending("a")) == (0, 0)


def test_tier_streams_requeue_migrate_and_block(redis_any):
    import threading
    import time

    dead = RedisWorkQueue(redis_any.url, namespace="t8", consumer="dead")
    control = RedisWorkQueue(redis_any.url, namespace="t8", consumer="control")
    for rid, tier in [("b1", "batch"), ("i1", "interactive"), ("s1", None)]:
        dead.put("a", _tiered(rid, tier))
    got = [dead.get("a", timeout=0.1) for _ in range(3)]
    assert [g.request_id for g in got] == ["i1", "s1", "b1"]
    assert control.pending_by_consumer("a") == {"dead": 3}
    assert control.requeue_consumer("a", "dead") == 3  # every tier's stream
    assert (control.pending("a"), control.qsize("a")) == (0, 3)
    control.drop_consumer("a", "dead")
    assert control.migrate("a", "b") == 3 and control.qsize("b") == 3
    moved = [control.get("b", timeout=0.1) for _ in range(3)]
    assert [m.request_id for m in moved] == ["i1", "s1", "b1"] and all(m.attempt == 1 for m in moved)
    assert control.r.xlen(control.keys.stream("b", "batch")) == 1
    for m in moved:
        control.ack(m)
    # a worker blocked on an empty level wakes for work of any tier
    out = []
    waiter = threading.Thread(target=lambda: out.append(control.get("c", timeout=5)))
    waiter.start()
    time.sleep(0.2)
    dead.put("c", _tiered("late", "batch"))
    waiter.join(10)
    assert out and out[0].request_id == "late" and out[0].tier == "batch"
    control.ack(out[0])
    assert control.pending("c") == 0


def test_router_enqueue_and_cancel_on_tier_streams(redis_any):
    import asyncio

    from argusdiff.service.transport.redis_dispatch import AsyncRedisDispatch

    async def go():
        aio = AsyncRedisDispatch(redis_any.url, namespace="t9")
        try:
            entries = await aio.enqueue([_tiered("i1", "interactive"), _tiered("s1", "standard")])
            assert entries[0].startswith("interactive@") and "@" not in entries[1]
            assert await aio.cancel("a", entries[0]) and not await aio.cancel("a", entries[0])
            assert await aio.cancel("a", entries[1])
        finally:
            await aio.close()

    asyncio.run(go())
    q = RedisWorkQueue(redis_any.url, namespace="t9", consumer="w")
    assert q.qsize("a") == 0 and q.get("a", timeout=0.05) is None


def test_workers_back_off_with_jitter_when_redis_is_down(redis_server):
    """A worker whose Redis is gone retries after waits that double up to the cap, each drawn from
    [w/2, w], so workers that lost one Redis together do not retry in step; once Redis answers,
    the wait starts from the base again."""
    from argusdiff.service.transport.redis_control import RedisControlStore
    from argusdiff.service.worker import RECONNECT_BASE_S, RECONNECT_CAP_S, ServiceWorker

    def worker(name: str) -> ServiceWorker:
        q = RedisWorkQueue(redis_server.url, namespace="t10", consumer=name, socket_timeout_s=0.5)
        sw = ServiceWorker(name, q, RedisControlStore.sharing(q), lambda level: None, level_ids=("a",))
        sw.worker.run_once = lambda: int(q.get("a", timeout=0.01) is not None)  # one real read of the queue
        return sw

    a, b = worker("wa"), worker("wb")
    assert a.step() == 0 and b.step() == 0  # Redis answers: nothing queued
    redis_server.stop()
    waits: dict[str, list[float]] = {"wa": [], "wb": []}
    for sw in (a, b):
        sw._pause = lambda t, w=waits[sw.worker_id]: w.append(t) or len(w) >= 8  # stop after 8 waits
        assert sw.step() == 0
    for seq in waits.values():
        bounds = [min(RECONNECT_CAP_S, RECONNECT_BASE_S * 2**k) for k in range(len(seq))]
        assert len(seq) == 8 and all(b / 2 <= w <= b for w, b in zip(seq, bounds, strict=True)), seq
    assert waits["wa"] != waits["wb"]  # drawn independently
    redis_server.start()
    again: list[float] = []
    a._pause = lambda t: again.append(t) or False
    assert a.step() == 0 and again == []  # reconnected: no wait, and the backoff is reset
    assert a.reconnect_wait() <= RECONNECT_BASE_S


def _mine(rid: str, worker: str, tier: str | None = None, level: str = "a") -> WorkItem:
    from workers.queue import WORKER_META

    meta = {WORKER_META: worker, **({"tier": tier} if tier else {})}
    return WorkItem(request_id=rid, prompt="p", level=level, meta=meta)


def test_per_worker_streams_deliver_to_their_worker(redis_any):
    """Delivery PER_WORKER: an item naming a worker waits on that worker's own stream of the level
    (hash-tagged with the level: one slot), taken only by that worker (its own first, then the
    level's); a nack returns it to the level's stream; ``release`` moves the unread rest there."""
    w1 = RedisWorkQueue(redis_any.url, namespace="t10", consumer="w1")
    w2 = RedisWorkQueue(redis_any.url, namespace="t10", consumer="w2")
    keys = w1.keys
    assert (
        keys.stream("a", None, "w1") == "{t10:q:a}:w:w1" and keys.stream("a", "batch", "w1") == "{t10:q:a}:w:w1@batch"
    )
    for i in range(3):
        w1.put("a", _mine(f"m{i}", "w1"))
    w1.put("a", _item(9))  # the level's stream
    assert w1.r.xlen(keys.stream("a", None, "w1")) == 3 and w1.r.xlen(keys.stream("a")) == 1
    got = w2.get("a", timeout=0.05, worker="w2")
    assert got is not None and got.request_id == "r9"
    w2.ack(got)
    assert w2.get("a", timeout=0.05, worker="w2") is None  # w1's items are not w2's
    mine = w1.get("a", timeout=0.05, worker="w1")
    assert mine is not None and mine.request_id == "m0" and mine.receipt == f"a|w1#{mine.receipt.split('#')[1]}"
    w1.ack(mine)
    assert w1.r.xlen(keys.stream("a", None, "w1")) == 2
    m1 = w1.get("a", timeout=0.05, worker="w1")
    w1.nack(m1)  # given back: to the level's stream
    assert w1.release("a", "w1") == 1  # m2, unread
    assert w1.r.xlen(keys.stream("a", None, "w1")) == 0 and w1.r.xlen(keys.stream("a")) == 2
    ids = []
    while (item := w2.get("a", timeout=0.05, worker="w2")) is not None:
        ids.append((item.request_id, item.attempt))
        w2.ack(item)
    assert sorted(ids) == [("m1", 1), ("m2", 0)]
    assert w1.pending("a") == 0 and w1.qsize("a") == 0


def test_dead_workers_own_stream_is_requeued(redis_any):
    """A worker that dies with items on its own streams (taken and unread, of several tiers) loses
    none: the control loop's ``requeue_consumer`` puts them all on the level's streams."""
    dead = RedisWorkQueue(redis_any.url, namespace="t11", consumer="wd")
    control = RedisWorkQueue(redis_any.url, namespace="t11", consumer="control")
    alive = RedisWorkQueue(redis_any.url, namespace="t11", consumer="wa")
    for i in range(3):
        control.put("a", _mine(f"s{i}", "wd"))
    control.put("a", _mine("i0", "wd", "interactive"))
    taken = [dead.get("a", timeout=0.05, worker="wd") for _ in range(2)]
    assert [t.request_id for t in taken] == ["i0", "s0"]
    assert control.requeue_consumer("a", "wd") == 4  # 2 taken (re-queued) + 2 unread (released)
    control.drop_consumer("a", "wd")
    for tier in (None, "interactive", "batch"):
        stream = control.keys.stream("a", tier, "wd")
        assert control.r.xlen(stream) == 0
        assert int(control.r.xpending(stream, control.keys.group)["pending"]) == 0
    ids = []
    while (item := alive.get("a", timeout=0.05, worker="wa")) is not None:
        ids.append((item.request_id, item.attempt))
        alive.ack(item)
    assert sorted(ids) == [("i0", 1), ("s0", 1), ("s1", 0), ("s2", 0)]
    assert control.requeue_consumer("a", "wd") == 0  # nothing twice


def test_router_enqueue_and_cancel_on_a_workers_stream(redis_any):
    import asyncio

    from argusdiff.service.transport.redis_dispatch import AsyncRedisDispatch

    async def go():
        aio = AsyncRedisDispatch(redis_any.url, namespace="t12")
        try:
            entries = await aio.enqueue([_mine("x0", "w1", "interactive"), _mine("x1", "w1"), _mine("x2", "w2")])
            assert entries[0].startswith("w1#interactive@") and entries[1].startswith("w1#")
            assert await aio.cancel("a", entries[0]) and not await aio.cancel("a", entries[0])
        finally:
            await aio.close()

    asyncio.run(go())
    q = RedisWorkQueue(redis_any.url, namespace="t12", consumer="w2")
    assert q.get("a", timeout=0.05, worker="w2").request_id == "x2"
    assert q.get("a", timeout=0.05, worker="w2") is None
    w1 = RedisWorkQueue(redis_any.url, namespace="t12", consumer="w1")
    assert w1.get("a", timeout=0.05, worker="w1").request_id == "x1"


def test_stray_worker_streams_are_swept_and_forgotten(redis_any):
    """The control loop's sweep: a router registers a worker's own stream (``owners``) before it
    queues there; the queue of a worker that left is released to the level's stream and, once
    empty, forgotten; an item queued there again later (a router's old plan) is still released."""
    q = RedisWorkQueue(redis_any.url, namespace="t13", consumer="control")
    q.put("a", _mine("g0", "gone", "interactive"))
    assert q.owners("a") == {"gone"}
    assert not q.forget_owner("a", "gone")  # not empty
    assert q.release("a", "gone") == 1 and q.forget_owner("a", "gone")
    assert q.owners("a") == set() and not q.r.exists(*q.keys.streams("a", "gone"))
    # a router with an older plan queues there again (its group cache says the stream exists)
    q.r.sadd(q.keys.owners("a"), "gone")
    q.r.xadd(q.keys.stream("a", None, "gone"), {"item": json.dumps(_mine("g1", "gone").to_dict())})
    assert q.owners("a") == {"gone"} and q.release("a", "gone") == 1
    w = RedisWorkQueue(redis_any.url, namespace="t13", consumer="w")
    assert sorted(w.get("a", timeout=0.05, worker="w").request_id for _ in range(2)) == ["g0", "g1"]
