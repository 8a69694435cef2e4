"""The worker loop on tiny real pipelines: batches, timings, plan changes without dropping work,
failures, cascade deferral hand-off, and an in-process end-to-end AC run."""

from __future__ import annotations

import threading

import pytest

from argusdiff.domain import Plan, Strategy
from argusdiff.profile import load_profile
from argusdiff.service.transport.memory import InProcessWorkQueue
from workers.demo import load_demo_profile
from workers.executor import ExecutorFactory
from workers.loop import Worker
from workers.messages import TIMING_KEYS, WorkItem, WorkResult

pytestmark = pytest.mark.integration


@pytest.fixture
def demo_ac(demo_registry, memory_cache, hash_embedder):
    profile = load_profile("demo-cpu")
    return profile, ExecutorFactory(profile, demo_registry, memory_cache, embed=hash_embedder)


def _put(q, level, n, prefix="r", prompt="a red cube"):
    for i in range(n):
        q.put(level, WorkItem(f"{prefix}{i}", prompt, level, seed=i))


def test_worker_runs_batches_and_reports_timings(demo_ac):
    _, factory = demo_ac
    q = InProcessWorkQueue()
    _put(q, "xl-k0", 2)
    q.put("xl-k0", WorkItem("r2", "late", "xl-k0", seed=2, deadline_s=1.0))  # long past
    w = Worker("w0", q, factory, level="xl-k0", batch_size=2, poll_s=0.05)
    assert w.drain() == 3
    assert (w.stats.batches, w.stats.processed, w.stats.failed) == (2, 3, 0)
    assert q.pending("xl-k0") == 0 and q.acked == 3
    for i in range(3):
        res = q.wait_result(f"r{i}", timeout=0)
        assert res.ok and res.worker_id == "w0" and res.level == "xl-k0"
        assert set(TIMING_KEYS) <= set(res.timings) and res.timings["denoise_s"] > 0
        assert res.timings["queue_wait_s"] >= 0
        assert ("late_s" in res.timings) == (i == 2)
        if i == 2:
            assert res.timings["late_s"] > 1e9  # the deadline was 1970
    assert q.wait_result("r2", timeout=0) is None  # delivered once
    assert w.status()["model"] == "demo-tiny-sdxl" and "demo-tiny-sdxl" in w.status()["loaded_models"]


def test_ac_end_to_end_first_miss_then_hits(demo_ac, memory_cache):
    _, factory = demo_ac
    q = InProcessWorkQueue()
    w0 = Worker("w0", q, factory, level="xl-k0", poll_s=0.05)
    w4 = Worker("w4", q, factory, level="xl-k4", poll_s=0.05)
    q.put("xl-k0", WorkItem("first", "a castle on a hill at dawn", "xl-k0", seed=1))
    w0.drain()
    assert memory_cache.stores == 1
    q.put("xl-k4", WorkItem("second", "a castle on a hill at dawn", "xl-k4", seed=1))
    w4.drain()
    res = q.wait_result("second", timeout=0)
    assert res.ok and res.cache_hit and res.k_used == 4 and res.unet_calls == 4


def test_plan_change_switches_level_without_dropping_queued_work(demo_ac):
    _, factory = demo_ac
    q = InProcessWorkQueue()
    _put(q, "xl-k0", 2, prefix="a")
    _put(q, "xl-k2", 2, prefix="b")
    w = Worker("w0", q, factory, level="xl-k0", poll_s=0.05)
    assert w.run_once() == 1
    plan = Plan(
        version=7,
        created_s=0.0,
        strategy=Strategy.AC,
        levels=("xl-k0", "xl-k2", "xl-k4"),
        assignment={"w0": "xl-k2"},
        share=(0.0, 1.0, 0.0),
        pasm=((0, 1, 0), (0, 1, 0), (0, 1, 0)),
        predicted_qpm=1.0,
        expected_quality=0.97,
        batch_sizes={"xl-k2": 2},
    )
    w.apply_plan(plan)
    assert w.run_once() == 2  # the two xl-k2 items, one batch of the planned size
    assert w.level == "xl-k2" and w.plan_version == 7 and w.stats.switches == 2
    assert q.qsize("xl-k0") == 1  # still queued for the workers that keep xl-k0
    w.set_level("xl-k0")
    w.drain()
    assert q.qsize("xl-k0") == 0 and w.stats.processed == 4 and w.stats.failed == 0


