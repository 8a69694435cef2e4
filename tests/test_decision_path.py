"""One decision path: the simulator and the live router + dispatcher (embedded queues, in-process
stand-in workers) take the same decisions for the same requests, plan and observations.

Both paths call the same policy (``Policy.decide`` on arrival, ``Policy.decide_heavy`` on a
cascade deferral). The test feeds a request sequence to the simulator, then the same sequence to
a live router whose clock is a virtual one that the stand-in workers advance by the profiled
latencies they "run" (so the live router sees the same times as the simulator), and compares
every request's outcome: refused on arrival, the level that served it, whether the cascade
deferred it, and whether the policy dropped it after the light stage; for a policy whose delivery
is ``PER_WORKER`` (Proteus) also the worker that served it, which both paths take from the policy's
pick (for a ``SHARED`` one the worker is whichever pulls first, in both paths alike). Requests arrive one at a
time (each done before the next), so both paths observe idle queues; per-request deadlines and
minimum quality levels vary so that floors, refusals, deferrals and drops all happen.

The control path's looks inside a period (``Policy.check_s``, argus+'s re-planning within the
minute) are held to the same contract: the live control loop shows the policy the same period so
far as the simulator does, and publishes only a plan the policy made anew.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import numpy as np
import pytest

from argusdiff.admission import AdmissionConfig
from argusdiff.config import Settings
from argusdiff.domain import Delivery, level_catalogue
from argusdiff.policies import make_policy
from argusdiff.profile import load_profile
from argusdiff.service.dispatch import LocalDispatch
from argusdiff.service.errors import ApiError
from argusdiff.service.metrics import ServiceMetrics
from argusdiff.service.router import Router
from argusdiff.service.schemas import GenerationSpec
from argusdiff.simulator import SimConfig, quick_workload, simulate
from workers.loop import Worker
from workers.messages import handoff_item
from workers.standin import StandInExecutor

GPUS = 4
SPACING_S = 200.0  # every request finishes long before the next arrives
N = 40
PERIOD_S = 10_000.0  # one plan for the whole sequence (N x SPACING_S < PERIOD_S)
DEMAND_QPM = {"sm-a100": 60.0, "cascade-sdturbo-sdv15": 300.0}  # what the plan is made for
ADMISSION = AdmissionConfig()  # admission after the policy, the service's default, in both paths


class VirtualClock:
    """The live router's clock; the stand-in workers' ``sleep`` advances it."""

    def __init__(self) -> None:
        self.t = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.t

    def advance(self, dt: float) -> None:
        with self._lock:
            self.t += dt

    def at_least(self, t: float) -> None:
        with self._lock:
            self.t = max(self.t, t)


def _sequence(profile, n: int, seed: int):
    """Per request: deadline (s; NaN = the deployment's) and minimum quality level (or None)."""
    rng = np.random.default_rng(seed)
    ids = profile.ids
    if profile.cascade is not None:
        light, heavy = profile.level(profile.cascade.light), profile.level(profile.cascade.heavy)
        lat_l, lat_h, disc = light.latency(1), heavy.latency(1), profile.cascade.discriminator_latency_s
        # refused at once (the light run alone misses 1.5 x SLO); dropped if deferred (light + heavy
        # miss it); generous
        choices = [0.5 * lat_l / 1.5, (lat_l + disc + 0.5 * lat_h) / 1.5, 100.0, float("nan")]
    else:
        fastest, best = profile.fastest.latency(1), profile.best.latency(1)
        choices = [fastest * 1.2, best * 0.8, 1000.0, float("nan")]
    slo = np.array([choices[k] for k in rng.integers(0, len(choices), n)])
    floor = tuple(ids[k] if k < len(ids) else None for k in rng.integers(0, 2 * len(ids), n))
    return slo, floor


def _workload(profile, seed: int = 0):
    base = quick_workload("poisson:qpm=10,duration=2m", [profile], n_prompts=60, seed=seed)
    slo, floor = _sequence(profile, N, seed)
    prompt_idx = np.random.default_rng(seed + 1).integers(0, len(base.prompts), N)
    return dataclasses.replace(
        base,
        arrivals_s=np.arange(N, dtype=np.float64) * SPACING_S + 1.0,
        prompt_idx=prompt_idx,
        slo_s=slo,
        tier=None,
        min_quality=floor,
    )


def _sim_outcomes(policy_name: str, profile, wl):
    pol = make_policy(
        policy_name, profile, rng=np.random.default_rng(7), config={"backend": "highs", "period_s": PERIOD_S}
    )
    seen = []
    real_plan = pol.plan

    def plan(stats):
        # plan for a demand that spreads the workers over several levels (the trace itself is
        # sparse so that both paths see idle queues)
        stats = dataclasses.replace(
            stats, arrivals=int(DEMAND_QPM[profile.name] * stats.period_s / 60.0), arrival_bins=(), bin_s=0.0
        )
        seen.append(stats)
        return real_plan(stats)

    pol.plan = plan
    res = simulate(pol, wl, SimConfig(gpus=GPUS, period_s=PERIOD_S, seed=0, admission=ADMISSION))
    per_worker = pol.delivery is Delivery.PER_WORKER
    out = []
    for i in range(wl.n_requests):
        if res.status[i] == 2:  # dropped
            out.append(("dropped",) if res.deferred[i] else ("refused",))
        else:
            worker = f"w{res.worker[i]}" if per_worker else None
            out.append(("served", res.level_ids[res.level[i]], bool(res.deferred[i]), worker))
    return out, seen[0]


class _Oracle:
    description = "oracle (the simulator's predictions)"

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table

    def submit(self, prompt: str):
        from concurrent.futures import Future

        fut: Future = Future()
        fut.set_result(self.table[prompt])
        return fut


async def _live_outcomes(policy_name: str, profile, wl, stats):
    pol = make_policy(
        policy_name, profile, rng=np.random.default_rng(7), config={"backend": "highs", "period_s": PERIOD_S}
    )
    plan = pol.plan(stats)
    clock = VirtualClock()
    settings = Settings.model_validate({"profile": profile.name, "service": {"policy": policy_name, "workers": 0}})
    optimal = wl.optimal[profile.ids]
    oracle = _Oracle({wl.prompts[p]: profile.ids[int(optimal[p])] for p in range(len(wl.prompts))})
    dispatch = LocalDispatch()
    await dispatch.start()
    router = Router(
        profile=profile,
        policy=pol,
        dispatch=dispatch,
        metrics=ServiceMetrics(),
        config=settings.service,
        classifier=oracle,
        clock=clock,
        admission=ADMISSION,
    )
    levels = level_catalogue(profile)
    confidence = (
        {wl.prompts[p]: float(wl.confidence[p]) for p in range(len(wl.prompts))} if wl.confidence is not None else None
    )
    cascade = profile.cascade

    def factory(level_id: str):
        level = levels[level_id]
        if confidence is not None and cascade is not None and level_id == cascade.light:
            return StandInExecutor(
                level,
                1.0,
                sleep=clock.advance,
                judge=lambda item: confidence[item.prompt],
                heavy=cascade.heavy,
                judge_s=cascade.discriminator_latency_s,
                threshold=cascade.thresholds[len(cascade.thresholds) // 2],  # until a plan sets one
            )
        return StandInExecutor(level, 1.0, sleep=clock.advance)

    workers = [Worker(f"w{k}", dispatch.queue, factory, levels=levels, poll_s=0.005) for k in range(GPUS)]
    for w in workers:
        w.apply_plan(plan)
        w.start()
    router.set_plan(plan, frozenset(plan.assignment))
    out = []
    try:
        for i in range(wl.n_requests):
            clock.at_least(float(wl.arrivals_s[i]))
            slo = float(wl.slo_s[i])
            spec = GenerationSpec(
                prompt=wl.prompts[int(wl.prompt_idx[i])],
                response_format="b64_json",
                slo_s=None if np.isnan(slo) else slo,
                min_quality_level=wl.min_quality[i],
                seed=i,
            )
            try:
                sub = await router.submit(spec)
            except ApiError as exc:
                assert exc.status == 429, exc
                out.append(("refused",))
                continue
            res = (await router.wait(sub, 60))[0]
            if res.error_type == "Dropped":
                out.append(("dropped",))
            else:
                assert res.ok, res.error
                worker = res.worker_id if router.per_worker else None
                out.append(("served", res.level, bool(res.deferred), worker))
    finally:
        for w in workers:
            w.stop()
        await dispatch.close()
    return out, plan, router


@pytest.mark.parametrize(
    ("policy_name", "profile_name"),
    [
        ("argus", "sm-a100"),
        ("argus+", "sm-a100"),
        ("proteus", "sm-a100"),  # Delivery.PER_WORKER
        ("sommelier", "sm-a100"),  # Delivery.PER_WORKER
        ("diffserve", "cascade-sdturbo-sdv15"),
        ("proteus", "cascade-sdturbo-sdv15"),
    ],
)
def test_simulator_and_live_router_take_the_same_decisions(policy_name, profile_name):
    profile = load_profile(profile_name)
    wl = _workload(profile)
    sim, stats = _sim_outcomes(policy_name, profile, wl)
    live, _plan, router = asyncio.run(_live_outcomes(policy_name, profile, wl, stats))
    assert len(live) == len(sim) == N
    diffs = [(i, s, v) for i, (s, v) in enumerate(zip(sim, live, strict=True)) if s != v]
    assert not diffs, f"{len(diffs)} of {N} decisions differ (request, simulator, live): {diffs[:5]}"
    kinds = {o[0] for o in sim}
    assert "served" in kinds
    if router.per_worker:  # each on the worker its policy picked, in both paths, and not on one alone
        assert len({o[3] for o in sim if o[0] == "served"}) >= 2
    served_levels = {o[1] for o in sim if o[0] == "served"}
    if policy_name == "diffserve":
        # every kind of cascade decision happened, in both paths alike
        assert router.handoffs["heavy"] > 0 and router.handoffs["dropped"] > 0
        assert "refused" in kinds and "dropped" in kinds
        assert any(o[0] == "served" and o[2] for o in sim)  # redone at the heavy level
        assert sum(1 for o in sim if o[0] == "dropped") == router.handoffs["dropped"]
    elif profile.cascade is not None:
        # a policy that does not cascade keeps every light image the stand-in judge rejected
        assert router.handoffs["kept"] > 0 and router.handoffs["heavy"] == 0
    elif policy_name != "sommelier":  # Sommelier serves each worker's own level: every one at SD-XL here
        assert len(served_levels) >= 2  # floors and deadlines moved requests across levels
    assert router.level_load.total() == 0 and not router.inflight


def _light_worker_defers(worker, light: str, heavy: str) -> None:
    """A light worker of the cascade takes its item and hands it back to the heavy level (a
    confidence of 0.01, below every threshold)."""
    from workers.messages import WorkResult

    item = worker.get(light, timeout=5)
    assert item is not None and item.level == light
    worker.result(
        item.request_id,
        WorkResult(
            request_id=item.request_id,
            level=light,
            image_png=b"light",
            confidence=0.01,
            handoff=handoff_item(item, heavy, 0.01),
        ),
    )
    worker.ack(item)


def test_redis_cascade_handoff_is_decided_once_by_the_policy(redis_any, tmp_path):
    """Redis mode, two routers: a hand-off published by a light worker is decided by exactly one
    router's policy — redone at the heavy level (one heavy item) or dropped — and the client's
    synchronous wait ends with the final result."""
    from argusdiff.domain import ClusterStats
    from argusdiff.service.dispatch import RedisDispatch
    from argusdiff.service.images import LocalImageStore
    from argusdiff.service.transport.redis_streams import RedisWorkQueue
    from workers.messages import WorkResult

    profile = load_profile("cascade-sdturbo-sdv15")
    light, heavy = profile.cascade.light, profile.cascade.heavy
    ns = "handoff"
    settings = Settings.model_validate({"profile": profile.name, "service": {"policy": "diffserve", "workers": 0}})
    stats = ClusterStats(now_s=0.0, period_s=60.0, arrivals=200, workers=("w0", "w1", "w2"))

    images = LocalImageStore(tmp_path / "images")  # what Redis names, the routers and the worker share

    async def main():
        routers = []
        for _ in range(2):
            dispatch = RedisDispatch(redis_any.url, namespace=ns, images=images)
            await dispatch.start()
            pol = make_policy("diffserve", profile, rng=np.random.default_rng(0), config={"backend": "highs"})
            router = Router(
                profile=profile, policy=pol, dispatch=dispatch, metrics=ServiceMetrics(), config=settings.service
            )
            plan = pol.plan(stats)
            assert plan.workers_at(heavy) and plan.workers_at(light)
            router.set_plan(plan, frozenset(plan.assignment))
            routers.append(router)
        worker = RedisWorkQueue(redis_any.url, namespace=ns, consumer="w0", images=images)

        a, b = routers
        try:
            # generous deadline: the heavy level redoes it, once
            sub = await a.submit(GenerationSpec(prompt="a red kite", response_format="b64_json", slo_s=100.0))
            waiting = asyncio.ensure_future(a.wait(sub, 30))
            await asyncio.to_thread(_light_worker_defers, worker, light, heavy)
            item = await asyncio.to_thread(worker.get, heavy, 10)
            assert item is not None and item.request_id == sub.request_ids[0]
            assert item.meta["deferred_from"] == light
            assert await asyncio.to_thread(worker.get, heavy, 0.5) is None  # decided once, not twice
            assert a.handoffs["heavy"] + b.handoffs["heavy"] == 1
            worker.result(item.request_id, WorkResult(request_id=item.request_id, level=heavy, image_png=b"heavy"))
            worker.ack(item)
            res = (await waiting)[0]
            assert res.level == heavy and images.get(res.image_ref) == b"heavy"

            # a deadline the heavy run cannot meet after the light one: dropped, the wait ends
            slo = (profile.level(light).latency(1) + 0.5 * profile.level(heavy).latency(1)) / 1.5
            sub = await a.submit(GenerationSpec(prompt="a blue kite", response_format="b64_json", slo_s=slo))
            waiting = asyncio.ensure_future(a.wait(sub, 30))
            await asyncio.to_thread(_light_worker_defers, worker, light, heavy)
            res = (await waiting)[0]
            assert res.error_type == "Dropped" and not res.ok
            assert a.handoffs["dropped"] + b.handoffs["dropped"] == 1
            assert await asyncio.to_thread(worker.get, heavy, 0.5) is None
            assert not a.inflight and a.level_load.total() == 0
        finally:
            for r in routers:
                await r.dispatch.close()

    asyncio.run(main())


def test_a_claimed_handoff_whose_requeue_fails_is_carried_out_when_redis_answers(redis_server, tmp_path):
    """The router that claimed a cascade hand-off could not re-queue it (Redis failed between the
    claim and the enqueue): the hand-off stays pending and is carried out, once, when Redis answers
    again, and the client's wait ends with the heavy result. Before, the claim stayed set, nobody
    could take it, and the request was lost."""
    from argusdiff.domain import ClusterStats
    from argusdiff.service.dispatch import RedisDispatch
    from argusdiff.service.errors import QueueUnavailable
    from argusdiff.service.images import LocalImageStore
    from argusdiff.service.transport.redis_streams import RedisWorkQueue
    from workers.messages import WorkResult

    profile = load_profile("cascade-sdturbo-sdv15")
    light, heavy = profile.cascade.light, profile.cascade.heavy
    ns = "handoff-retry"
    settings = Settings.model_validate({"profile": profile.name, "service": {"policy": "diffserve", "workers": 0}})
    stats = ClusterStats(now_s=0.0, period_s=60.0, arrivals=200, workers=("w0", "w1", "w2"))
    images = LocalImageStore(tmp_path / "images")

    async def main():
        dispatch = RedisDispatch(redis_server.url, namespace=ns, images=images)
        await dispatch.start()
        pol = make_policy("diffserve", profile, rng=np.random.default_rng(0), config={"backend": "highs"})
        router = Router(
            profile=profile, policy=pol, dispatch=dispatch, metrics=ServiceMetrics(), config=settings.service
        )
        plan = pol.plan(stats)
        router.set_plan(plan, frozenset(plan.assignment))
        worker = RedisWorkQueue(redis_server.url, namespace=ns, consumer="w0", images=images)
        real_enqueue = dispatch.aio.enqueue
        failed = []

        async def enqueue_failing_once(items, *args, deadline=True, **kw):
            if not deadline and not failed:  # the hand-off's re-queue, the first time
                failed.append(items[0].request_id)
                raise QueueUnavailable("redis unavailable: injected")
            return await real_enqueue(items, *args, deadline=deadline, **kw)

        dispatch.aio.enqueue = enqueue_failing_once
        try:
            sub = await router.submit(GenerationSpec(prompt="a red kite", response_format="b64_json", slo_s=100.0))
            waiting = asyncio.ensure_future(router.wait(sub, 30))

            await asyncio.to_thread(_light_worker_defers, worker, light, heavy)
            item = await asyncio.to_thread(worker.get, heavy, 15)
            assert failed == [sub.request_ids[0]]  # the first re-queue failed ...
            assert item is not None and item.request_id == sub.request_ids[0]  # ... and it was retried
            await asyncio.sleep(2.5)  # a catch-up reads the light result again: not decided twice
            assert not dispatch._handoffs_pending
            assert await asyncio.to_thread(worker.get, heavy, 0.5) is None
            worker.result(item.request_id, WorkResult(request_id=item.request_id, level=heavy, image_png=b"heavy"))
            worker.ack(item)
            res = (await waiting)[0]
            assert res.level == heavy and images.get(res.image_ref) == b"heavy"
        finally:
            await dispatch.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("policy_name", "profile_name"),
    [
        ("argus", "sm-a100"),
        ("argus", "sdxl-ac-a100"),
        ("argus+", "sm-a100"),
        ("pac", "sm-a100"),
        ("proteus", "sm-a100"),
        ("sommelier", "sm-a100"),
        ("nirvana", "sdxl-ac-a100"),
        ("diffserve", "cascade-sdturbo-sdv15"),
        ("clipper-ht", "sm-a100"),
    ],
)
def test_route_reads_nothing_plan_changes(policy_name, profile_name):
    """The service runs ``plan()`` in a thread while the event loop routes, without a lock: the
    data path must read only the published plan (immutable), the routing object it carries and
    the view — never state ``plan()`` changes. Of the policy it reads its entry points, its
    generator and the level table it was built with; Sommelier's send log is a deque (thread-safe
    at both ends): route appends, plan drains."""
    import pickle

    from argusdiff.domain import ClusterStats, Request
    from argusdiff.policies.base import RouteView

    profile = load_profile(profile_name)
    pol = make_policy(policy_name, profile, rng=np.random.default_rng(0), config={"backend": "highs"})
    workers = ("w0", "w1", "w2", "w3")
    plan = pol.plan(ClusterStats(now_s=60.0, period_s=60.0, arrivals=120, workers=workers))

    def state() -> dict[str, bytes]:
        out = {}
        for k, v in vars(pol).items():
            try:
                out[k] = pickle.dumps(v)
            except Exception:  # not picklable: compared by identity
                out[k] = repr(id(v)).encode()
        return out

    before = state()
    affinity = {profile.ids[-1]: 30, profile.ids[0]: 10}
    pol.plan(ClusterStats(now_s=120.0, period_s=60.0, arrivals=300, workers=workers, affinity=affinity))
    after = state()
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert changed  # plan() keeps state between periods

    reads: set[str] = set()
    cls = type(pol)

    def traced(self, name):
        if not name.startswith("__"):
            reads.add(name)
        return object.__getattribute__(self, name)

    pol.__class__ = type(f"Traced{cls.__name__}", (cls,), {"__getattribute__": traced})
    try:
        view = RouteView(now_s=130.0, busy_until=dict.fromkeys(workers, 0.0), up=set(workers), slo_s=pol.slo_s)
        for k, lv in enumerate(profile.ids * 3):
            view.optimal_level = lv
            view.cache_similarity = 0.7
            req = Request(id=str(k), prompt="p", arrival_s=130.0, min_quality_level=profile.ids[k % len(profile.ids)])
            pol.decide(req, plan, view)
            pol.decide_heavy(req, plan, view)
    finally:
        pol.__class__ = cls
    allowed = {"sent"} if policy_name == "sommelier" else set()
    assert not (reads & changed) - allowed, f"route() reads state plan() changes: {sorted((reads & changed) - allowed)}"
    entry = {"decide", "decide_heavy", "route", "route_heavy", "routing_of", "at_least", "within_models"}
    assert reads - entry - allowed <= {"rng", "_all_levels", "slo_s"}, sorted(reads)  # slo_s: the view above


def test_live_view_spreads_a_levels_load_over_its_pulling_workers():
    """The router's RouteView of a level's queue: its in-flight requests spread evenly over the
    level's workers (2 in flight on 4 workers: 2 busy, 2 idle), so a policy sees an idle worker
    where the simulator would, not every worker one request deep."""
    from argusdiff.domain import ClusterStats
    from argusdiff.policies.base import select_worker

    profile = load_profile("cascade-sdturbo-sdv15")
    settings = Settings.model_validate({"profile": profile.name, "service": {"policy": "diffserve", "workers": 0}})
    pol = make_policy("diffserve", profile, rng=np.random.default_rng(0), config={"backend": "highs"})
    plan = pol.plan(ClusterStats(now_s=0.0, period_s=60.0, arrivals=2000, workers=("w0", "w1", "w2", "w3", "w4")))
    level = max(plan.levels, key=lambda lv: len(plan.workers_at(lv)))
    ws = plan.workers_at(level)
    assert len(ws) >= 2
    router = Router(
        profile=profile, policy=pol, dispatch=LocalDispatch(), metrics=ServiceMetrics(), config=settings.service
    )
    b = max(1, plan.batch_sizes.get(level, 1))
    lv = profile.level(level)
    lat = lv.latency(1)
    for load in range(3 * len(ws)):
        router.level_load[level] = load
        view = router.view(100.0, plan, None, 10.0)
        q = sorted(view.queue_lengths[w] for w in ws)
        assert sum(q) == load and q[-1] - q[0] <= 1
        w = select_worker(ws, view, lat)
        q = load // len(ws)  # the least loaded worker's queue, in batches of up to b
        full, rest = divmod(q, b)
        drain = full * lv.latency(b) + (lv.latency(rest) if rest else 0.0) - 0.5 * lv.latency(min(q, b)) if q else 0.0
        assert view.busy_until[w] == pytest.approx(100.0 + drain)


def test_pooled_ac_plan_is_pulled_alike_by_the_simulator_the_workers_and_admission():
    """argus+'s work-conserving AC plan (``pooled``): every AC worker pulls every K level's queue.
    The simulator's pullers, the live workers' levels and sibling levels, and admission's serving
    workers agree level by level; the policy routes with every worker at every level."""
    from argusdiff.admission import serving_workers
    from argusdiff.domain import ClusterStats
    from argusdiff.simulator.engine import Simulator

    profile = load_profile("sdxl-ac-a100")
    pol = make_policy("argus+", profile, rng=np.random.default_rng(0), config={"backend": "highs"})
    ws = tuple(f"w{k}" for k in range(GPUS))
    plan = pol.plan(ClusterStats(now_s=0.0, period_s=60.0, arrivals=70, workers=ws))
    assert set(plan.assignment.values()) == {profile.ac_base(profile.ids[-1]).id}  # pooled at K = 0
    assert sum(1 for n in pol._planned.values() if n is not None) == GPUS  # the allocation, kept for the next one
    levels = level_catalogue(profile)
    wl = quick_workload("poisson:qpm=10,duration=1m", [profile], n_prompts=20)
    sim = Simulator(pol, wl, SimConfig(gpus=GPUS))
    sim.widx = {w: k for k, w in enumerate(ws)}
    sim.wids = ws
    sim.up = [True] * GPUS
    sim.wlevel = [None] * GPUS
    sim.pinned = [frozenset()] * GPUS
    sim.model = [None] * GPUS
    sim.resident = [{} for _ in ws]
    sim.plans = []
    sim.loads = []
    sim.load_end = [0.0] * GPUS
    sim.free_at = [0.0] * GPUS
    sim.dq = [[] for _ in ws]
    from argusdiff.policies.base import RouteView

    sim.view = RouteView(busy_until={w: 0.0 for w in ws}, worker_models={w: None for w in ws})
    sim._apply(plan, 0.0, True)
    live = [Worker(w, None, lambda lv: None, levels=levels) for w in ws]
    for w in live:
        w.apply_plan(plan)
    r = plan.routing
    for lv in profile.ids:
        simulated = {ws[k] for k in sim.pullers.get(lv, ())}
        pulled = {w.worker_id for w in live if w.target_level == lv or lv in w.sibling_levels}
        assert simulated == pulled == set(serving_workers(plan, levels, lv)) == set(ws), lv
        assert set(r.workers[r.index[lv]]) == set(ws)


def test_live_view_counts_a_per_worker_policys_queue_by_its_worker():
    """Delivery PER_WORKER: the live view's queue length of a worker is what waits in its own queue
    (the images routed to it and not done), not an even share of the level's load."""
    from argusdiff.service.router import _InFlight

    profile = load_profile("sm-a100")
    pol = make_policy("proteus", profile, rng=np.random.default_rng(0))
    from argusdiff.domain import ClusterStats

    settings = Settings.model_validate({"profile": profile.name, "service": {"policy": "proteus", "workers": 0}})
    router = Router(
        profile=profile, policy=pol, dispatch=LocalDispatch(), metrics=ServiceMetrics(), config=settings.service
    )
    lv = profile.levels[0].id
    base = pol.plan(ClusterStats(now_s=0.0, period_s=60.0, arrivals=60, workers=("w0", "w1")))
    plan = dataclasses.replace(base, assignment={"w0": lv, "w1": lv})
    assert router.per_worker
    for k in range(3):
        router.inflight[f"r{k}"] = _InFlight(lv, 0.0, 10.0, 1, "w0")
        router.worker_load["w0"] += 1
        router.level_load[lv] += 1
    view = router.view(0.0, plan, None, 10.0)
    assert view.queue_lengths == {"w0": 3, "w1": 0}
    router.on_done("r0", {"level": lv, "ok": True})
    assert router.view(0.0, plan, None, 10.0).queue_lengths == {"w0": 2, "w1": 0}
    assert router.worker_load["w0"] == 2 and router.level_load[lv] == 2


def test_the_live_loop_shows_the_policy_the_period_so_far_as_the_simulator_does():
    """One decision path for checks: the live control loop's CHECK stats (the period so far, binned
    from the period's start) equal the simulator's for the same arrivals; the period goes on
    counting; a check whose plan is the policy's last publishes nothing."""
    from fixtures_service import service_settings

    from argusdiff.domain import PlanTrigger
    from argusdiff.predictors import bin_length_s
    from argusdiff.service.app import Service
    from argusdiff.simulator import Simulator

    async def scenario():
        service = Service(service_settings(profile="sdxl-ac-a100", workers=0, policy="argus+", control_period_s=60.0))
        await service.dispatch.start()
        store, control, router = service.store, service.control, service.router
        assert control.check_s == 10.0
        store.beat("w1", {"level": None}, ttl_s=60)
        start = 1_000_000.3
        control.last_tick = start - 60.0
        control.clock = lambda: start
        for k in range(60):  # a first period at 60 QPM
            router._arrived(start - 60.0 + k + 0.5, 1)
        await control.tick()
        version = store.read_plan().version
        seen = []
        plan = service.policy.plan
        service.policy.plan = lambda stats: seen.append(stats) or plan(stats)
        control.clock = lambda: start + 20.0
        times = [start + 2.0 + 0.5 * k for k in range(6)]
        for t in times:
            router._arrived(t, 1)
        assert await control.check() is None  # six requests in 20 s: the plan stands
        assert store.read_plan().version == version
        burst = [start + 11.0 + 0.05 * k for k in range(150)]
        for t in burst:
            router._arrived(t, 1)
        fresh = await control.check()
        assert fresh is not None and store.read_plan().version > version
        first, second = seen
        assert first.reason is PlanTrigger.CHECK and first.period_s == pytest.approx(20.0)
        assert second.arrivals == 156 and sum(second.arrival_bins) == 156
        assert router.period.arrivals == 156  # not taken: the period goes on
        await service.dispatch.close()
        # the simulator shows the same period so far the same way
        wl = quick_workload("poisson:qpm=60,duration=2m", [service.profile], n_prompts=50)
        sim = Simulator(service.policy, wl, SimConfig(gpus=1))
        sim.run()
        got = sim._stats(
            start + 20.0, 20.0, 156, np.zeros(0, dtype=np.int64), np.array(times + burst), reason=PlanTrigger.CHECK
        )
        assert got.arrival_bins == second.arrival_bins and got.bin_s == second.bin_s == bin_length_s(
            service.policy.predictor_spec
        )
        assert got.reason is PlanTrigger.CHECK and got.arrivals == second.arrivals

    asyncio.run(scenario())
