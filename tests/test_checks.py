"""Looks inside the control period (``Policy.check_s``, :attr:`PlanTrigger.CHECK`): argus+ re-plans
within the minute when the demand predictor, had the period ended now, would read a demand outside
its plan's band, and keeps its plan otherwise; the simulator and the live control loop show the
policy the same period so far, which goes on counting (that part of the contract is in
tests/test_decision_path.py)."""

from __future__ import annotations

import numpy as np
import pytest

from argusdiff.domain import PlanTrigger
from argusdiff.period import PeriodStats, cluster_stats
from argusdiff.policies import make_policy
from argusdiff.predictors import DemandPredictor
from argusdiff.profile import load_profile


def _stats(times, *, now, start, reason, workers):
    period = PeriodStats(len(times), arrival_times=tuple(times))
    return cluster_stats(period, now_s=now, period_s=now - start, bin_s=1.0, reason=reason, workers=workers)


def test_peek_reads_what_observing_would_and_observes_nothing():
    p = DemandPredictor("peak")
    p.observe(60, 60.0, bins=[1] * 60, bin_s=1.0)
    before = p.state()
    burst = PeriodStats(40, arrival_times=tuple(5.0 + 0.1 * k for k in range(40)))
    s = cluster_stats(burst, now_s=20.0, period_s=20.0, bin_s=1.0, reason=PlanTrigger.CHECK, workers=())
    peeked = p.peek(s)
    assert p.state() == before  # nothing observed
    q = DemandPredictor.from_state(before)
    q.observe_stats(s)
    assert peeked == q.estimate == 240.0  # 40 arrivals in one 10 s bin


def _argus_plus(**options):
    prof = load_profile("sdxl-ac-a100")
    return make_policy("argus+", prof, rng=np.random.default_rng(0), config={"backend": "highs", **options})


def test_argus_plus_keeps_its_plan_in_the_band_and_replans_on_a_burst():
    pol = _argus_plus()
    assert pol.check_s == 10.0  # the default peak reading's bin
    workers = tuple(f"w{k}" for k in range(8))
    quiet = [k * 1.0 + 0.5 for k in range(60)]  # 60 QPM
    first = pol.plan(_stats(quiet, now=60.0, start=0.0, reason=PlanTrigger.PERIOD, workers=workers))
    # 20 s into the next period at the same rate: the same plan, the same object
    same = [60.0 + k + 0.5 for k in range(20)]
    assert pol.plan(_stats(same, now=80.0, start=60.0, reason=PlanTrigger.CHECK, workers=workers)) is first
    # a burst: 100 requests in the last 10 s (600 QPM): a new plan at once, for the burst's rate
    burst = same + [70.0 + 0.1 * k for k in range(100)]
    fresh = pol.plan(_stats(burst, now=80.0, start=60.0, reason=PlanTrigger.CHECK, workers=workers))
    assert fresh is not first and fresh.version > first.version
    assert fresh.predicted_qpm > 2 * first.predicted_qpm
    assert pol.demand.observations == 1  # the checks observed nothing
    # ... and the next look at the same rate keeps it
    assert pol.plan(_stats(burst, now=90.0, start=60.0, reason=PlanTrigger.CHECK, workers=workers)) is fresh


def test_without_checks_or_with_long_bins_there_is_nothing_to_look_at():
    assert _argus_plus(checks=False).check_s is None
    assert _argus_plus(predictor="ewma").check_s is None  # its bin is the period
    assert make_policy("argus", load_profile("sdxl-ac-a100"), rng=np.random.default_rng(0)).check_s is None
    with pytest.raises(Exception, match="replan_band"):
        _argus_plus(replan_band=0)


def test_the_simulator_replans_inside_the_period_on_a_burst_and_only_with_checks():
    from argusdiff.simulator import SimConfig, quick_workload, simulate

    prof = load_profile("sdxl-ac-a100")
    # 2 minutes at 40 QPM, then 2 at 400 QPM: the burst starts 120 s in, on a period's end
    spec = "bursty:low=40,high=400,period=4m,duration=8m"
    wl = quick_workload(spec, [prof], n_prompts=200, seed=1)

    def plan_times(**options):
        pol = make_policy("argus+", prof, rng=np.random.default_rng(0), config={"backend": "highs", **options})
        res = simulate(pol, wl, SimConfig(gpus=8, seed=0))
        return [p["t"] for p in res.plans]

    with_checks = plan_times()
    inside = [t for t in with_checks if abs(t / 60.0 - round(t / 60.0)) > 1e-6]
    assert inside, with_checks  # some plans were made between two period ends
    assert all(abs(t / 10.0 - round(t / 10.0)) < 1e-6 for t in inside)  # each on a check
    assert len(inside) < len(with_checks)  # not every check re-plans
    without = plan_times(checks=False)
    assert all(abs(t / 60.0 - round(t / 60.0)) < 1e-6 for t in without)
