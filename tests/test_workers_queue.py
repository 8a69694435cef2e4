"""WorkItem/WorkResult records and the in-process work queue (no torch)."""

from __future__ import annotations

import sys
import threading

import pytest

from argusdiff.service.transport.memory import InProcessWorkQueue
from workers.messages import TIMING_KEYS, WorkItem, WorkResult
from workers.queue import WorkQueue


def test_records_round_trip_through_dicts():
    item = WorkItem("r1", "a red cube", "k2", seed=7, deadline_s=12.5, enqueue_s=10.0, meta={"tier": "batch"})
    back = WorkItem.from_dict(item.to_dict(), receipt="x")
    assert back == item and back.receipt == "x"
    res = WorkResult(
        "r1", "k2", image_png=b"\x89PNG..", timings=dict.fromkeys(TIMING_KEYS, 0.5), k_used=2, cache_hit=True
    )
    again = WorkResult.from_dict(res.to_dict())
    assert again == res and again.ok and again.total_s == pytest.approx(2.5)


def test_work_item_rejects_bad_fields():
    with pytest.raises(ValueError, match="request_id"):
        WorkItem("", "p", "k0")
    with pytest.raises(ValueError, match="seed"):
        WorkItem("r", "p", "k0", seed="7")  # type: ignore[arg-type]


def test_failure_result_names_the_error():
    res = WorkResult.failure(WorkItem("r", "p", "k0", seed=1), KeyError("boom"), worker_id="w0")
    assert not res.ok and res.error_type == "KeyError" and set(res.timings) == set(TIMING_KEYS)


def test_queue_fifo_ack_nack_and_counts():
    q = InProcessWorkQueue()
    assert isinstance(q, WorkQueue)
    for i in range(3):
        q.put("a", WorkItem(f"r{i}", "p", "a"))
    q.put("b", WorkItem("rb", "p", "b"))
    assert (q.qsize("a"), q.qsize("b")) == (3, 1)
    first = q.get("a", timeout=0)
    assert first.request_id == "r0" and first.receipt and first.enqueue_s > 0
    assert (q.qsize("a"), q.pending("a")) == (2, 1)
    q.nack(first)  # back to the front, attempt counted
    assert (q.qsize("a"), q.pending("a")) == (3, 0)
    again = q.get("a", timeout=0)
    assert again.request_id == "r0" and again.attempt == 1
    q.ack(again)
    q.ack(again)  # idempotent
    assert q.acked == 1 and q.pending("a") == 0
    assert q.get("c", timeout=0) is None


def test_queue_pulls_the_highest_priority_tier_first():
    """At one level, interactive work is taken before standard and batch work queued earlier
    (FIFO within a tier; an untiered item ranks as standard); a nack returns an item to the front
    of its own tier, and the counts cover every tier."""
    q = InProcessWorkQueue()
    order = [("b1", "batch"), ("s1", "standard"), ("u1", None), ("b2", "batch"), ("i1", "interactive"),
             ("s2", "standard"), ("i2", "interactive")]  # fmt: skip
    for rid, tier in order:
        q.put("a", WorkItem(rid, "p", "a", meta={"tier": tier} if tier else {}))
    assert q.qsize("a") == 7
    first = q.get("a", timeout=0)
    assert first.request_id == "i1" and first.tier == "interactive"
    nxt = q.get("a", timeout=0)
    assert nxt.request_id == "i2"
    assert (q.qsize("a"), q.pending("a")) == (5, 2)
    q.nack(nxt)  # back to the front of the interactive tier, ahead of the standard work
    q.ack(first)
    taken = []
    while (item := q.get("a", timeout=0)) is not None:
        taken.append(item.request_id)
        q.ack(item)
    assert taken == ["i2", "s1", "u1", "s2", "b1", "b2"]
    assert (q.qsize("a"), q.pending("a"), q.acked, q.requeued) == (0, 0, 7, 1)


def test_embedded_queue_cancel_and_migrate_keep_the_tier_order():
    from argusdiff.service.transport.memory import LocalWorkQueue

    q = LocalWorkQueue()
    for rid, tier in [("b1", "batch"), ("s1", "standard"), ("i1", "interactive"), ("i2", "interactive")]:
        q.put("a", WorkItem(rid, "p", "a", meta={"tier": tier}))
    q.put("c", WorkItem("c1", "p", "c", meta={"tier": "interactive"}))
    assert q.cancel("i1") and not q.cancel("i1")
    assert q.migrate("a", "c") == 3
    taken = [q.get("c", timeout=0).request_id for _ in range(4)]
    assert taken == ["c1", "i2", "s1", "b1"] and q.get("a", timeout=0) is None


