"""Many routers on one Redis (real redis-server): the leader lease and its fencing token, fenced
plan writes, followers routing with the published plan, shared statistics, takeover from the
published plan and policy state, workers joining and leaving, the autoscaling signal and
``/v1/cluster`` / ``argusdiff status``. Routers run in this process (uvicorn threads); workers are
``argusdiff worker`` processes in stand-in TEST MODE. Process kills are in test_scaleout_faults.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest
import redis
from fixtures_service import redis_client, service_settings

from argusdiff.domain import Plan, Strategy
from argusdiff.service.leader import FencedPlanStore, LeaderLease, StaleLeader
from argusdiff.service.transport.redis_control import RedisControlStore
from argusdiff.service.worker import wait_until

pytestmark = pytest.mark.integration


def _settings(url: str, **kw):
    # A 5 s lease: two routers and their workers share 2 cores here, and a renewal delayed past the
    # default 0.75 s lease would hand the lease over mid-test. Takeover tests crash the leader and
    # wait for the lease to lapse; test_scaleout_faults.py measures takeover at the default lease.
    base = {"redis_url": url, "workers": 0, "control_period_s": 1.0, "leader_lease_s": 5.0, **kw}
    return service_settings(**base)


def _plan(version: int) -> Plan:
    return Plan(
        version=version,
        created_s=float(version),
        strategy=Strategy.SM,
        levels=("a",),
        assignment={"w": "a"},
        share=(1.0,),
        pasm=((1.0,),),
        predicted_qpm=0.0,
        expected_quality=1.0,
    )


def _log(r: redis.Redis, ns: str = "argusdiff") -> list[dict]:
    rows = r.xrange(f"{{{ns}}}:plan:log")
    return [{k.decode(): v.decode() for k, v in fields.items()} for _id, fields in rows]


def _crash(server) -> None:
    """Stop a router's control loop as a crash would: no lease release, heartbeats stop."""
    svc = server.service
    svc.dispatch.loop.call_soon_threadsafe(svc.control._task.cancel)
    assert wait_until(lambda: svc.control._task.done(), 10)


def _leader(*servers):
    leaders = [s for s in servers if s.service.control.leading]
    assert len(leaders) == 1, [s.service.control.role for s in servers]
    return leaders[0]


def _wait_plan_with(server, workers: set[str], timeout: float = 30.0) -> Plan:
    def ok() -> bool:
        plan = server.service.router.plan
        return plan is not None and {w for w, lv in plan.assignment.items() if lv} == workers

    assert wait_until(ok, timeout), f"no plan with exactly {sorted(workers)}"
    return server.service.router.plan


# -- the lease and fenced writes, on their own --------------------------------------------------


def test_lease_tokens_rise_and_a_stale_leader_cannot_publish(redis_any):
    r = redis_client(redis_any)
    store = RedisControlStore(redis_any.url)
    a = LeaderLease(r, "argusdiff", "a", lease_s=1.0)
    b = LeaderLease(r, "argusdiff", "b", lease_s=1.0)
    assert a.step() == 1 and b.step() is None and a.step() == 1  # renewal keeps the token
    fa, fb = FencedPlanStore(store, a), FencedPlanStore(store, b)
    fa.publish_plan(_plan(1))
    with pytest.raises(StaleLeader, match="not newer"):
        fa.publish_plan(_plan(1))  # versions only rise
    # a stops renewing (paused, partitioned): b takes the lease once it expires, with a new token
    assert wait_until(lambda: b.step() == 2, 5, 0.02)
    fb.publish_plan(_plan(2))
    with pytest.raises(StaleLeader, match="higher token"):
        fa.publish_plan(_plan(3), token=1)
    assert a.step() is None  # a learns it lost the lease
    assert store.read_plan().version == 2
    log = _log(r)
    assert [(int(x["version"]), int(x["token"]), x["router"]) for x in log] == [(1, 1, "a"), (2, 2, "b")]
    assert b.release() and a.step() == 3  # a clean hand-over: the next router takes it at once


# -- routers in this process --------------------------------------------------------------------


