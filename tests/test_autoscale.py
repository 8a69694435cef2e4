"""The autoscaling signal from real allocations, the shared statistics' arithmetic and the
combined cache health (no servers)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from argusdiff.domain import ClusterStats
from argusdiff.domain import level_catalogue as level_table
from argusdiff.period import PeriodStats
from argusdiff.policies import make_policy
from argusdiff.service.autoscale import desired_workers
from argusdiff.service.cluster import ClusterCacheHealth, _fields, _period
from argusdiff.service.health import CacheHealth


def _plan(profile, workers: int, qpm: float):
    policy = make_policy("argus", profile, rng=np.random.default_rng(0), config={"period_s": 60.0})
    stats = ClusterStats(now_s=60.0, period_s=60.0, arrivals=round(qpm), workers=tuple(f"w{i}" for i in range(workers)))
    return policy.plan(stats)


def test_saturated_plan_asks_for_the_shortfall_at_the_fastest_level(sm):
    fastest = max(lv.peak_qpm for lv in sm.levels)  # tiny-sd (ARGUS Table 2: 2.18 s)
    demand = 10 * fastest
    plan = _plan(sm, 4, demand)  # 4 workers at the fastest level carry 4 x fastest
    short = plan.predicted_qpm - 4 * fastest
    assert plan.saturated and plan.shortfall_qpm == pytest.approx(short)
    need = math.ceil(short / fastest - 1e-9)
    assert desired_workers(plan, level_table(sm), 4) == 4 + need
    # with that many workers the same demand is no longer saturated
    assert not _plan(sm, 4 + need, demand).saturated


def test_unsaturated_plan_scales_in_only_without_losing_quality(sm):
    levels = level_table(sm)
    best = sm.levels[0].peak_qpm  # sd-xl
    quiet = _plan(sm, 8, math.floor(2 * best))  # two sd-xl workers carry it: six are spare
    assert not quiet.saturated and desired_workers(quiet, levels, 8) == 2
    fastest = max(lv.peak_qpm for lv in sm.levels)
    busy = _plan(sm, 8, math.floor(7 * fastest))  # needs faster levels on all 8: keep them
    assert not busy.saturated and desired_workers(busy, levels, 8) == 8
    idle = _plan(sm, 3, 0.0)
    assert desired_workers(idle, levels, 3) == 1


def test_period_counts_round_trip_through_hash_fields():
    period = PeriodStats(
        7,
        {"a": 3, "b": 0},
        {"a": 5, "c": 2},
        {"interactive": 4, "batch": 3},
        cache_lookups=5,
        cache_hits=2,
        arrival_times=(1.0,) * 7,
    )
    back = _period(_fields(period))
    assert back == PeriodStats(7, {"a": 3}, {"a": 5, "c": 2}, {"interactive": 4, "batch": 3}, 5, 2)
    assert back.cache_hit_rate == 0.4 and back.arrival_times is None  # counts only cross Redis
    more = PeriodStats(9, {"a": 4}, {"a": 6}, {"interactive": 5, "batch": 3}, 6, 2)
    assert more.minus(period) == PeriodStats(2, {"a": 1}, {"a": 1}, {"interactive": 1}, 1, 0)


def test_cache_health_combines_every_routers_window():
    local = CacheHealth(10, latency_limit_s=0.25, error_limit=0.2)
    for _ in range(10):
        local.record(0.01)
    health = ClusterCacheHealth(local)
    assert health.healthy and health.error_rate() == 0.0
    # another router sees the cache failing and slow: the combined window is degraded
    health.peers = [{"samples": 30, "errors": 12, "median_latency_s": 0.9, "healthy": False}]
    assert health.error_rate() == pytest.approx(12 / 40)
    assert health.median_latency_s() == pytest.approx(0.9)  # 18 of 28 good samples are slow
    assert not health.healthy
    health.reset()  # probes found it healthy: every window starts over
    assert health.peers == [] and health.reset_pending and local.samples == 0
