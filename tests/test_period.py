"""The period's observations going up (argusdiff.period): one accumulator builds one immutable
PeriodStats; sums, differences and Redis counts keep every field; ClusterStats has one builder."""

from __future__ import annotations

import pytest

from argusdiff.period import PeriodAccumulator, PeriodStats, cluster_stats


def test_the_accumulator_counts_a_period_and_starts_the_next():
    acc = PeriodAccumulator()
    acc.arrived(10.0, 2, "interactive")
    acc.arrived(11.0, 1, "batch")
    acc.classified("sdxl-k5", 2)
    acc.routed("sdxl-k5")
    acc.routed("sdxl-k0")
    for hit in (True, False, True, True):
        acc.looked_up(hit)
    p = acc.take({"sdxl-k5": 1.2})
    assert p.arrivals == 3 and p.arrival_times == (10.0, 10.0, 11.0)
    assert p.tier_arrivals == {"interactive": 2, "batch": 1} and p.affinity == {"sdxl-k5": 2}
    assert p.level_arrivals == {"sdxl-k5": 1, "sdxl-k0": 1}
    assert p.cache_hit_rate == 0.75 and p.latency_scale == {"sdxl-k5": 1.2}
    assert acc.take() == PeriodStats(arrival_times=())  # a new period: nothing yet
    with pytest.raises(AttributeError):
        p.arrivals = 0  # immutable


def test_a_period_given_back_counts_again_before_the_new_arrivals():
    acc = PeriodAccumulator()
    acc.arrived(1.0, 1, "standard")
    acc.looked_up(False)
    first = acc.take()
    acc.arrived(2.0, 1, "batch")
    acc.add(first)
    both = acc.take()
    assert both.arrivals == 2 and both.arrival_times == (1.0, 2.0)
    assert both.tier_arrivals == {"batch": 1, "standard": 1} and both.cache_hit_rate == 0.0


def test_counts_only_leave_the_arrival_times_for_the_close():
    acc = PeriodAccumulator()
    acc.arrived(5.0, 3, "standard")
    counts = acc.take(times=False)
    assert counts.arrivals == 3 and counts.arrival_times is None
    assert acc.arrivals == 0 and acc.arrival_times == [5.0, 5.0, 5.0]


def test_sums_keep_every_field_and_times_only_when_both_know_them():
    a = PeriodStats(2, {"x": 2}, {"x": 1}, {"interactive": 2}, 4, 1, (1.0, 2.0), {"x": 1.5})
    b = PeriodStats(1, {"y": 1}, {"x": 1}, {"batch": 1}, 1, 1)
    s = a + b
    assert s == PeriodStats(3, {"x": 2, "y": 1}, {"x": 2}, {"interactive": 2, "batch": 1}, 5, 2, None, {"x": 1.5})
    assert s.cache_hit_rate == 0.4
    assert PeriodStats.from_counts(s.counts().items()) == PeriodStats(
        3, {"x": 2, "y": 1}, {"x": 2}, {"interactive": 2, "batch": 1}, 5, 2
    )


def test_cluster_stats_bins_a_closed_period_when_its_times_are_all_its_arrivals():
    p = PeriodStats(3, tier_arrivals={"standard": 3}, cache_lookups=2, cache_hits=1, arrival_times=(1.0, 1.5, 7.0))
    s = cluster_stats(p, now_s=10.0, period_s=10.0, bin_s=5.0, workers=("w0",))
    assert s.arrival_bins == (2, 1) and s.bin_s == 5.0 and s.cache_hit_rate == 0.5 and s.workers == ("w0",)
    assert s.tier_arrivals == {"standard": 3} and s.arrival_qpm == 18.0
    # other routers' arrivals (times unknown for them): the total decides
    more = PeriodStats(5, arrival_times=(1.0, 1.5, 7.0))
    assert cluster_stats(more, now_s=10.0, period_s=10.0, bin_s=5.0, workers=()).arrival_bins == ()
    # a re-plan between periods is not binned; without the cache, no hit rate
    re = cluster_stats(p, now_s=10.0, period_s=10.0, bin_s=5.0, reason="replan", with_cache=False, workers=())
    assert re.arrival_bins == () and re.cache_hit_rate is None
