"""The router as the control loop sees it (:class:`argusdiff.service.ports.ControlledRouter`): the
leader's :class:`~argusdiff.service.cluster.ClusterRouterView` implements every member explicitly,
and the control loops read nothing else of the router (no Redis: a stand-in bus)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from argusdiff.domain import Plan, Strategy
from argusdiff.policies import make_policy
from argusdiff.service.cluster import ClusterCacheHealth, ClusterRouterView
from argusdiff.service.ports import ControlCacheHealth, ControlledRouter
from argusdiff.service.router import Router

ROOT = Path(__file__).resolve().parent.parent


def _members(protocol: type) -> set[str]:
    return {n for n in vars(protocol) if not n.startswith("_")}


def test_the_views_delegate_member_by_member(router):
    for cls in (ClusterRouterView, ClusterCacheHealth):
        for name in ("__getattr__", "__getattribute__", "__setattr__"):
            assert name not in vars(cls), f"{cls.__name__} proxies through {name}"
    view = ClusterRouterView(router, _Bus({}))
    for name in _members(ControlledRouter):
        assert hasattr(router, name), f"Router lacks {name}"
        assert hasattr(view, name), f"ClusterRouterView lacks {name}"
    for name in _members(ControlCacheHealth):
        assert name in vars(ClusterCacheHealth), f"ClusterCacheHealth lacks {name}"


def _router_reads(path: Path) -> set[str]:
    """Every ``self.router.<name>`` the module reads."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "router"
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "self"
        ):
            names.add(node.attr)
    return names


def test_the_control_loops_read_only_the_protocols_members():
    allowed = _members(ControlledRouter)
    leader_only = {"summary", "refresh"}  # the heartbeat's part (ClusterRouterView only)
    control = _router_reads(ROOT / "argusdiff/service/control.py")
    leader = _router_reads(ROOT / "argusdiff/service/leader.py")
    assert control <= allowed, control - allowed
    assert leader <= allowed | leader_only, leader - allowed - leader_only


class _Bus:
    router_id = "me"

    def __init__(self, peers: dict) -> None:
        self._peers = peers
        self.peers: dict = {}

    def health_epoch(self) -> int:
        return 0

    def bump_health_epoch(self) -> int:
        return 1

    def routers(self) -> dict:
        return {"me": {}, **self._peers}


@pytest.fixture
def router(sm):
    from argusdiff.config import Settings
    from argusdiff.service.dispatch import LocalDispatch
    from argusdiff.service.metrics import ServiceMetrics

    settings = Settings.model_validate({"profile": sm.name, "service": {"policy": "argus", "workers": 0}})
    pol = make_policy("argus", sm, rng=np.random.default_rng(0), config={"backend": "highs"})
    return Router(profile=sm, policy=pol, dispatch=LocalDispatch(), metrics=ServiceMetrics(), config=settings.service)


def test_the_leaders_view_plans_on_every_routers_queues_and_the_local_period(router, sm):
    lv = sm.levels[-1].id
    plan = Plan(
        version=1, created_s=0.0, strategy=Strategy.SM, levels=(lv,), assignment={"w0": lv, "w1": lv},
        share=(1.0,), pasm=((1.0,),), predicted_qpm=0.0, expected_quality=1.0,
    )  # fmt: skip
    router.level_load[lv] = 2
    peer = {"level_load": {lv: 4}, "cache": {"epoch": 0, "samples": 5, "errors": 5, "median_latency_s": None}}
    view = ClusterRouterView(router, _Bus({"other": peer}))
    view.refresh()
    assert view.level_load == Counter({lv: 6})
    own, cluster = router.view(10.0, plan, None, 30.0), view.view(10.0, plan, None, 30.0)
    assert sum(own.queue_lengths.values()) == 2 and sum(cluster.queue_lengths.values()) == 6
    assert own.cache_healthy and not cluster.cache_healthy  # the other router's lookups all failed
    router._arrived(5.0, 3, "batch")
    period = view.take_period()
    assert period.arrivals == 3 and router.period.arrivals == 0
    view.give_back(period)
    assert router.period.arrivals == 3
    assert view.policy is router.policy and view.per_worker == router.per_worker
    assert view.tier_load is router.tier_load


