"""Each policy's defining behaviour, on the simulator with SYNTHETIC quality tables."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from argusdiff.domain import ClusterStats, Request
from argusdiff.policies import POLICIES, PolicyError, RouteView, make_policy, policy_class, select_worker
from argusdiff.policies.classifier import OracleClassifier
from argusdiff.profile import load_profile
from argusdiff.simulator import SimConfig, quick_workload, simulate, summarize

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: every registered policy; each runs on the profile of its registered family (Policy.family)
NAMES = tuple(POLICIES)


def run(name, profiles, wl, *, seed=0, options=None, **cfg):
    cls = policy_class(name)
    prof = profiles[cls.family]
    opts = {"period_s": 1.0 if cls.family == "cascade" else 60.0, **(options or {})}
    if name in ("argus", "argus+"):
        opts["fallback"] = profiles["sm"]
    if cls.needs_peak:
        opts["peak_qpm"] = float(np.max(np.bincount((wl.arrivals_s // 60).astype(int))))
    pol = make_policy(name, prof, rng=np.random.default_rng(seed), config=opts)
    return simulate(pol, wl, SimConfig(seed=seed, period_s=opts["period_s"], slo_s=12.6, cache_prefill=0.5, **cfg))


@pytest.fixture(scope="module")
def all_profiles_workload(profiles):
    def make(trace, **kw):
        return quick_workload(trace, list(profiles.values()), n_prompts=400, **kw)

    return make


def test_registry_and_errors(profiles):
    with pytest.raises(PolicyError, match="unknown policy"):
        make_policy("nope", profiles["ac"], rng=np.random.default_rng(0))
    with pytest.raises(PolicyError, match="nirvana"):
        make_policy("nirvana", profiles["sm"], rng=np.random.default_rng(0))
    with pytest.raises(PolicyError):
        make_policy("diffserve", profiles["sm"], rng=np.random.default_rng(0))
    with pytest.raises(PolicyError, match="unknown policy option"):
        make_policy("argus", profiles["ac"], rng=np.random.default_rng(0), config={"bogus": 1})


def test_worker_selector_is_argmin_queue_times_processing_time():
    view = RouteView(queue_lengths={"a": 3, "b": 1, "c": 1}, busy_until={"a": 9.0, "b": 5.0, "c": 4.0})
    assert select_worker(["a", "b", "c"], view, 2.0) == "c"  # tie on queue: frees first
    assert select_worker(["a", "b"], view, [0.5, 4.0]) == "a"  # (3+1)*0.5 < (1+1)*4
    assert select_worker([], view, 1.0) is None


def test_oracle_classifier_confusion_is_as_stated(profiles):
    wl_prompts = [f"prompt {i}" for i in range(2000)]
    from traces.synthetic import synthetic_quality_table

    table = synthetic_quality_table(wl_prompts, profiles["ac"], seed=1)
    exact = OracleClassifier(table, confusion=0.0)
    assert np.array_equal(exact.predicted, table.optimal_levels(0.9))
    noisy = OracleClassifier(table, confusion=0.3, seed=2)
    assert abs(noisy.accuracy - 0.7) < 0.05
    assert np.all(np.abs(noisy.predicted - noisy.optimal) <= 1)  # errors go to an adjacent level
    assert "30% confusion" in noisy.description
    assert noisy.predict(wl_prompts[:3]) == [table.level_ids[i] for i in noisy.predicted[:3]]


@pytest.mark.parametrize("name", NAMES)
def test_low_load_everything_within_slo(name, profiles, all_profiles_workload):
    wl = all_profiles_workload("poisson:qpm=20,duration=10m")
    s = summarize(run(name, profiles, wl))
    assert s["requests"] > 100
    assert s["dropped"] == 0
    assert s["slo_violation_ratio"] <= 0.01, s


def test_clipper_ha_violates_under_high_load_and_clipper_ht_does_not(profiles, all_profiles_workload):
    wl = all_profiles_workload("poisson:qpm=200,duration=10m")
    ha = summarize(run("clipper-ha", profiles, wl))
    ht = summarize(run("clipper-ht", profiles, wl))
    assert ha["slo_violation_ratio"] > 0.5
    assert ht["slo_violation_ratio"] < 0.01
    assert ha["relative_quality"] > ht["relative_quality"]


def test_argus_quality_at_least_pac_at_equal_load(profiles, all_profiles_workload):
    # moderate load: the allocation mixes levels, so where each prompt goes matters
    wl = all_profiles_workload("poisson:qpm=110,duration=20m", confusion=0.1)
    argus = summarize(run("argus", profiles, wl))
    pac = summarize(run("pac", profiles, wl))
    assert argus["relative_quality"] >= pac["relative_quality"]
    assert argus["effective_quality"] >= pac["effective_quality"]


def test_nirvana_chooses_k_from_cache_similarity(profiles, all_profiles_workload):
    from cache.policy import k_for_similarity

    ac = profiles["ac"]
    pol = make_policy("nirvana", ac, rng=np.random.default_rng(0))
    stats = ClusterStats(now_s=0.0, period_s=60.0, arrivals=0, workers=("w0", "w1"))
    plan = pol.plan(stats)
    for sim in (0.99, 0.92, 0.87, 0.8, 0.7, 0.5):
        view = RouteView(cache_similarity=sim, queue_lengths={}, busy_until={})
        a = pol.route(Request(id="r", prompt="p", arrival_s=0.0), plan, view)
        assert ac.level(a.level).skip == k_for_similarity(sim)
    view = RouteView(cache_similarity=0.99, cache_healthy=False)
    assert ac.level(pol.route(Request(id="r", prompt="p", arrival_s=0.0), plan, view).level).skip == 0


def test_nirvana_judges_k_of_a_short_schedule_as_a_fraction_of_the_run():
    demo = load_profile("demo-cpu")  # N = 8, K in {0, 2, 4}
    pol = make_policy("nirvana", demo, rng=np.random.default_rng(0))
    # K = 4 of 8 is half the run, like K = 25 of 50; K = 2 of 8 like 13 of 50
    assert [pol.level_for_k(k) for k in (25, 20, 15, 10, 5, 0)] == [
        "xl-k4",
        "xl-k2",
        "xl-k2",
        "xl-k0",
        "xl-k0",
        "xl-k0",
    ]


def test_diffserve_defers_by_threshold_and_drops_hopeless_queries(profiles, all_profiles_workload):
    cascade = profiles["cascade"]
    wl = all_profiles_workload("poisson:qpm=150,duration=10m")
    res = run("diffserve", profiles, wl)
    s = summarize(res)
    # the share deferred to the heavy model follows the plans' thresholds through f(t)
    ts = [p["thresholds"][cascade.cascade.light] for p in res.plans if p["thresholds"]]
    fs = [cascade.cascade.f(t) for t in ts]
    share = s["deferred"] / s["requests"]
    assert min(fs) - 0.05 <= share <= max(fs) + 0.05
    conf = wl.confidence[wl.prompt_idx]
    assert conf[res.deferred].mean() < conf[~res.deferred].mean()  # low confidence goes to the heavy model
    # overload: queries predicted to miss 1.5 x SLO are dropped instead of queued
    heavy = all_profiles_workload("poisson:qpm=2500,duration=3m")
    hs = summarize(run("diffserve", profiles, heavy))
    assert hs["dropped"] > 0
    served = run("diffserve", profiles, heavy)
    ok = served.status == 1
    assert np.all(served.finish_s[ok] - heavy.arrivals_s[ok] <= 1.5 * 12.6 + 10.0)


def test_diffserve_static_keeps_its_peak_plan(profiles, all_profiles_workload):
    wl = all_profiles_workload("bursty:low=20,high=200,period=4m,duration=8m")
    res = run("diffserve-static", profiles, wl)
    counts = {tuple(sorted(p["counts"].items())) for p in res.plans}
    assert len(counts) == 1
    dyn = run("diffserve", profiles, wl)
    assert len({tuple(sorted(p["counts"].items())) for p in dyn.plans}) > 1


def test_proteus_and_sommelier_pay_model_loads(profiles, all_profiles_workload):
    wl = all_profiles_workload("bursty:low=20,high=300,period=4m,duration=16m")
    for name in ("proteus", "sommelier"):
        s = summarize(run(name, profiles, wl))
        assert s["model_switches"] > 0
        assert s["served"] + s["dropped"] == s["requests"]


def test_sommelier_decides_per_gpu_from_its_own_load(profiles):
    sm = profiles["sm"]
    pol = make_policy("sommelier", sm, rng=np.random.default_rng(0))
    # what route() recorded in the period: (worker, send time), drained by plan()
    pol.sent.extend([("w0", i * 0.3) for i in range(200)] + [("w1", 30.0)])
    stats = ClusterStats(now_s=60.0, period_s=60.0, arrivals=201, workers=("w0", "w1"))
    plan = pol.plan(stats)
    assert plan.assignment["w1"] == sm.best.id
    assert sm.index(plan.assignment["w0"]) > 0
    assert not pol.sent  # drained: the next period counts afresh


def test_argus_plus_admission_beats_argus_under_bursts(profiles, all_profiles_workload):
    wl = all_profiles_workload("bursty:low=40,high=190,period=6m,duration=18m")
    argus = summarize(run("argus", profiles, wl))
    plus = summarize(run("argus+", profiles, wl))
    no_adm = summarize(run("argus+", profiles, wl, options={"admission": False}))
    assert plus["slo_violation_ratio"] < argus["slo_violation_ratio"]
    assert plus["slo_violation_ratio"] <= no_adm["slo_violation_ratio"]
    assert plus["best_effort"] >= 0


def test_argus_plus_serves_hopeless_requests_best_effort_at_the_fastest_level(profiles):
    sm = profiles["sm"]
    pol = make_policy("argus+", sm, rng=np.random.default_rng(0), config={"slo_s": 12.6})
    plan = pol.static_plan(ClusterStats(now_s=0.0, period_s=60.0, arrivals=0, workers=("w0", "w1")), sm.best.id)
    plan = dataclasses.replace(plan, assignment={"w0": sm.best.id, "w1": sm.fastest.id})
    req = Request(id="r", prompt="p", arrival_s=0.0)
    # both workers are backed up far beyond the deadline: no level can make it
    view = RouteView(
        now_s=0.0, queue_lengths={"w0": 50, "w1": 50}, busy_until={"w0": 200.0, "w1": 100.0}, optimal_level=sm.best.id
    )
    a = pol.route(req, plan, view)
    assert a.best_effort and a.level == sm.fastest.id and a.worker == "w1"
    # the best worker would be late but the fast one is free: moved to the faster level, in time
    view = RouteView(
        now_s=0.0, queue_lengths={"w0": 50, "w1": 0}, busy_until={"w0": 200.0, "w1": 0.0}, optimal_level=sm.best.id
    )
    a = pol.route(req, plan, view)
    assert not a.best_effort and a.level == sm.fastest.id and a.worker == "w1"


def test_policies_register_themselves_with_name_and_family():
    from argusdiff.policies.base import FAMILIES, Policy

    for name, cls in POLICIES.items():
        assert cls.name == name and cls.family in FAMILIES
    by_family = {f: sorted(n for n, c in POLICIES.items() if c.family == f) for f in FAMILIES}
    assert by_family == {  # the replay's families, as each policy's paper serves it
        "ac": ["argus", "argus+", "nirvana", "pac"],
        "sm": ["clipper-ha", "clipper-ht", "proteus", "sommelier"],
        "cascade": ["diffserve", "diffserve-static"],
    }

    class Probe(Policy, name="test-probe", family="sm"):
        def plan(self, stats):
            return self.static_plan(stats, self.profile.levels[0].id)

        def route(self, request, plan, view):
            return None

    try:
        assert POLICIES["test-probe"] is Probe and Probe.family == "sm"
        with pytest.raises(TypeError, match="registered twice"):

            class Again(Policy, name="test-probe", family="sm"):
                pass

        with pytest.raises(TypeError, match="family"):

            class Odd(Policy, name="test-odd", family="gpu"):
                pass

        assert "test-odd" not in POLICIES
    finally:
        import argusdiff.policies.base as base

        base._REGISTRY.pop("test-probe", None)  # REGISTRY is a read-only view of it
    assert "test-probe" not in POLICIES


def test_each_policy_takes_its_own_validated_options(profiles):
    from argusdiff.policies.argus import ArgusOptions
    from argusdiff.policies.diffserve import DiffServeStaticOptions

    rng = np.random.default_rng(0)
    # one mapping for whichever policy runs (the service's and the replay's): each takes its own
    shared = {"period_s": 30.0, "backend": "highs", "peak_qpm": 50.0, "fallback": profiles["sm"]}
    argus = make_policy("argus", profiles["ac"], rng=rng, config=shared)
    static = make_policy("diffserve-static", profiles["cascade"], rng=rng, config=shared)
    clipper = make_policy("clipper-ha", profiles["sm"], rng=rng, config=shared)
    assert type(argus.options) is ArgusOptions and argus.options.fallback is profiles["sm"]
    assert not hasattr(argus.options, "peak_qpm")
    assert type(static.options) is DiffServeStaticOptions and static.options.peak_qpm == 50.0
    assert not hasattr(clipper.options, "backend") and clipper.options.period_s == 30.0
    for name, profile, bad, field in (
        ("diffserve-static", "cascade", {"peak_qpm": -1.0}, "peak_qpm"),
        ("diffserve", "cascade", {"drop_factor": 0.0}, "drop_factor"),
        ("argus", "ac", {"affinity_window": 0}, "affinity_window"),
        ("argus+", "ac", {"paths": ("ac", "gpu")}, "paths"),
        ("nirvana", "ac", {"period_s": -5.0}, "period_s"),
        ("sommelier", "sm", {"period_s": "soon"}, "period_s"),
        ("argus", "ac", {"switch_tolerance": 2.0}, "switch_tolerance"),
    ):
        with pytest.raises(PolicyError, match=field):
            make_policy(name, profiles[profile], rng=rng, config=bad)
    # an options object must be the policy's own kind
    with pytest.raises(PolicyError, match="DiffServeOptions"):
        make_policy("diffserve", profiles["cascade"], rng=rng, config=ArgusOptions())


def test_the_formulation_has_one_default_and_the_service_passes_it_on(profiles):
    from argusdiff.config import Settings
    from argusdiff.service.app import policy_options
    from solver import DEFAULT_FORMULATION

    assert Settings().solver.formulation == DEFAULT_FORMULATION
    pol = make_policy("argus", profiles["ac"], rng=np.random.default_rng(0))
    assert pol.options.formulation == DEFAULT_FORMULATION
    settings = Settings(solver={"formulation": "aggregated"})
    opts = policy_options(settings, profiles["ac"], profiles["sm"])
    pol = make_policy("argus+", profiles["ac"], rng=np.random.default_rng(0), config=opts)
    assert pol.options.formulation == "aggregated" and pol.options.fallback is profiles["sm"]
