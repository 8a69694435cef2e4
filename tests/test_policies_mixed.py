"""Mixed AC + SM ladders for argus+: the merged ladder, the cache-miss fallback, a simulated run."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from argusdiff.domain import ClusterStats, Request, Strategy
from argusdiff.errors import ConfigError
from argusdiff.policies import RouteView, make_policy
from argusdiff.policies.mixed import is_mixed, merged_ladder, miss_fallback
from argusdiff.simulator import SimConfig, quick_workload, simulate, summarize

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def sm():
    """The per-GPU-table reading of the SM ladder, where the small models are fast enough to mix
    with the AC levels (with sm-a100's ARGUS Table 2 latencies every SM level but Tiny-SD is
    dominated by an AC level, docs/policies.md)."""
    from argusdiff.profile import load_profile

    return load_profile("sm-a100-gputable")


@pytest.fixture(scope="module")
def mixed(ac, sm):
    return merged_ladder(ac, sm)


def test_merged_ladder_is_ordered_by_quality_without_duplicates_or_dominated_levels(ac, sm, mixed):
    q = [lv.quality for lv in mixed.levels]
    assert q == sorted(q, reverse=True)
    assert is_mixed(mixed) and mixed.strategies == {Strategy.AC, Strategy.SM}
    assert mixed.ids[0] == "sdxl-k0"
    assert "sd-xl" not in mixed.ids  # the SM copy of SD-XL is the AC ladder's K = 0 level
    # no kept level is dominated (another at least as good and at least as fast, one strictly)
    for a in mixed.levels:
        for b in mixed.levels:
            if a is not b:
                assert not (
                    b.quality >= a.quality
                    and b.latency(1) <= a.latency(1)
                    and (b.quality > a.quality or b.latency(1) < a.latency(1))
                ), (a.id, b.id)
    full = merged_ladder(ac, sm, prune_dominated=False)
    assert len(full.levels) == len(ac.levels) + len(sm.levels) - 1
    assert set(mixed.ids) < set(full.ids)
    with pytest.raises(ConfigError, match="approximate-caching"):
        merged_ladder(sm, sm)
    with pytest.raises(ConfigError, match="smaller-model"):
        merged_ladder(ac, ac)


def test_miss_fallback_picks_the_best_cache_free_level_no_slower_than_the_hit(mixed):
    ids = mixed.ids
    everyone = [True] * len(ids)
    k = miss_fallback(mixed, "sdxl-k10", everyone)
    assert k is not None
    fb = mixed.levels[k]
    assert fb.strategy is Strategy.SM and fb.latency(1) <= mixed.level("sdxl-k10").latency(1)
    better = [
        lv for lv in mixed.levels if lv.strategy is Strategy.SM and lv.latency(1) <= mixed.level("sdxl-k10").latency(1)
    ]
    assert fb.quality == max(lv.quality for lv in better)
    assert miss_fallback(mixed, "sdxl-k0", everyone) is None  # needs no cache
    only_ac = [mixed.levels[i].strategy is Strategy.AC for i in range(len(ids))]
    assert miss_fallback(mixed, "sdxl-k10", only_ac) is None  # no small model has workers: K = 0


def _plan(policy, mixed, assignment):
    base = policy.static_plan(ClusterStats(now_s=0.0, period_s=60.0, arrivals=0, workers=tuple(assignment)), "sdxl-k10")
    # a mixed ladder's plans are SM plans (levels differ in model), as Argus.plan makes them
    return dataclasses.replace(base, assignment=assignment, strategy=Strategy.SM)


def test_argus_plus_on_a_cache_miss_runs_k0_in_time_else_a_smaller_model(mixed):
    pol = make_policy("argus+", mixed, rng=np.random.default_rng(0), config={"slo_s": 12.6})
    plan = _plan(pol, mixed, {"w0": "sdxl-k10", "w1": "sd-2.0"})
    assert plan.strategy is not Strategy.AC
    req = Request(id="r", prompt="p", arrival_s=0.0)

    def view(busy0, sim):
        return RouteView(
            now_s=0.0,
            queue_lengths={"w0": 1, "w1": 0},
            busy_until={"w0": busy0, "w1": 0.0},
            optimal_level="sdxl-k10",
            cache_similarity=sim,
            cache_healthy=True,
        )

    # a hit: served at the AC level
    a = pol.route(req, plan, view(0.0, 0.99))
    assert a.level == "sdxl-k10" and a.worker == "w0"
    # a miss, but K = 0 (4.2 s) on the idle SD-XL worker still meets the 12.6 s deadline: kept
    a = pol.route(req, plan, view(0.0, 0.1))
    assert a.level == "sdxl-k10" and a.worker == "w0"
    # a miss with SD-XL busy for 10 s: K = 0 would be late -> the smaller model
    a = pol.route(req, plan, view(10.0, 0.1))
    assert a.level == "sd-2.0" and a.worker == "w1" and "cache miss" in a.reason
    # the cache store is down: the same
    a = pol.route(req, plan, RouteView(now_s=0.0, busy_until={"w0": 10.0, "w1": 0.0}, optimal_level="sdxl-k10"))
    assert a.level == "sd-2.0"


def test_argus_plus_on_the_merged_ladder_in_the_simulator(ac, sm, mixed):
    wl = quick_workload("bursty:low=40,high=160,period=10m,duration=40m", [ac, sm], n_prompts=400, confusion=0.1)
    out = {}
    for label, prof, opts in (("ac", ac, {"fallback": sm}), ("sm", sm, {}), ("mixed", mixed, {})):
        pol = make_policy(
            "argus+", prof, rng=np.random.default_rng(0), config={"period_s": 60.0, "slo_s": 12.6, **opts}
        )
        res = simulate(pol, wl, SimConfig(period_s=60.0, slo_s=12.6, cache_prefill=0.5))
        out[label] = (res, summarize(res))
    res, s = out["mixed"]
    assert s["served"] + s["dropped"] == s["requests"] == wl.n_requests
    assert set(res.level_ids) == set(mixed.ids)
    # the plans put workers on both SD-XL (AC levels) and smaller models
    models = {mixed.level(lv).strategy for p in res.plans for lv, c in p["counts"].items() if c}
    assert models == {Strategy.AC, Strategy.SM}
    assert "merged ladder" in s["classifier"]
    # at this load the AC-only ladder misses deadlines that the merged ladder meets
    assert s["slo_violation_ratio"] <= out["ac"][1]["slo_violation_ratio"]
    assert s["slo_violation_ratio"] <= out["sm"][1]["slo_violation_ratio"] + 0.01


def test_replay_mixed_flag(capsys):
    from argusdiff.cli import main

    rc = main(
        [
            "replay",
            "--trace",
            "poisson:qpm=60,duration=4m",
            "--no-embeddings",
            "--quiet",
            "--policies",
            "pac",
            "--mixed",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "argus+ (AC+SM)" in out and "sdxl-ac-a100+sm-a100" in out


def test_mixed_ladder_plans_only_cache_free_levels_while_the_cache_is_down(ac, sm):
    import dataclasses

    from argusdiff.policies.mixed import needs_cache
    from argusdiff.simulator import parse_faults

    # small models 10% worse than shipped: the AC levels are no longer dominated and get workers
    weaker = dataclasses.replace(
        sm,
        name="sm-weaker",
        levels=tuple(
            lv if i == 0 else dataclasses.replace(lv, quality=round(lv.quality * 0.9, 3))
            for i, lv in enumerate(sm.levels)
        ),
    )
    mixed = merged_ladder(ac, weaker)
    assert "sdxl-k25" in mixed.ids and "sd-1.5" in mixed.ids
    wl = quick_workload("poisson:qpm=150,duration=20m", [ac, weaker], n_prompts=400, confusion=0.1)
    faults = tuple(parse_faults("cache@5m+10m", gpus=8, duration_s=1200.0))
    pol = make_policy("argus+", mixed, rng=np.random.default_rng(0), config={"period_s": 60.0, "slo_s": 12.6})
    res = simulate(pol, wl, SimConfig(period_s=60.0, slo_s=12.6, cache_prefill=0.5, faults=faults))
    s = summarize(res)
    assert s["served"] + s["dropped"] == s["requests"]

    def cache_workers(p):
        return sum(c for lv, c in p["counts"].items() if needs_cache(mixed.level(lv)))

    before = [p for p in res.plans if p["t"] < 300.0]
    during = [p for p in res.plans if 360.0 <= p["t"] < 900.0]  # the first tick after the fault sees it
    after = [p for p in res.plans if p["t"] >= 960.0]
    assert before and during and after
    assert all(cache_workers(p) > 0 for p in before)
    assert all(cache_workers(p) == 0 for p in during)
    assert any(cache_workers(p) > 0 for p in after)
    # both kinds of level served requests (AC at K > 0 on hits, smaller models)
    mix = s["level_mix"]
    assert any(needs_cache(mixed.level(lv)) for lv in mix) and any(
        mixed.level(lv).strategy is Strategy.SM for lv in mix
    )
    assert s["slo_violation_ratio"] < 0.05