def test_ac_worker_serves_unserved_sibling_levels_of_its_model(demo_ac):
    """NIRVANA's plan puts every worker at K = 0 and routes prompts to other K: a worker takes the
    queues of the AC levels of its model that no worker holds, in turn with its own, at their K."""
    profile, factory = demo_ac
    levels = {lv.id: lv for lv in profile.levels}
    q = InProcessWorkQueue()
    w = Worker("w0", q, factory, poll_s=0.05, levels=levels)
    served = Plan(
        version=1,
        created_s=0.0,
        strategy=Strategy.AC,
        levels=("xl-k0", "xl-k2", "xl-k4"),
        assignment={"w0": "xl-k0", "w1": "xl-k2"},
        share=(1.0, 0.0, 0.0),
        pasm=((1, 0, 0), (1, 0, 0), (1, 0, 0)),
        predicted_qpm=1.0,
        expected_quality=1.0,
    )
    w.apply_plan(served)
    assert w.sibling_levels == ("xl-k4",)  # xl-k2 has a worker of its own
    _put(q, "xl-k0", 2, prefix="a")
    _put(q, "xl-k2", 1, prefix="b")
    _put(q, "xl-k4", 2, prefix="c")
    assert w.drain() == 4
    assert q.qsize("xl-k2") == 1  # left for w1
    for rid in ("c0", "c1"):
        res = q.wait_result(rid, timeout=0)
        assert res.ok and res.level == "xl-k4" and res.worker_id == "w0"
    assert w.level == "xl-k0" and w.stats.switches == 1  # no model switch for a sibling
    # another model's levels are never siblings
    sm = load_demo_profile("demo-cpu-sm")
    other = Worker("w9", q, factory, poll_s=0.05, levels={**levels, **{lv.id: lv for lv in sm.levels}})
    mixed = Plan(
        version=2,
        created_s=0.0,
        strategy=Strategy.AC,
        levels=("xl-k0", *sm.ids),
        assignment={"w9": "xl-k0"},
        share=(1.0,) + (0.0,) * len(sm.ids),
        pasm=tuple((1.0,) + (0.0,) * len(sm.ids) for _ in range(1 + len(sm.ids))),
        predicted_qpm=1.0,
        expected_quality=1.0,
    )
    other.apply_plan(mixed)
    assert other.sibling_levels == ()


def test_switching_to_another_model_loads_it_and_keeps_serving(demo_registry):
    profile = load_demo_profile("demo-cpu-sm")
    q = InProcessWorkQueue()
    w = Worker("w0", q, ExecutorFactory(profile, demo_registry), level="xl", poll_s=0.01)
    _put(q, "xl", 1, prefix="x")
    _put(q, "sd-1step", 2, prefix="s")
    w.drain()
    w.set_level("sd-1step")
    w.drain()
    assert w.stats.processed == 3 and len(w.stats.switch_s) == 2
    assert q.wait_result("s1", timeout=0).unet_calls == 1
    assert w.status()["model"] == "demo-tiny-sd-1step"
    assert {"demo-tiny-sdxl", "demo-tiny-sd-1step"} <= set(w.status()["load_times_s"])


def test_failures_become_error_results_and_work_is_acked(demo_registry):
    class Boom:
        level_id, model = "x", "m"

        def run(self, items):
            raise RuntimeError("GPU fell off")

    q = InProcessWorkQueue()
    _put(q, "x", 2)
    w = Worker("w0", q, lambda level: Boom(), level="x", batch_size=2, poll_s=0.05)
    assert w.run_once() == 2
    res = q.wait_result("r0", timeout=0)
    assert not res.ok and res.error == "GPU fell off" and res.error_type == "RuntimeError"
    assert w.stats.failed == 2 and q.pending("x") == 0 and "GPU fell off" in w.status()["last_error"]


def test_unknown_level_keeps_the_worker_on_its_current_level(demo_ac):
    _, factory = demo_ac
    q = InProcessWorkQueue()
    w = Worker("w0", q, factory, level="xl-k0", poll_s=0.01)
    w.run_once()
    w.set_level("no-such-level")
    w.run_once()
    assert w.level == "xl-k0" and "no-such-level" in w.last_error