@pytest.fixture
def two_routers(redis_any, live_service, worker_procs):
    def make(n_workers: int = 3, **kw):
        a = live_service(_settings(redis_any.url, **kw), ready=False)
        b = live_service(_settings(redis_any.url, **kw), ready=False)
        for i in range(n_workers):
            worker_procs(redis_any.url, f"w{i}", scale=0.01)
        workers = {f"w{i}" for i in range(n_workers)}
        _wait_plan_with(a, workers)
        _wait_plan_with(b, workers)
        assert wait_until(lambda: a.service.ready() and b.service.ready(), 30), "a worker never served its level"
        return a, b

    return make


def test_one_leader_and_followers_route_with_its_published_plan(redis_any, two_routers):
    a, b = two_routers()
    leader = _leader(a, b)
    follower = b if leader is a else a
    assert follower.service.control.role == "follower" and follower.service.control.full_ticks == 0
    for i in range(6):
        r = httpx.post(f"{follower.url}/v1/argusdiff/generations", json={"prompt": f"p{i}"}, timeout=30)
        assert r.status_code == 200
    published = RedisControlStore(redis_any.url).read_plan()
    assert wait_until(lambda: follower.service.router.plan.version >= published.version, 10)
    writers = {x["router"] for x in _log(redis_client(redis_any))}
    assert writers == {leader.service.control.router_id}
    versions = [int(x["version"]) for x in _log(redis_client(redis_any))]
    assert versions == sorted(set(versions))


def test_the_leader_plans_on_every_routers_arrivals(two_routers):
    a, b = two_routers(n_workers=1)
    leader = _leader(a, b)
    follower = b if leader is a else a
    before = leader.service.control.cluster_arrivals
    for i in range(7):
        r = httpx.post(f"{follower.url}/v1/argusdiff/generations", json={"prompt": f"q{i}", "n": 2, "wait": False})
        assert r.status_code == 202
    # the follower's 14 images reach the leader's periods through Redis (count, not time)
    assert wait_until(lambda: leader.service.control.cluster_arrivals - before == 14, 20)
    assert follower.service.control.cluster_arrivals == 0


def test_a_new_leader_continues_the_plan_versions_and_the_policy_state(redis_any, two_routers):
    a, b = two_routers(n_workers=2)
    leader = _leader(a, b)
    follower = b if leader is a else a
    for i in range(5):
        httpx.post(f"{leader.url}/v1/argusdiff/generations", json={"prompt": f"s{i}", "wait": False})
    assert wait_until(lambda: leader.service.control.cluster_arrivals >= 5, 20)
    r = redis_client(redis_any)
    old_token = leader.service.control.lease.token
    observations = json.loads(r.get("{argusdiff}:plan:state"))["demand"]["observations"]
    _crash(leader)
    last = int(r.get("{argusdiff}:plan:version"))
    c = follower.service.control
    assert wait_until(lambda: c.leading and c.plan is not None and c.plan.version > last, 20)
    assert c.lease.token == old_token + 1
    assert {"demand", "version"} <= set(c.imported) and any(p.startswith("histogram:") for p in c.imported)
    # the first plan of the new leader is the next version, planned from the old leader's predictor
    first = next(x for x in _log(r) if int(x["token"]) == old_token + 1)
    assert int(first["version"]) == last + 1
    assert c.policy.demand.observations > observations
    assert all(int(x["token"]) == old_token + 1 for x in _log(r) if int(x["version"]) > last)


def test_workers_joining_and_leaving_are_planned_before_the_period_ends(redis_any, live_service, worker_procs):
    # a 60 s period: a plan that adds or drops a worker before the period ends is the early re-plan
    server = live_service(_settings(redis_any.url, control_period_s=60.0, leader_lease_s=2.0), ready=False)
    worker_procs(redis_any.url, "w0", scale=0.01)
    worker_procs(redis_any.url, "w1", scale=0.01)
    control = server.service.control
    before = _wait_plan_with(server, {"w0", "w1"})
    full = control.full_ticks
    joined = worker_procs(redis_any.url, "w2", scale=0.01)
    plan = _wait_plan_with(server, {"w0", "w1", "w2"})
    assert control.full_ticks == full  # no period ended in between
    assert {w: plan.assignment[w] for w in ("w0", "w1")} == {w: before.assignment[w] for w in ("w0", "w1")}
    assert plan.moved_workers == 1  # only the new worker got a level: no needless switches
    os.kill(joined.pid, signal.SIGKILL)
    after = _wait_plan_with(server, {"w0", "w1"})
    assert control.full_ticks == full and after.version > plan.version
    assert {w: after.assignment[w] for w in ("w0", "w1")} == {w: plan.assignment[w] for w in ("w0", "w1")}