def test_results_are_delivered_once_across_threads():
    q = InProcessWorkQueue()
    got = []
    t = threading.Thread(target=lambda: got.append(q.wait_result("r9", timeout=30)))
    t.start()
    q.result("r9", WorkResult("r9", "a", error="x"))
    t.join(30)
    assert got and got[0].request_id == "r9"
    assert q.wait_result("r9", timeout=0) is None


def test_importing_workers_records_does_not_import_torch():
    import subprocess

    code = (
        "import workers.executor, workers.queue, workers.registry, workers.loop, workers.demo, workers.errors, "
        "argusdiff.commands.generate, sys; print('torch' in sys.modules or 'diffusers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_per_worker_queue_in_process():
    """An item that names a worker (delivery PER_WORKER) waits in that worker's own queue: another
    worker of the level does not take it; released (the worker left the level) or re-queued (it
    died), it goes to the level's shared queue, and nothing is lost."""
    from argusdiff.service.transport.memory import LocalWorkQueue
    from workers.queue import WORKER_META

    q = LocalWorkQueue()
    for i in range(3):
        q.put("a", WorkItem(request_id=f"r{i}", prompt="p", level="a", meta={WORKER_META: "w1"}))
    q.put("a", WorkItem(request_id="s0", prompt="p", level="a"))
    assert q.qsize("a") == 4
    got = q.get("a", timeout=0, worker="w2")  # w2: the shared queue only
    assert got is not None and got.request_id == "s0"
    assert q.get("a", timeout=0, worker="w2") is None
    mine = q.get("a", timeout=0, worker="w1")  # w1: its own queue first
    assert mine is not None and mine.request_id == "r0"
    q.nack(mine)  # given back: to the shared queue (w1 is switching or leaving)
    assert q.release("a", "w1") == 2  # r1, r2: w1 left the level
    q.put("a", WorkItem(request_id="d0", prompt="p", level="a", meta={WORKER_META: "w3"}))
    assert q.requeue_consumer("a", "w3") == 1  # w3 died
    taken = []
    while (item := q.get("a", timeout=0, worker="w2")) is not None:
        taken.append(item.request_id)
    assert taken == ["r0", "r1", "r2", "d0"] and q.qsize("a") == 0


def test_control_loop_releases_queues_of_levels_a_worker_left():
    """Delivery PER_WORKER: items a router queued on a worker's own queue of a level with an older
    plan, after the worker moved or left, go to the level's shared queue at the next plan; the
    queue of a worker no longer in the plan is forgotten once empty."""
    from types import SimpleNamespace

    from argusdiff.domain import Plan, Strategy
    from argusdiff.service.control import ControlLoop
    from argusdiff.service.transport.memory import LocalWorkQueue
    from workers.queue import WORKER_META

    def plan(assignment):
        return Plan(
            version=1, created_s=0.0, strategy=Strategy.SM, levels=("a", "b"), assignment=assignment,
            share=(0.5, 0.5), pasm=((1, 0), (0, 1)), predicted_qpm=1.0, expected_quality=1.0,
        )  # fmt: skip

    q = LocalWorkQueue()
    q.put("a", WorkItem(request_id="late0", prompt="p", level="a", meta={WORKER_META: "w0"}))
    q.put("a", WorkItem(request_id="gone0", prompt="p", level="a", meta={WORKER_META: "w9"}))
    q.put("b", WorkItem(request_id="stay", prompt="p", level="b", meta={WORKER_META: "w1"}))
    loop = SimpleNamespace(
        router=SimpleNamespace(per_worker=True), queue=q, levels={}, migrated=0, level_ids=("a", "b")
    )
    ControlLoop._release_strays(loop, plan({"w0": "b", "w1": "b"}))
    assert loop.migrated == 2 and q.requeued == 2
    assert q.owners("a") == set() and q.owners("b") == {"w1"}  # released; w1 still serves b
    got = sorted(q.get("a", timeout=0, worker="w8").request_id for _ in range(2))
    assert got == ["gone0", "late0"]  # on the level's shared queue
    assert q.get("b", timeout=0, worker="w8") is None  # w1 still serves b: its queue stays its own
    loop.router.per_worker = False
    q.put("a", WorkItem(request_id="x", prompt="p", level="a", meta={WORKER_META: "w0"}))
    ControlLoop._release_strays(loop, plan({"w0": "b"}))
    assert loop.migrated == 2  # a SHARED policy's plan moves nothing