def test_cascade_deferral_is_handed_back_with_the_light_image(demo_registry):
    """A rejected light image is published with a hand-off item for the heavy level (the router's
    policy decides what follows, see tests/test_decision_path.py); the heavy level's redo of it
    is marked deferred."""
    profile = load_demo_profile("demo-cpu-cascade")
    conf = iter([0.9, 0.1])
    factory = ExecutorFactory(profile, demo_registry, judge=lambda image: next(conf), threshold=0.5)
    q = InProcessWorkQueue()
    q.put("sd-light", WorkItem("ok", "a cat", "sd-light", seed=1, deadline_s=1e12, enqueue_s=5.0))
    q.put("sd-light", WorkItem("bad", "a dog", "sd-light", seed=2, deadline_s=1e12, enqueue_s=5.0))
    light = Worker("light", q, factory, level="sd-light", batch_size=2, poll_s=0.05)
    heavy = Worker("heavy", q, factory, level="sd-heavy", poll_s=0.05)
    light.run_once()
    accepted = q.wait_result("ok", timeout=0)
    assert accepted.ok and accepted.level == "sd-light" and accepted.confidence == pytest.approx(0.9)
    assert accepted.unet_calls == 1 and "judge_s" in accepted.timings and accepted.handoff is None
    rejected = q.wait_result("bad", timeout=0)
    assert (
        rejected.level == "sd-light" and rejected.image_png is not None
    )  # the light image, kept if the policy says so
    item = rejected.handoff
    assert item is not None and item.level == "sd-heavy" and item.meta["deferred_from"] == "sd-light"
    assert (item.request_id, item.seed, item.deadline_s, item.enqueue_s) == ("bad", 2, 1e12, 5.0)
    assert q.qsize("sd-heavy") == 0 and light.stats.handed_off == 1 and light.stats.processed == 1
    assert WorkResult.from_dict(rejected.to_dict()).handoff == item  # crosses Redis intact
    q.put("sd-heavy", item)  # what the router does when the policy sends it to the heavy level
    heavy.drain()
    redone = q.wait_result("bad", timeout=0)
    assert redone.ok and redone.level == "sd-heavy" and redone.worker_id == "heavy" and redone.unet_calls == 8
    assert redone.deferred and redone.handoff is None


def test_plan_threshold_reaches_the_cascade_light_worker(demo_registry):
    profile = load_demo_profile("demo-cpu-cascade")
    factory = ExecutorFactory(profile, demo_registry, judge=lambda image: 0.5, threshold=0.9)
    q = InProcessWorkQueue()
    w = Worker("light", q, factory, level="sd-light", poll_s=0.01)
    q.put("sd-light", WorkItem("a", "a cat", "sd-light", seed=1))
    w.run_once()
    assert q.wait_result("a", timeout=0).handoff.level == "sd-heavy"  # 0.5 < 0.9: deferred
    plan = Plan(
        version=3,
        created_s=0.0,
        strategy=Strategy.CASCADE,
        levels=("sd-heavy", "sd-light"),
        assignment={"light": "sd-light"},
        share=(0.0, 1.0),
        pasm=((1, 0), (0, 1)),
        predicted_qpm=1.0,
        expected_quality=1.0,
        thresholds={"sd-light": 0.25},
    )
    w.apply_plan(plan)
    q.put("sd-light", WorkItem("b", "a dog", "sd-light", seed=2))
    w.run_once()
    assert q.wait_result("b", timeout=0).level == "sd-light"  # 0.5 >= 0.25: accepted


def test_threaded_worker_stops_cleanly(demo_ac):
    _, factory = demo_ac
    q = InProcessWorkQueue()
    done = threading.Event()
    seen: list[WorkResult] = []

    def on_result(r):
        seen.append(r)
        if len(seen) == 2:
            done.set()

    w = Worker("w0", q, factory, level="xl-k4", poll_s=0.05, on_result=on_result).start()
    _put(q, "xl-k4", 2)
    assert done.wait(120)
    w.stop()
    assert len(seen) == 2 and all(r.ok for r in seen)
    assert q.pending("xl-k4") == 0


def test_worker_takes_its_own_queue_first_and_releases_it_when_it_leaves_the_level(demo_ac):
    """Delivery PER_WORKER: items naming w0 wait in w0's own queue of the level; w1 at the same
    level does not take them; when w0 moves to another level its own queue of the old one goes to
    the level's shared queue, and w1 serves it: nothing is stranded or lost."""
    from workers.queue import WORKER_META

    _, factory = demo_ac
    q = InProcessWorkQueue()
    for i in range(2):
        q.put("xl-k0", WorkItem(f"m{i}", "a red cube", "xl-k0", seed=i, meta={WORKER_META: "w0"}))
    w0 = Worker("w0", q, factory, level="xl-k0", poll_s=0.05)
    w1 = Worker("w1", q, factory, level="xl-k0", poll_s=0.05)
    assert w1.run_once() == 0  # not w1's
    assert w0.run_once() == 1 and w0.stats.processed == 1
    w0.set_level("xl-k2")
    assert w0.run_once() == 0  # it switched: m1 released to the level's queue
    assert q.qsize("xl-k0") == 1 and q.requeued == 1
    assert w1.drain() == 1 and w1.stats.processed == 1
    assert q.qsize("xl-k0") == 0 and q.pending("xl-k0") == 0 and q.acked == 2