def test_autoscaling_signal_cluster_endpoint_and_status_command(redis_any, two_routers):
    a, b = two_routers(n_workers=2)
    for server in (a, b):
        metrics = httpx.get(f"{server.url}/metrics").text
        assert "argusdiff_desired_workers " in metrics and "argusdiff_shortfall_qpm " in metrics
    lines = dict(
        line.rsplit(" ", 1) for line in httpx.get(f"{_leader(a, b).url}/metrics").text.splitlines() if line[:1] != "#"
    )
    assert float(lines["argusdiff_leader"]) == 1.0 and float(lines["argusdiff_leader_token"]) >= 1
    status = httpx.get(f"{a.url}/v1/cluster").json()
    assert status["leader"]["router"] == _leader(a, b).service.control.router_id
    assert set(status["routers"]) == {a.service.control.router_id, b.service.control.router_id}
    assert {w: s["up"] for w, s in status["workers"].items()} == {"w0": True, "w1": True}
    assert status["plan"]["version"] == status["plan_writes"][0]["version"]
    assert status["plan"]["desired_workers"] >= 1
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-m", "argusdiff", "status", "--redis", redis_any.url],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"leader: {status['leader']['router']}" in out.stdout and "w0" in out.stdout and "routers (2)" in out.stdout
    js = subprocess.run(
        [sys.executable, "-m", "argusdiff", "status", "--url", a.url, "--json"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert js.returncode == 0 and json.loads(js.stdout)["mode"] == "redis"


def test_embedded_service_reports_itself_as_the_leader(live_service):
    server = live_service(service_settings())
    status = httpx.get(f"{server.url}/v1/cluster").json()
    assert status["mode"] == "embedded" and len(status["routers"]) == 1
    assert status["plan"]["version"] >= 1 and set(status["workers"]) == {"local-0", "local-1"}


def test_a_worker_reads_its_slice_of_the_plan(redis_any, ac):
    """Workers read the plan view (one worker per served level) plus their own entry: the same
    level, batch size and served siblings as from the whole plan, at a fraction of the bytes."""
    import numpy as np

    from argusdiff.domain import ClusterStats, level_catalogue
    from argusdiff.policies import make_policy

    policy = make_policy("argus", ac, rng=np.random.default_rng(0), config={"period_s": 10.0, "backend": "highs"})
    workers = tuple(f"w{i:03d}" for i in range(200))
    plan = policy.plan(ClusterStats(now_s=10.0, period_s=10.0, arrivals=400, workers=workers))
    r = redis_client(redis_any)
    lease = LeaderLease(r, "argusdiff", "leader", 5.0)
    lease.step()
    FencedPlanStore(RedisControlStore(redis_any.url), lease).publish_plan(plan)
    levels = level_catalogue(ac)
    for w in ("w000", "w107", "w199", "nobody"):
        mine = RedisControlStore(redis_any.url).read_plan_for(w)
        assert mine.version == plan.version and mine.assignment.get(w) == plan.assignment.get(w)
        assert set(mine.assignment.values()) == set(plan.assignment.values())
        assert mine.unserved_siblings(levels, mine.assignment.get(w)) == plan.unserved_siblings(
            levels, plan.assignment.get(w)
        )
        assert (w in mine.assignment) == (w in plan.assignment)
    assert len(r.get("{argusdiff}:plan:view")) * 5 < len(r.get("{argusdiff}:plan"))


def test_the_plans_tier_mix_and_cache_hit_rate_are_the_clusters(two_routers):
    """Uneven traffic: the follower sees the interactive and batch requests and every cache
    lookup, the leader one standard request. The leader plans on the cluster's tier mix and hit
    rate (they travel with the arrivals through Redis), not on its own traffic alone."""
    import time

    from argusdiff.domain import Refusal, Tier
    from argusdiff.service.schemas import GenerationSpec

    a, b = two_routers(n_workers=1)
    leader = _leader(a, b)
    follower = b if leader is a else a
    seen: list = []
    plan = leader.service.policy.plan
    leader.service.policy.plan = lambda stats: seen.append(stats) or plan(stats)

    def traffic(router, tiers, lookups) -> None:  # on the router's event loop, as requests are
        now = time.time()
        for tier, n in tiers:
            router._refuse(GenerationSpec(prompt="p", n=n, tier=tier), "test", Refusal.CAPPED, 1.0, now, None)
        for hit in lookups:
            router.on_done("none", {"level": "tiny-sd", "ok": True, "lookup_s": 0.01, "cache_hit": hit})

    f, lead = follower.service, leader.service
    f.dispatch.loop.call_soon_threadsafe(
        traffic,
        f.router,
        ((Tier.INTERACTIVE, 6), (Tier.BATCH, 2)),
        (True, False, False, False, True, False, False, False),
    )
    lead.dispatch.loop.call_soon_threadsafe(traffic, lead.router, ((Tier.STANDARD, 1),), ())

    def mix() -> dict:
        out: dict[str, int] = {}
        for s in list(seen):
            for t, n in s.tier_arrivals.items():
                out[t] = out.get(t, 0) + n
        return out

    assert wait_until(lambda: mix() == {"interactive": 6, "batch": 2, "standard": 1}, 30), mix()
    rates = [s.cache_hit_rate for s in list(seen) if s.cache_hit_rate is not None]
    assert rates == [0.25]  # the follower's eight lookups, in one period of the leader's plans


def test_the_plans_measured_latencies_are_the_clusters(two_routers):
    """Each router measures the results that come back to it: the follower's are three times the
    profile, the leader's as profiled. The leader plans on the latencies pooled over both routers'
    measurements (they travel with the heartbeats), not on its own alone."""
    a, b = two_routers(n_workers=1)
    leader = _leader(a, b)
    follower = b if leader is a else a
    seen: list = []
    plan = leader.service.policy.plan
    leader.service.policy.plan = lambda stats: seen.append(stats) or plan(stats)

    def measured(router, ratio: float, n: int) -> None:  # on the router's event loop, as results are
        for _ in range(n):
            router.latency.observe("tiny-sd", ratio, 1.0)

    f, lead = follower.service, leader.service
    f.dispatch.loop.call_soon_threadsafe(measured, f.router, 3.0, 12)
    lead.dispatch.loop.call_soon_threadsafe(measured, lead.router, 1.0, 4)
    want = (36.0 + 4.0 + 4) / (12 + 4 + 4)  # both windows under one prior (min_samples = 4)

    def scales() -> list:
        return [s.latency_scale.get("tiny-sd") for s in list(seen)]

    assert wait_until(lambda: any(x is not None and abs(x - want) < 1e-9 for x in scales()), 30), scales()
    assert lead.router.latency_scales() == {"tiny-sd": pytest.approx(1.0)}  # its own alone: as profiled


def test_the_leaders_view_counts_every_routers_per_worker_queues(two_routers):
    """Delivery.PER_WORKER (Proteus) under two routers: the follower's requests wait in the queue
    of the worker it picked. The leader's plans see them there (the follower's heartbeat carries
    its per-worker in-flight counts), not only the leader's own queues."""
    a, b = two_routers(n_workers=2, policy="proteus")
    leader = _leader(a, b)
    follower = b if leader is a else a
    assert follower.service.router.per_worker and leader.service.router.per_worker
    seen: list = []
    plan = leader.service.policy.plan
    leader.service.policy.plan = lambda stats: seen.append(stats) or plan(stats)

    def in_flight(router, worker: str, n: int) -> None:  # on the router's event loop, as routing is
        router.worker_load[worker] += n

    f = follower.service
    f.dispatch.loop.call_soon_threadsafe(in_flight, f.router, "w0", 3)

    def w0() -> list:
        return [s.queue_lengths.get("w0", 0) for s in list(seen)]

    assert wait_until(lambda: 3 in w0(), 30), w0()
    assert leader.service.router.worker_load.get("w0", 0) == 0  # none of them is the leader's own
