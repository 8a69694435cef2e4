"""The discrete-event simulator: determinism, faults, re-planning, cache outage, batching, loads."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from argusdiff.policies import make_policy
from argusdiff.simulator import SimConfig, minute_metrics, parse_faults, quick_workload, simulate, summarize
from argusdiff.simulator.engine import DROPPED, SERVED
from argusdiff.simulator.faults import Fault

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _unit_embeddings(n: int, seed: int = 0) -> np.ndarray:
    """Clustered unit vectors: prompts in one cluster are similar (cosine ~0.9), others are not."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(max(1, n // 10), 384))
    e = centers[np.arange(n) % len(centers)] + 0.35 * rng.normal(size=(n, 384))
    return (e / np.linalg.norm(e, axis=1, keepdims=True)).astype(np.float32)


def run(name, profile, wl, *, seed=0, fallback=None, **cfg):
    opts = {"fallback": fallback} if fallback is not None else {}
    if name == "diffserve-static":
        opts["peak_qpm"] = float(np.max(np.bincount((wl.arrivals_s // 60).astype(int))))
    period = cfg.pop("period_s", 1.0 if name.startswith("diffserve") else 60.0)
    opts["period_s"] = period
    pol = make_policy(name, profile, rng=np.random.default_rng(seed), config=opts)
    return simulate(pol, wl, SimConfig(seed=seed, period_s=period, **cfg))


def test_deterministic_for_a_seed(ac, sm):
    wl = quick_workload("poisson:qpm=120,duration=10m", [ac, sm], n_prompts=300, confusion=0.1)
    a = run("argus", ac, wl, seed=3, fallback=sm, jitter=0.1)
    b = run("argus", ac, wl, seed=3, fallback=sm, jitter=0.1)
    c = run("argus", ac, wl, seed=4, fallback=sm, jitter=0.1)
    assert np.array_equal(a.level, b.level)
    assert np.array_equal(a.finish_s, b.finish_s, equal_nan=True)
    assert summarize(a)["within_slo"] == summarize(b)["within_slo"]
    assert not np.array_equal(a.finish_s, c.finish_s, equal_nan=True)


def test_every_request_is_accounted_for(ac, sm):
    wl = quick_workload("bursty:low=30,high=200,period=4m,duration=12m", [ac, sm], n_prompts=300)
    res = run("proteus", sm, wl)
    assert np.all((res.status == SERVED) | (res.status == DROPPED))
    m = minute_metrics(res)
    assert m["offered_qpm"].sum() == wl.n_requests
    assert m["throughput_qpm"].sum() == np.sum(res.status == SERVED)
    assert np.all(m["gpu_utilization"] <= 1.0 + 1e-9)
    served = res.status == SERVED
    assert np.all(res.finish_s[served] >= wl.arrivals_s[served])


def test_worker_failure_replans_within_one_period_and_requeues_work(ac, sm):
    wl = quick_workload("poisson:qpm=60,duration=20m", [ac, sm], n_prompts=300)
    faults = (Fault("gpus", 330.0, 600.0, 4),)
    res = run("argus", ac, wl, fallback=sm, faults=faults)
    # the first plan after the failure (t=360, within one 60 s period) uses only the 4 up workers
    after = [p for p in res.plans if 330.0 < p["t"] <= 390.0]
    assert after and after[0]["workers"] == 4
    back = [p for p in res.plans if p["t"] >= 990.0]
    assert back and back[0]["workers"] == 8
    # nothing is lost: requests queued on the failed workers were re-dispatched and served
    assert np.sum(res.status == DROPPED) == 0
    assert np.sum(res.status == SERVED) == wl.n_requests
    # no batch runs on a failed worker while it is down
    for w, s, e in res.busy:
        if w >= 4:
            assert e <= 330.0 + 1e-9 or s >= 930.0 - 1e-9


def test_cache_outage_switches_argus_to_small_models_and_back(ac, sm):
    wl = quick_workload("poisson:qpm=80,duration=30m", [ac, sm], n_prompts=300, embeddings=_unit_embeddings(300))
    faults = (Fault("cache", 600.0, 600.0),)
    res = run("argus", ac, wl, fallback=sm, faults=faults, cache_prefill=0.5)
    strategies = [(p["t"], p["strategy"]) for p in res.plans]
    assert all(s == "ac" for t, s in strategies if t < 600.0)
    # detected within one control period of the outage
    assert dict(strategies)[660.0] == "sm"
    assert any("AC -> SM" in " ".join(p["notes"]) for p in res.plans)
    # switched back once the probes see a healthy cache
    assert any(s == "ac" for t, s in strategies if t >= 1200.0)
    # during the outage no request is a cache hit
    during = (wl.arrivals_s >= 600.0) & (wl.arrivals_s < 1200.0)
    assert not res.cache_hit[during].any()
    # SM levels were loaded while switching (model loads happened)
    assert len(res.loads) > 0


def test_cache_fills_as_prompts_are_served(ac, sm):
    wl = quick_workload("poisson:qpm=100,duration=20m", [ac, sm], n_prompts=200)
    res = run("nirvana", ac, wl, cache_prefill=0.0)
    first = wl.arrivals_s < 120
    late = wl.arrivals_s > 900
    assert res.cache_hit[late].mean() > res.cache_hit[first].mean() + 0.3


def test_batching_and_model_loads(cascade):
    wl = quick_workload("poisson:qpm=400,duration=5m", [cascade], n_prompts=300)
    res = run("diffserve", cascade, wl)
    # some batches hold more than one request
    from argusdiff.simulator.engine import Simulator

    pol = make_policy("diffserve", cascade, rng=np.random.default_rng(0), config={"period_s": 1.0})
    sim = Simulator(pol, wl, SimConfig(period_s=1.0))
    sim.run()
    sizes = [b.size for b in sim.busy]
    assert max(sizes) > 1
    assert summarize(res)["deferred"] > 0


def test_fault_spec_parsing():
    f = parse_faults("gpus:half@10m+40m;cache@1h+5m", gpus=8, duration_s=7200)
    assert f[0] == Fault("gpus", 600.0, 2400.0, 4)
    assert f[1] == Fault("cache", 3600.0, 300.0)
    assert len(parse_faults("argus", gpus=8, duration_s=48000)) == 2
    from argusdiff.errors import ConfigError

    for bad in ("gpus:9@1m+1m", "disk@1m+1m", "gpus:2@1m", "cache@x+1m", "gpus:2@1m+0s"):
        with pytest.raises(ConfigError, match="--faults"):
            parse_faults(bad, gpus=8, duration_s=600)


def test_imports_stay_light():
    code = (
        "import sys, argusdiff.policies, argusdiff.simulator, argusdiff.replay, argusdiff.report, "
        "argusdiff.commands.replay\n"
        "from argusdiff.policies import policy_class, POLICIES\n"
        "[policy_class(n) for n in POLICIES]\n"
        "heavy = ('torch', 'diffusers', 'transformers', 'timm', 'open_clip', 'matplotlib')\n"
        "bad = [m for m in heavy if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_requests_wait_while_every_worker_is_down(ac, sm):
    wl = quick_workload("poisson:qpm=40,duration=10m", [ac, sm], n_prompts=200)
    res = run("argus", ac, wl, fallback=sm, faults=(Fault("gpus", 120.0, 180.0, 8),))
    assert np.sum(res.status == DROPPED) == 0
    during = (wl.arrivals_s >= 120.0) & (wl.arrivals_s < 300.0)
    assert during.any()
    # requests that arrived during the outage finish only after the workers are back
    assert np.all(res.finish_s[during] > 300.0)
    # and are spread over the returning workers rather than piled on one
    late = [w for w, s, _e in res.busy if 300.0 <= s < 330.0]
    assert len(set(late)) >= 4


def _with_delivery(name, profile, delivery, seed=0):
    pol = make_policy(name, profile, rng=np.random.default_rng(seed))
    pol.delivery = delivery
    return pol


def test_per_worker_delivery_serves_on_the_policys_worker(sm):
    """Proteus declares per-worker delivery (canary_routing: one device's queue): every request is
    served on the worker its route picked, so the picks' imbalance queues work while other workers
    of the level are idle; the shared per-level pull of the same picks does not."""
    from argusdiff.domain import Delivery
    from argusdiff.policies.base import REGISTRY

    assert REGISTRY["proteus"].delivery is Delivery.PER_WORKER
    assert REGISTRY["nirvana"].delivery is Delivery.PER_WORKER
    assert REGISTRY["sommelier"].delivery is Delivery.PER_WORKER
    assert REGISTRY["argus"].delivery is Delivery.SHARED
    wl = quick_workload("poisson:qpm=60,duration=10m", [sm], n_prompts=300)
    picks: list[str | None] = []
    pol = _with_delivery("proteus", sm, Delivery.PER_WORKER)
    route = pol.route

    def spy(request, plan, view):
        a = route(request, plan, view)
        picks.append(a.worker)
        return a

    pol.route = spy
    own = simulate(pol, wl, SimConfig(seed=0))
    shared = simulate(_with_delivery("proteus", sm, Delivery.SHARED), wl, SimConfig(seed=0))
    assert len(picks) == wl.n_requests
    served = own.status == SERVED
    assert served.sum() == wl.n_requests
    assert [f"w{w}" for w in own.worker] == picks  # each on its pick
    # the same levels either way (same rng draws); only the wait differs
    assert np.array_equal(own.level, shared.level)
    assert not np.array_equal(own.worker, shared.worker)
    late_own = np.sum(own.finish_s - wl.arrivals_s > own.req_slo_s)
    late_shared = np.sum(shared.finish_s - wl.arrivals_s > shared.req_slo_s)
    assert late_own > late_shared


def test_per_worker_queue_of_a_failed_worker_is_requeued(sm):
    """Work waiting in a failed worker's own queue is not lost: it is dispatched again (the policy
    picks an up worker) and served."""
    from argusdiff.domain import Delivery

    wl = quick_workload("poisson:qpm=90,duration=20m", [sm], n_prompts=300)
    faults = (Fault("gpus", 330.0, 600.0, 4),)
    res = simulate(_with_delivery("proteus", sm, Delivery.PER_WORKER), wl, SimConfig(seed=0, faults=faults))
    assert np.sum(res.status == SERVED) == wl.n_requests
    moved = 0
    for w, s, e in res.busy:
        if w >= 4:
            assert e <= 330.0 + 1e-9 or s >= 930.0 - 1e-9
    for i in range(wl.n_requests):
        if wl.arrivals_s[i] < 330.0 < res.finish_s[i]:
            moved += res.worker[i] < 4
    assert moved > 0


def test_events_at_one_instant_keep_their_order(sm):
    """At one instant: the period's end, then a look inside the period (only strictly before the
    period's end), then the arrival, then the heap's events in the order they were pushed; loads
    ending together re-plan once."""
    import heapq

    from argusdiff.simulator.engine import Simulator
    from argusdiff.simulator.events import (
        Arrival,
        ModelLoaded,
        PeriodCheck,
        PeriodTick,
        Redispatch,
        WorkersDown,
        WorkerUp,
    )
    from argusdiff.simulator.state import INF

    wl = quick_workload("poisson:qpm=60,duration=2m", [sm], n_prompts=20)
    pol = make_policy("argus", sm, rng=np.random.default_rng(0), config={"period_s": 60.0})
    sim = Simulator(pol, wl, SimConfig(gpus=2))
    sim._start(wl.n_requests, 2)
    t = float(wl.arrivals_s[0])
    sim._push(WorkerUp(t, 1))
    sim._push(Redispatch(t, 0))
    sim._push(WorkersDown(t, 1, 5.0))
    sim.next_tick = sim.next_check = t
    assert type(sim._next_event()) is PeriodTick  # a look at the period's end is not taken first
    sim.next_tick = t + 1e-6
    order = []
    while len(order) < 5:
        ev = sim._next_event()
        order.append(type(ev))
        if isinstance(ev, PeriodCheck):
            sim.next_check = INF
        assert ev.t == t
        if isinstance(ev, Arrival):
            assert ev.i == 0 and sim.next_i == 1
    assert order == [PeriodCheck, Arrival, WorkerUp, Redispatch, WorkersDown]
    assert not sim.heap

    # two loads ending at one instant: the first handled takes the second off the heap, one plan
    plans = []
    sim.plan = None
    sim._new_plan = lambda plan, t, warm: plans.append(t)  # type: ignore[method-assign]
    sim.resident[0]["m"] = sim.resident[1]["m"] = 7.0
    sim._push(ModelLoaded(7.0, 0, "m"))
    sim._push(ModelLoaded(7.0, 1, "m"))
    sim._push(Redispatch(7.0, 1))
    first = heapq.heappop(sim.heap)[2]
    first.handle(sim)
    assert plans == [7.0] and [type(e[2]) for e in sim.heap] == [Redispatch]