def test_the_leaders_view_counts_every_routers_per_worker_queues(sm):
    """Delivery.PER_WORKER (Proteus): a request waits in the queue of the worker its router picked.
    The leader's view counts every router's per-worker in-flight images (their heartbeats carry
    them), not its own alone."""
    from argusdiff.config import Settings
    from argusdiff.service.dispatch import LocalDispatch
    from argusdiff.service.metrics import ServiceMetrics

    settings = Settings.model_validate({"profile": sm.name, "service": {"policy": "proteus", "workers": 0}})
    pol = make_policy("proteus", sm, rng=np.random.default_rng(0), config={"backend": "highs"})
    router = Router(profile=sm, policy=pol, dispatch=LocalDispatch(), metrics=ServiceMetrics(), config=settings.service)
    assert router.per_worker
    lv = sm.levels[-1].id
    plan = Plan(
        version=1, created_s=0.0, strategy=Strategy.SM, levels=(lv,), assignment={"w0": lv, "w1": lv},
        share=(1.0,), pasm=((1.0,),), predicted_qpm=0.0, expected_quality=1.0,
    )  # fmt: skip
    router.level_load[lv] = 1
    router.worker_load["w0"] = 1
    peer = {"level_load": {lv: 5}, "worker_load": {"w0": 2, "w1": 3}}
    view = ClusterRouterView(router, _Bus({"other": peer}))
    assert view.summary()["worker_load"] == {"w0": 1}  # what this router's heartbeat carries
    assert view.view(10.0, plan, None, 30.0).queue_lengths == {"w0": 1, "w1": 0}  # before a heartbeat
    view.refresh()
    assert view.worker_load == Counter({"w0": 3, "w1": 3})
    assert router.view(10.0, plan, None, 30.0).queue_lengths == {"w0": 1, "w1": 0}  # the router alone
    cluster = view.view(10.0, plan, None, 30.0)
    assert cluster.queue_lengths == {"w0": 3, "w1": 3}
    assert cluster.busy_until["w0"] == cluster.busy_until["w1"] > 10.0


def test_the_leaders_latencies_pool_every_routers_measurements(router, sm):
    """Each router measures the results that come back to it; the leader's plan reads the mean over
    every router's window (their heartbeats carry them), not its own alone."""
    lv = sm.levels[-1].id
    for _ in range(4):
        router.latency.observe(lv, 1.0, 1.0)  # the leader's results: as profiled
    alone = router.latency_scales()
    assert alone == {lv: 1.0} and router.latency.windows() == {lv: (4.0, 4)}
    from argusdiff.latency import LatencyEstimator

    other = LatencyEstimator()
    for _ in range(12):
        other.observe(lv, 3.0, 1.0)  # the other router's results: 3x slower
    peer = {"level_load": {}, "latency": {k: list(w) for k, w in other.windows().items()}}
    view = ClusterRouterView(router, _Bus({"other": peer}))
    assert view.latency_scales() == alone  # before the first heartbeat
    view.refresh()
    want = (4.0 + 36.0 + 4) / (4 + 12 + 4)  # one prior of min_samples = 4 over both windows
    assert view.latency_scales() == {lv: pytest.approx(want)}
    router._arrived(1.0, 1, "standard")
    assert view.take_period().latency_scale == {lv: pytest.approx(want)}
    assert router.take_period().latency_scale == alone  # the router alone still reads its own
    assert view.summary()["latency"] == {lv: [4.0, 4]}  # what this router's heartbeat carries
    assert view.peek_period().latency_scale == {lv: pytest.approx(want)}  # a look inside the period too
