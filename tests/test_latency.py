"""Latencies learned online (argusdiff.latency): the estimator, the simulator's slow-worker fault
feeding it, and argus+ planning, routing and admitting with the measured latencies."""

from __future__ import annotations

import os

import numpy as np
import pytest

from argusdiff.admission import AdmissionConfig
from argusdiff.errors import ConfigError
from argusdiff.latency import CLIP, LatencyEstimator, scaled_profile
from argusdiff.policies import make_policy
from argusdiff.profile import load_profile
from argusdiff.simulator import SimConfig, quick_workload, simulate, summarize
from argusdiff.simulator.faults import parse_faults

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_estimator_starts_at_the_profile_and_follows_measurements():
    est = LatencyEstimator(window=8, min_samples=4)
    assert est.scale("k0") == 1.0 and est.scales() == {}
    for _ in range(4):
        est.observe("k0", 8.4, 4.2)
    assert est.scale("k0") == pytest.approx(1.5)  # four at x2 against the prior's four at x1
    for _ in range(8):
        est.observe("k0", 8.4, 4.2)
    assert est.scale("k0") == pytest.approx((8 * 2 + 4) / 12)  # the window keeps the last 8
    est.observe("k5", 1e6, 1.0)  # one stalled batch is clipped
    assert est.scale("k5") == pytest.approx((CLIP + 4) / 5)
    est.observe("k5", float("nan"), 1.0)
    assert est.count("k5") == 1 and set(est.scales()) == {"k0", "k5"}


def test_scaled_profile_slows_levels_and_their_capacity():
    ac = load_profile("sdxl-ac-a100")
    assert scaled_profile(ac, {}) is ac
    slow = scaled_profile(ac, {"sdxl-k0": 2.0})
    assert slow.level("sdxl-k0").latency(1) == pytest.approx(2 * ac.level("sdxl-k0").latency(1))
    assert slow.level("sdxl-k0").peak_qpm == pytest.approx(ac.level("sdxl-k0").peak_qpm / 2)
    assert slow.level("sdxl-k5").latency(1) == ac.level("sdxl-k5").latency(1)


def test_slow_fault_spec():
    (f,) = parse_faults("slow:halfx2@10m+5m", gpus=8, duration_s=3600)
    assert (f.kind, f.count, f.factor, f.start_s, f.duration_s) == ("slow", 4, 2.0, 600.0, 300.0)
    for bad in ("slow:half@1m+1m", "slow:4x0@1m+1m", "slow:9x2@1m+1m"):
        with pytest.raises(ConfigError, match="--faults"):
            parse_faults(bad, gpus=8, duration_s=3600)


def test_argus_plus_plans_with_the_measured_latencies_of_slow_workers():
    profile = load_profile("sdxl-ac-a100")
    wl = quick_workload("poisson:qpm=60,duration=20m", [profile], n_prompts=300)
    cfg = SimConfig(
        gpus=4, admission=AdmissionConfig(), faults=tuple(parse_faults("slow:2x3@5m+10m", gpus=4, duration_s=1200))
    )
    runs = {}
    for measured in (True, False):
        pol = make_policy(
            "argus+", profile, rng=np.random.default_rng(0), config={"backend": "highs", "measured": measured}
        )
        runs[measured] = simulate(pol, wl, cfg)
    plans = runs[True].plans
    during = [p for p in plans if 6 * 60 <= p["t"] <= 15 * 60]
    assert during and all(max(p["latency_scale"].values()) > 1.3 for p in during[1:])
    assert not plans[0]["latency_scale"]  # nothing measured before the first plan: the profile
    assert all(not p["latency_scale"] for p in runs[False].plans)
    # it adapts: fewer requests late or refused than with the profile's latencies
    late = {m: summarize(r)["slo_violation_ratio"] for m, r in runs.items()}
    assert late[True] < late[False]


def test_the_router_learns_latencies_from_results_and_shows_them():
    from argusdiff.config import Settings
    from argusdiff.service.dispatch import LocalDispatch
    from argusdiff.service.metrics import ServiceMetrics
    from argusdiff.service.plans import plan_from_dict, plan_to_dict
    from argusdiff.service.router import Router

    profile = load_profile("sdxl-ac-a100")
    settings = Settings.model_validate({"profile": profile.name, "service": {"policy": "argus+", "workers": 0}})
    pol = make_policy("argus+", profile, rng=np.random.default_rng(0), config={"backend": "highs"})
    router = Router(
        profile=profile, policy=pol, dispatch=LocalDispatch(), metrics=ServiceMetrics(), config=settings.service
    )
    k0 = profile.level("sdxl-k0").latency(1) * router.admission.config.time_scale
    for _ in range(12):
        router._measure("sdxl-k0", 2 * k0)
    seen = router.latencies()["sdxl-k0"]
    assert seen["profiled_s"] == pytest.approx(k0) and seen["measured_s"] > 1.5 * k0 and seen["measured"] == 12
    text = router.metrics.render().decode()
    assert 'argusdiff_level_latency_seconds{level="sdxl-k0",source="measured"}' in text
    assert 'argusdiff_level_latency_seconds{level="sdxl-k0",source="profiled"}' in text
    from argusdiff.domain import ClusterStats

    stats = ClusterStats(
        now_s=0.0, period_s=60.0, arrivals=60, workers=("w0", "w1"), latency_scale=router.latency.scales()
    )
    plan = pol.plan(stats)
    assert plan.latency_scale["sdxl-k0"] == pytest.approx(seen["scale"])
    assert plan_from_dict(plan_to_dict(plan)).latency_scale == plan.latency_scale
