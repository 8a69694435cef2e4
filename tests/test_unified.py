"""The unified planner (solver.unified): AC levels, smaller models and cascades in one plan per SLO
tier. Property tests on random instances (feasible, exact search = MILP, never worse than the best
single-strategy plan, switch costs), tier reservation, failure paths, the adapter from profiles and
the worked example of docs/solver.md."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os

import numpy as np
import pytest
from fixtures_unified import problems, realistic
from hypothesis import HealthCheck, given, settings

from argusdiff.domain import CascadeSpec, Strategy
from argusdiff.errors import ConfigError
from argusdiff.policies.base import PlanRouting
from argusdiff.profile import load_profile
from solver import backends
from solver.backends import SolveResult
from solver.paths import (
    Pool,
    ServingPath,
    Stage,
    TierSpec,
    UnifiedProblem,
    class_quality_model,
    merged_profile,
    nitsum_tiers,
    problem_from_profile,
    ranked_deferral,
)
from solver.unified import FORMULATIONS, plan_unified, restrict

SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much]}
# examples per property (more for a longer check: ARGUSDIFF_UNIFIED_EXAMPLES=1000 pytest tests/test_unified.py)
EXAMPLES = int(os.environ.get("ARGUSDIFF_UNIFIED_EXAMPLES", "60"))


def close(a: float, b: float, rel: float = 1e-6, scale: float = 1.0) -> bool:
    """Equal to solver precision: relative to the values, and to ``scale`` (the demand: the
    served-volume rows keep 1e-7 of it as slack)."""
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b), scale)


def check_feasible(p: UnifiedProblem, r) -> None:
    """Capacity, worker count, thresholds on the grid, every planned request routed, a valid Plan."""
    W = len(p.workers)
    assert sum(r.counts.values()) <= W
    assert set(r.assignment) == set(p.workers)
    for pool, n in r.counts.items():
        assert sum(1 for v in r.assignment.values() if v == pool) == n
        assert r.loads[pool] <= 60.0 * n * (1 + 1e-6) + 1e-6, (pool, r.loads[pool], n)
    paths = {q.id: q for q in p.paths}
    for pid, t in r.thresholds.items():
        assert t in paths[pid].thresholds
    for (tier, _c), row in r.routing.items():
        assert all(q >= -1e-9 for q in row.values())
        assert tier in r.planned_qpm
    routed = sum(sum(row.values()) for row in r.routing.values())
    planned = sum(r.planned_qpm.values())
    assert routed <= planned * (1 + 1e-6) + 1e-9
    assert routed >= planned * (1 - 1e-5) - 1e-9  # only negligible classes are left out
    plan = r.to_plan(version=3, created_s=1.0, policy="argus+")
    plan.validate()  # PASM rows are distributions
    assert plan.levels == p.plan_levels()
    assert set(plan.assignment) == set(p.workers)
    assert all(lv is None or lv in plan.levels for lv in plan.assignment.values())
    assert set(plan.thresholds) <= {q.id for q in p.paths if q.is_cascade}
    assert math.isclose(sum(plan.share), 1.0, abs_tol=1e-9)
    # the level of every pool that carries load has a worker
    for pool, load in r.loads.items():
        if load > 1e-6:
            assert r.counts[pool] >= 1


# --- properties on random instances ------------------------------------------------------------


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(problems())
def test_plan_is_feasible(p):
    check_feasible(p, plan_unified(p))


def test_no_flow_rides_on_a_pool_left_without_workers():
    """A saturated plan on one worker (three tiers, demand 25 QPM): the LP once left 8.5e-7 QPM on a
    path of a pool with no worker (4e-6 worker-seconds a minute, within its tolerance). Such slivers
    are dropped: every pool that carries load has workers."""
    paths = tuple(
        ServingPath(pid, strategy, Stage(pid, pool, lat, lat, (1.0, 1.0)))
        for pid, strategy, pool, lat in (
            ("p0", Strategy.AC, "m0", 4.0),
            ("p1", Strategy.SM, "m1", 5.0),
            ("p2", Strategy.SM, "m0", 3.0),
            ("p3", Strategy.AC, "m0", 3.0),
        )
    )
    p = UnifiedProblem(
        classes=("k0", "k1"),
        affinity=(0.0, 0.0),
        paths=paths,
        pools=tuple(Pool(m, m, 0.0, ()) for m in ("m0", "m1", "m2")),
        workers=("w0",),
        demand_qpm=25.0,
        tiers=(TierSpec("t0", 1.0, 1.0, 1.0, 1.5), TierSpec("t1", 1.0, 1.0), TierSpec("t2", 1.0, 1.0)),
    )
    for formulation in FORMULATIONS:
        r = plan_unified(p, formulation=formulation)
        check_feasible(p, r)
        assert all(load == 0.0 for pool, load in r.loads.items() if r.counts[pool] == 0)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(problems())
def test_exact_search_matches_the_milp(p):
    """The value pass: both formulations reach the same value. It is compared without a current
    assignment, i.e. without the switch-cost pass: that pass keeps any plan whose value is at least
    the first pass's (switch tolerance 0: to 1e-7) and, among those of the least switch cost, has
    no preference its LP can see between values closer than the first pass's tie-break (TIE_BREAK:
    it may turn down a path worth 1e-5 more, e.g. qualities 0.99999 and 1.0). Which of them it
    returns depends on the threshold the first pass left on a cascade carrying no traffic (the
    MILP's free binary, the search's interval start), so the plans with a current assignment are
    held to that contract instead (test_switch_pass_exact_matches_milp compares switch costs)."""
    p0 = dataclasses.replace(p, current={}, resident={})
    a = plan_unified(p0, formulation="exact", gap=0.0, switch_tolerance=0.0)
    b = plan_unified(p0, formulation="milp", backend="highs", switch_tolerance=0.0)
    assert a.saturated == b.saturated
    assert close(a.shortfall_qpm, b.shortfall_qpm, scale=p.demand_qpm)
    assert close(a.objective, b.objective, scale=p.demand_qpm), (a.objective, b.objective, a.notes, b.notes)
    check_feasible(p0, b)
    if p.current:
        for formulation in FORMULATIONS:
            r = plan_unified(p, formulation=formulation, backend="highs", gap=0.0, switch_tolerance=0.0)
            if formulation == "milp":
                check_feasible(p, r)
            assert r.objective >= a.objective - 1e-6 * max(1.0, abs(a.objective), p.demand_qpm), (
                formulation,
                r.objective,
                a.objective,
            )


def served_key(r) -> list[float]:
    """What a plan serves, in priority order: each tier's demand, then its headroom."""
    out = []
    for t in r.tiers:
        out += [-r.shortfall_by_tier[t], r.planned_qpm[t]]
    return out


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(problems())
def test_never_worse_than_the_best_single_strategy_plan(p):
    """Every single-strategy plan (AC only, SM only, cascades only) is a plan of the unified
    problem, so the unified optimum is at least as good: it serves at least as much in priority
    order (each tier's demand, then its headroom), and when both serve the same its value is no
    lower (switch tolerance 0: a plan may otherwise give up that share of its value to move fewer
    workers)."""
    u = plan_unified(p, gap=0.0, switch_tolerance=0.0)
    for s in (Strategy.AC, Strategy.SM, Strategy.CASCADE):
        if not any(q.strategy is s for q in p.paths):
            continue
        single = plan_unified(restrict(p, {s}), gap=0.0, switch_tolerance=0.0)
        tol = 1e-5 * max(1.0, p.demand_qpm)
        for a, b in zip(served_key(u), served_key(single), strict=True):
            assert a >= b - tol, (s, served_key(u), served_key(single))
            if a > b + tol:
                break
        else:
            assert u.objective >= single.objective - 1e-6 * max(1.0, abs(single.objective), p.demand_qpm), (
                s,
                u,
                single,
            )


@settings(max_examples=max(1, EXAMPLES * 2 // 3), **SETTINGS)
@given(problems())
def test_replanning_from_its_own_plan_moves_nobody(p):
    first = plan_unified(dataclasses.replace(p, current={}, resident={}), gap=0.0)
    again = plan_unified(dataclasses.replace(p, current=dict(first.assignment), resident={}), gap=0.0)
    assert again.moved_workers == 0
    assert again.switch_cost == 0.0
    assert again.objective >= first.objective * (1 - 0.005) - 1e-6


@settings(max_examples=max(1, EXAMPLES * 2 // 3), **SETTINGS)
@given(problems())
def test_switch_pass_exact_matches_milp(p):
    if not p.current:
        p = dataclasses.replace(p, current={w: p.pools[0].id for w in p.workers})
    a = plan_unified(p, formulation="exact", gap=0.0)
    b = plan_unified(p, formulation="milp", backend="highs")
    check_feasible(p, a)
    if close(a.objective, b.objective, 0.006) and a.thresholds == b.thresholds:
        assert a.switch_cost == pytest.approx(b.switch_cost, abs=1e-6)


# --- tiers -------------------------------------------------------------------------------------


def two_path_problem(W: int, demand: float, tiers, *, current=None, resident=None) -> UnifiedProblem:
    """One class; a best path on model "xl" (4 s) and a fast one on "small" (1 s, quality 0.8)."""
    paths = (
        ServingPath("xl", Strategy.SM, Stage("xl", "xl", 4.0, 4.0, (1.0,))),
        ServingPath("small", Strategy.SM, Stage("small", "small", 1.0, 1.0, (0.8,))),
    )
    return UnifiedProblem(
        classes=("xl",),
        affinity=(1.0,),
        paths=paths,
        pools=(Pool("xl", "xl", 9.0, ("xl",)), Pool("small", "small", 3.0, ("small",))),
        workers=tuple(f"w{i}" for i in range(W)),
        demand_qpm=demand,
        tiers=tuple(tiers),
        current=current or {},
        resident=resident or {},
        levels=("xl", "small"),
    )


def test_a_cold_start_takes_the_value_pass_plan():
    """No worker runs or holds a model: every placement moves nothing, so the switch-cost pass would
    return any plan within its tolerance (the MILP spread workers over light models, and later
    periods kept them); the plan is the value pass's, as with no current assignment at all."""
    from collections import Counter

    p = realistic(24, 2.0, tiered=True)
    cold = dataclasses.replace(p, current={w: None for w in p.workers}, resident={})
    fresh = dataclasses.replace(p, current={}, resident={})
    a = plan_unified(cold, formulation="milp", backend="highs", switch_tolerance=0.02)
    b = plan_unified(fresh, formulation="milp", backend="highs", switch_tolerance=0.02)
    assert a.objective == pytest.approx(b.objective)
    assert Counter(a.assignment.values()) == Counter(b.assignment.values())
    assert a.moved_workers == 0 and a.switch_cost == 0.0


def test_overload_cuts_batch_before_standard_before_interactive():
    tiers = nitsum_tiers(10.0, {"interactive": 0.2, "standard": 0.3, "batch": 0.5}, headroom={"interactive": 1.5})
    # 4 workers serve at most 240 QPM on the 1 s path; the demand is 400 QPM
    p = two_path_problem(4, 400.0, tiers)
    r = plan_unified(p)
    assert r.saturated
    assert r.planned_qpm["interactive"] == pytest.approx(400 * 0.2 * 1.5, rel=1e-5)  # demand and headroom kept
    assert r.planned_qpm["standard"] == pytest.approx(400 * 0.3, rel=1e-5)
    assert r.planned_qpm["batch"] == pytest.approx(0.0, abs=1e-3)
    assert r.shortfall_qpm == pytest.approx(200.0)
    assert any("batch 200.0" in n for n in r.notes)
    check_feasible(p, r)
    # a little less demand: batch keeps what is left once the others are planned
    r = plan_unified(two_path_problem(4, 250.0, tiers))
    assert r.planned_qpm["interactive"] == pytest.approx(75.0, rel=1e-5)
    assert r.planned_qpm["standard"] == pytest.approx(75.0, rel=1e-5)
    assert r.planned_qpm["batch"] == pytest.approx(90.0, rel=1e-5)
    assert r.shortfall_qpm == pytest.approx(35.0, rel=1e-4)


def test_headroom_is_cut_from_the_lowest_tier_first():
    tiers = nitsum_tiers(10.0, {"interactive": 0.5, "batch": 0.5}, headroom={"interactive": 1.5, "batch": 1.5})
    # 4 workers: 240 QPM at most; demand 180: both headrooms (270) do not fit, interactive's does
    r = plan_unified(two_path_problem(4, 180.0, tiers))
    assert not r.saturated
    assert r.planned_qpm["interactive"] == pytest.approx(135.0, rel=1e-5)
    assert 90.0 <= r.planned_qpm["batch"] < 135.0
    assert any("headroom" in n for n in r.notes)


def test_tier_deadlines_send_interactive_requests_to_paths_that_meet_them():
    tiers = (TierSpec("interactive", 0.5, 2.0), TierSpec("batch", 0.5, 20.0))
    p = two_path_problem(8, 60.0, tiers)
    r = plan_unified(p)
    assert set(r.routing[("interactive", "xl")]) == {"small"}  # the 4 s path would be late
    assert set(r.routing[("batch", "xl")]) == {"xl"}
    assert r.goodput == pytest.approx({"interactive": 1.0, "batch": 1.0})
    # the same planner without tier awareness (one tier at the batch deadline) sends both to "xl"
    flat = plan_unified(dataclasses.replace(p, tiers=(TierSpec("standard", 1.0, 20.0),)))
    assert set(flat.routing[("standard", "xl")]) == {"xl"}
    # per-tier PASM: what a tier-aware router would use
    plan = r.to_plan()
    assert r.pasm("interactive")[0] == (0.0, 1.0)
    assert r.pasm("batch")[0] == (1.0, 0.0)
    assert plan.pasm[0] == pytest.approx((0.5, 0.5))


def test_tier_weights_favour_the_heavier_tier_when_capacity_is_short():
    tiers = (TierSpec("a", 0.5, 20.0, weight=3.0), TierSpec("b", 0.5, 20.0, weight=1.0))
    r = plan_unified(two_path_problem(3, 90.0, tiers))  # not enough "xl" time for both tiers
    xl_a = r.routing[("a", "xl")].get("xl", 0.0)
    xl_b = r.routing[("b", "xl")].get("xl", 0.0)
    assert xl_a > xl_b


# --- switch costs ------------------------------------------------------------------------------


def test_moving_to_a_resident_model_loads_nothing():
    tiers = (TierSpec("standard", 1.0, 20.0),)
    # all 4 workers run "xl"; the demand needs the fast model on some of them
    cur = {f"w{i}": "xl" for i in range(4)}
    resident = {"w0": frozenset({"small"}), "w1": frozenset({"small"})}
    r = plan_unified(two_path_problem(4, 150.0, tiers, current=cur, resident=resident))
    movers = [w for w, pool in r.assignment.items() if pool == "small"]
    assert movers and set(movers) <= {"w0", "w1"}
    assert r.switch_cost == pytest.approx(len(movers))  # 1 per moved worker, no load time
    no_res = plan_unified(two_path_problem(4, 150.0, tiers, current=cur))
    assert no_res.switch_cost == pytest.approx(no_res.moved_workers * (1 + 3.0))  # small's load time


def test_switch_tolerance_keeps_workers_where_they_are():
    tiers = (TierSpec("standard", 1.0, 20.0),)
    cur = {f"w{i}": "small" for i in range(4)}
    p = two_path_problem(4, 40.0, tiers, current=cur)
    stay = plan_unified(p, switch_tolerance=0.25)  # all-small (0.8) is within 25% of the best
    assert stay.moved_workers == 0
    move = plan_unified(p, switch_tolerance=0.0)
    assert move.moved_workers > 0
    assert move.objective > stay.objective


def test_gone_workers_are_noted_and_left_out():
    tiers = (TierSpec("standard", 1.0, 20.0),)
    cur = {"w0": "xl", "w1": "xl", "gone": "xl"}
    p = two_path_problem(2, 10.0, tiers)
    p = dataclasses.replace(p, current={w: v for w, v in cur.items()})
    r = plan_unified(p)
    assert "gone" not in r.assignment
    assert any("gone" in n for n in r.notes)


# --- failure paths -----------------------------------------------------------------------------


def test_no_workers_gives_a_valid_saturated_plan():
    p = two_path_problem(0, 30.0, (TierSpec("standard", 1.0, 20.0),))
    r = plan_unified(p)
    assert r.saturated and r.assignment == {}
    r.to_plan().validate()


def test_no_demand_routes_every_class_to_its_best_path():
    p = two_path_problem(3, 0.0, (TierSpec("standard", 1.0, 20.0),))
    r = plan_unified(p)
    assert not r.saturated and r.demand_qpm == 0.0
    assert set(r.routing[("standard", "xl")]) == {"xl"}
    assert sum(r.counts.values()) == 3
    r.to_plan().validate()


def test_a_search_stopped_at_a_limit_keeps_its_best_plan():
    p = worked_example()
    r = plan_unified(p, node_limit=1, gap=0.0)
    assert any("node limit" in n for n in r.notes)
    assert r.backend in ("exact-incumbent", "highs", "gurobi")  # the MILP when the search had no plan
    check_feasible(p, r)
    t = plan_unified(p, time_limit_s=1e-9, gap=0.0)
    assert any("time limit" in n for n in t.notes)
    check_feasible(p, t)


def test_every_solver_failure_still_returns_a_valid_plan(monkeypatch):
    p = worked_example()

    def broken(*_a, **_k):
        return SolveResult("error", None, None, "highs", "broken for the test")

    monkeypatch.setattr(backends, "solve_milp", broken)
    r = plan_unified(p, node_limit=1, gap=0.0)  # the search stops at once, the MILP fails
    assert r.backend in ("exact-incumbent", "fallback")
    check_feasible(p, r)
    m = plan_unified(p, formulation="milp")  # the MILP fails, the exact search answers
    assert m.backend == "exact" and any("broken" in n for n in m.notes)
    check_feasible(p, m)
    # in overload the served-volume MILP fails too: each tier's parts are cut by one share instead
    tiers = nitsum_tiers(10.0, {"interactive": 0.2, "standard": 0.3, "batch": 0.5})
    over = two_path_problem(4, 400.0, tiers)
    o = plan_unified(over)
    assert o.saturated and any("served-volume MILP failed" in n for n in o.notes)
    assert o.planned_qpm["interactive"] == pytest.approx(80.0, rel=1e-5)
    check_feasible(over, o)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"formulation": "nope"}, "formulation"),
        ({"backend": "cplex"}, "backend"),
        ({"switch_tolerance": 2.0}, "switch_tolerance"),
        ({"gap": -1.0}, "gap"),
        ({"time_limit_s": 0.0}, "time_limit_s"),
    ],
)
def test_bad_options_name_the_field(kwargs, field):
    p = two_path_problem(2, 10.0, (TierSpec("standard", 1.0, 20.0),))
    with pytest.raises(ConfigError, match=field):
        plan_unified(p, **kwargs)


def test_bad_problems_name_the_field():
    base = two_path_problem(2, 10.0, (TierSpec("standard", 1.0, 20.0),))
    bad = [
        (dataclasses.replace(base, affinity=(1.0, 2.0)), "affinity"),
        (dataclasses.replace(base, demand_qpm=-1.0), "demand_qpm"),
        (dataclasses.replace(base, tiers=(TierSpec("t", 1.0, 5.0, headroom=0.5),)), "headroom"),
        (dataclasses.replace(base, current={"w0": "nope"}), "current"),
        (dataclasses.replace(base, paths=(*base.paths, base.paths[0])), "duplicate"),
    ]
    for p, field in bad:
        with pytest.raises(ConfigError, match=field):
            plan_unified(p)


# --- the adapter from profiles ------------------------------------------------------------------


def test_ac_profile_with_a_hit_rate_runs_misses_at_k0():
    prof = load_profile("sdxl-ac-a100")
    p = problem_from_profile(prof, 8, 100.0, hit_rate=0.7)
    assert [q.id for q in p.pools] == ["sdxl-base-1.0"]
    k25 = next(q for q in p.paths if q.id == "sdxl-k25")
    assert k25.miss is not None and k25.miss.service_s == pytest.approx(4.2) and k25.hit_rate == 0.7
    r = plan_unified(p)
    plan = r.to_plan()
    assert plan.levels == prof.ids and plan.strategy is Strategy.AC
    check_feasible(p, r)


def test_cascade_profile_plan_keys_the_threshold_by_its_light_level():
    prof = load_profile("cascade-sdturbo-sdv15")
    spec = prof.cascade
    tables = ranked_deferral(prof, [spec])
    p = problem_from_profile(prof, 16, 1500.0, cascade_tables=tables, batch_sizes={"sdturbo": 8})
    r = plan_unified(p)
    check_feasible(p, r)
    plan = r.to_plan()
    assert set(plan.thresholds) == {"sdturbo"} and plan.thresholds["sdturbo"] in spec.thresholds
    assert plan.batch_sizes["sdturbo"] == 8
    routing = PlanRouting(plan)
    for row in range(len(plan.levels)):
        for u in (0.01, 0.5, 0.99):
            assert routing.workers[routing.sample(row, u)]  # only levels with workers are drawn


def test_merged_profile_with_two_cascades():
    p = realistic(64, 40.0, tiered=True)
    r = plan_unified(p)
    check_feasible(p, r)
    plan = r.to_plan()
    assert set(plan.thresholds) == {"sdxl-lightning", "sdturbo"}
    # H · PASM = F over the whole plan
    H = np.zeros(len(plan.levels))
    for (_t, c), row in r.routing.items():
        H[plan.levels.index(c)] += sum(row.values())
    F = H / H.sum() @ np.asarray(plan.pasm)
    assert pytest.approx(plan.share, abs=1e-9) == F


def test_adapter_bad_input_names_the_field():
    prof = load_profile("sdxl-ac-a100")
    with pytest.raises(ConfigError, match="hit_rate"):
        problem_from_profile(prof, 2, 10.0, hit_rate=1.5)
    with pytest.raises(ConfigError, match="batch_sizes"):
        problem_from_profile(prof, 2, 10.0, batch_sizes={"nope": 2})
    with pytest.raises(ConfigError, match="affinity"):
        problem_from_profile(prof, 2, 10.0, affinity=[1.0])
    with pytest.raises(ConfigError, match="cascades"):
        problem_from_profile(prof, 2, 10.0, cascades=[CascadeSpec("x", "sdxl-k0", 0.01, (0.0,), (0.0,))])
    with pytest.raises(ConfigError, match="current"):
        problem_from_profile(prof, ["w0"], 10.0, current={"w0": "nope"})


def test_ranked_deferral_rises_with_deferral():
    prof, specs = merged_profile(
        load_profile("sdxl-ac-a100"), load_profile("sm-a100"), {"sdturbo": load_profile("cascade-sdturbo-sdv15")}
    )
    _deferral, accepted = ranked_deferral(prof, specs)["sdturbo"]
    light = class_quality_model(prof.levels)
    j = prof.index("sdturbo")
    for c, row in enumerate(accepted):
        assert row[0] == pytest.approx(light[c][j])  # f = 0: the light level's quality
        assert all(b >= a - 1e-12 for a, b in itertools.pairwise(row))
        assert all(0.0 <= v <= 1.0 for v in row)
    assert specs[0].heavy == "sd-1.5"  # mapped onto the SM ladder's SD-1.5


def test_an_uninformed_discriminator_never_beats_straight_routing():
    """With the light level's own quality for the kept images, a cascade at any threshold costs the
    light run on top of what sending the same shares straight to each stage costs: with the heavy
    level a path of its own, the plan is as good with the lowest threshold (no deferral) alone."""
    prof = load_profile("cascade-sdturbo-sdv15")
    p = problem_from_profile(prof, 8, 400.0)
    r = plan_unified(p, gap=0.0)

    def lowest_only(q: ServingPath) -> ServingPath:
        if not q.is_cascade:
            return q
        return dataclasses.replace(q, thresholds=q.thresholds[:1], deferral=tuple(row[:1] for row in q.deferral))

    low = plan_unified(dataclasses.replace(p, paths=tuple(lowest_only(q) for q in p.paths)), gap=0.0)
    assert r.objective == pytest.approx(low.objective, rel=1e-6)


# --- the worked example of docs/solver.md ------------------------------------------------------


def worked_example() -> UnifiedProblem:
    """docs/solver.md, "Worked example": 6 workers, 150 QPM, two tiers."""
    classes = ("xl-k0", "xl-k20", "lightning", "tiny")
    k0 = Stage("xl-k0", "sdxl", 4.2, 4.2, (1.0, 1.0, 1.0, 1.0))
    paths = (
        ServingPath("xl-k0", Strategy.AC, k0),
        ServingPath(
            "xl-k20", Strategy.AC, Stage("xl-k20", "sdxl", 2.6, 2.6, (0.93, 1.0, 1.0, 1.0)), hit_rate=0.8, miss=k0
        ),
        ServingPath(
            "lightning",
            Strategy.CASCADE,
            Stage("lightning", "lightning", 0.56, 0.56, (0.82, 0.9, 1.0, 1.0)),
            heavy=k0,
            thresholds=(0.0, 0.25, 0.5),
            deferral=((0.0, 0.5, 0.8), (0.0, 0.25, 0.5), (0.0, 0.05, 0.15), (0.0, 0.05, 0.15)),
            accepted=((0.82, 0.95, 0.98), (0.9, 0.98, 1.0), (1.0, 1.0, 1.0), (1.0, 1.0, 1.0)),
        ),
        ServingPath("tiny", Strategy.SM, Stage("tiny", "tiny", 0.6, 0.6, (0.75, 0.85, 0.97, 1.0))),
    )
    pools = (
        Pool("sdxl", "sdxl", 9.42, ("xl-k0", "xl-k20")),
        Pool("lightning", "lightning", 9.42, ("lightning",)),
        Pool("tiny", "tiny", 2.91, ("tiny",)),
    )
    tiers = (TierSpec("interactive", 0.25, 5.0, 1.0, 1.25), TierSpec("batch", 0.75, 12.6, 1.0, 1.0))
    return UnifiedProblem(
        classes=classes,
        affinity=(0.3, 0.3, 0.2, 0.2),
        paths=paths,
        pools=pools,
        workers=tuple(f"w{i}" for i in range(6)),
        demand_qpm=150.0,
        tiers=tiers,
    )


def test_worked_example():
    """The numbers docs/solver.md quotes."""
    p = worked_example()
    r = plan_unified(p, gap=0.0)
    assert r.planned_qpm == pytest.approx({"interactive": 46.875, "batch": 112.5})
    assert dict(r.counts) == {"sdxl": 5, "lightning": 1, "tiny": 0}
    assert r.thresholds == {"lightning": 0.25}
    assert r.deferral["lightning"] == pytest.approx(0.1122, abs=1e-4)
    assert r.objective == pytest.approx(158.943, abs=1e-3)
    assert r.expected_quality == pytest.approx(0.9973, abs=1e-4)
    assert r.loads["sdxl"] == pytest.approx(300.0, abs=1e-6)
    assert r.loads["lightning"] == pytest.approx(51.81, abs=1e-2)
    # per class over both tiers (the split between tiers of equal value is not unique)
    by_class = {}
    for (_t, c), row in r.routing.items():
        for path, qpm in row.items():
            by_class.setdefault(c, {}).setdefault(path, 0.0)
            by_class[c][path] += qpm
    assert by_class == {
        "xl-k0": pytest.approx({"xl-k0": 47.8125}),
        "xl-k20": pytest.approx({"xl-k20": 19.036, "lightning": 28.777}, abs=1e-3),
        "lightning": pytest.approx({"lightning": 31.875}),
        "tiny": pytest.approx({"lightning": 31.875}),
    }
    singles = {s: plan_unified(restrict(p, {s}), gap=0.0) for s in (Strategy.AC, Strategy.SM, Strategy.CASCADE)}
    assert singles[Strategy.AC].saturated
    assert singles[Strategy.AC].objective == pytest.approx(122.500, abs=1e-3)
    assert singles[Strategy.SM].objective == pytest.approx(139.294, abs=1e-3)
    assert singles[Strategy.CASCADE].objective == pytest.approx(157.463, abs=1e-3)
    assert singles[Strategy.CASCADE].thresholds == {"lightning": 0.25}
    for f in ("exact", "milp"):
        assert plan_unified(p, formulation=f, backend="highs", gap=0.0).objective == pytest.approx(158.943, abs=1e-3)


def test_one_threshold_is_shared_by_the_tiers():
    """docs/solver.md, "Limits": with interactive's deadline at 3 s a deferred request (light +
    heavy, 4.76 s) is late for it, and the one threshold of the light level goes to 0 for every
    tier, though batch alone would defer at t = 0.25."""
    p = worked_example()
    tight = dataclasses.replace(p, tiers=(TierSpec("interactive", 0.25, 3.0, 1.0, 1.25), p.tiers[1]))
    assert plan_unified(tight, gap=0.0).thresholds == {"lightning": 0.0}
    batch_only = dataclasses.replace(p, tiers=(TierSpec("batch", 1.0, 12.6),))
    assert plan_unified(batch_only, gap=0.0).thresholds == {"lightning": 0.25}


def test_gurobi_and_highs_agree_on_the_worked_example(caplog):
    from solver.backends import gurobi_available

    if not gurobi_available():
        pytest.skip("gurobipy is not installed or has no licence")
    caplog.set_level(logging.WARNING)
    p = worked_example()
    a = plan_unified(p, formulation="milp", backend="gurobi")
    b = plan_unified(p, formulation="milp", backend="highs")
    assert a.objective == pytest.approx(b.objective, abs=1e-6)


@pytest.mark.parametrize("formulation", ["exact", "milp"])
def test_spare_capacity_goes_to_the_best_level(formulation):
    """ARGUS's class model ties every level at least as good as a class's optimal one; with capacity
    to spare (61 QPM on 8 A100s, SD-XL alone carries 114) the plan breaks the tie toward the level
    better for the average prompt: every class whose SD-XL run fits goes to SD-XL K = 0, and no
    cascade threshold that defers everything (the direct SD-XL path does that with less work)."""
    from argusdiff.profile import load_profile
    from solver.paths import problem_from_profile, ranked_deferral

    profile = load_profile("unified-a100")
    specs = list(profile.cascade_specs)
    problem = problem_from_profile(profile, 8, 61.0, cascades=specs, cascade_tables=ranked_deferral(profile, specs))
    plan = plan_unified(problem, formulation=formulation)
    served = {}
    for (_tier, _c), paths in plan.routing.items():
        for path, qpm in paths.items():
            served[path] = served.get(path, 0.0) + qpm
    assert served.get("sdxl-k0", 0.0) >= 0.7 * 61.0, served
    ac_below = {p.id for p in problem.paths if p.id.startswith("sdxl-k") and p.id != "sdxl-k0"}
    assert not any(served.get(p, 0.0) > 1e-6 for p in ac_below), served
    for light, t in plan.thresholds.items():
        path = next(p for p in problem.paths if p.id == light)
        k = path.thresholds.index(t) if path.thresholds else 0
        if served.get(light, 0.0) > 1e-6 and path.deferral:
            assert min(row[k] for row in path.deferral) < 1.0, (light, t)


def test_a_cold_start_plan_gives_up_no_value_for_load_times():
    """Workers with no model load one whatever the plan, so the switch pass (which may give up
    ``switch_tolerance`` of value to move fewer workers) has nothing to save on a cold start: the
    first plan is the best plan, not one that favours models with short load times. Per-class
    quality here is each level's profiled quality for every class (SD-XL strictly best), so giving
    up value shows."""
    from argusdiff.profile import load_profile
    from solver.paths import problem_from_profile, ranked_deferral

    profile = load_profile("unified-a100")
    specs = list(profile.cascade_specs)
    workers = [f"w{i}" for i in range(8)]
    row = tuple(lv.quality / profile.levels[0].quality for lv in profile.levels)
    kw = dict(cascades=specs, cascade_tables=ranked_deferral(profile, specs), class_quality=[row] * len(profile.levels))
    problem = problem_from_profile(profile, workers, 78.0, current=dict.fromkeys(workers), **kw)
    best = plan_unified(problem, switch_tolerance=0.0)
    assert best.counts["sdxl-base-1.0"] >= 6
    for formulation in ("exact", "milp"):
        cold = plan_unified(problem, formulation=formulation, switch_tolerance=0.02)
        assert cold.objective >= best.objective * (1 - 1e-4), (formulation, dict(cold.counts), dict(best.counts))
    # a worker already running a model still weighs its move against the tolerance: four SD-1.5
    # workers stay where moving them to SD-XL would gain less than 2 % of the value
    current = {w: ("sd-1.5" if i < 4 else "sdxl-k0") for i, w in enumerate(workers)}
    kept = plan_unified(problem_from_profile(profile, workers, 78.0, current=current, **kw), switch_tolerance=0.02)
    assert kept.counts["sd-1.5"] > 0 and kept.objective < best.objective


def test_a_class_the_cascade_defers_entirely_is_worth_nothing_there():
    """Where a cascade's threshold defers every request of a class, that class gets the direct heavy
    path's images through the cascade, with more work and more latency (and, when the heavy queue
    runs late, the worst light images back): the class's entry at that threshold is worth nothing,
    so no plan routes it there, not even the switch-cost pass, which weighs value alone and on a
    cold start favours models that load fast (the README trace on 24 workers sent most of its
    demand through the SDXL-Lightning cascade so). A class the threshold defers only in part keeps
    its value."""
    from solver.paths import problem_from_profile
    from solver.unified_model import compile_paths

    profile = load_profile("unified-a100")
    specs = [c for c in profile.cascade_specs if c.light == "sdxl-lightning"]
    C, n_t = len(profile.levels), len(specs[0].thresholds)
    part = C - 2  # this class keeps 1% of its light images at every threshold above 0
    defer = tuple(tuple(0.0 if i == 0 else (0.99 if c == part else 1.0) for i in range(n_t)) for c in range(C))
    kept = tuple(tuple(0.5 if i == 0 else 1.0 for i in range(n_t)) for _ in range(C))  # half as good kept all
    problem = problem_from_profile(
        profile,
        8,
        54.0,
        cascades=specs,
        class_quality=tuple(tuple(1.0 for _ in range(C)) for _ in range(C)),
        cascade_tables={"sdxl-lightning": (defer, kept)},
    )
    group = next(g for g in compile_paths(problem).groups if g.path.id == "sdxl-lightning")
    above = [j for j, v in enumerate(group.variants) if v > 0]
    assert above, group.variants  # the thresholds above 0 survive: one class keeps light images
    others = [c for c in range(C) if c != part]
    assert np.all(group.val[:, others][:, :, above] == 0.0)
    assert np.all(group.good[:, others][:, :, above] == 0.0)
    assert np.all(group.val[:, part, above] > 0.99)
    assert np.all(group.val[:, :, [j for j, v in enumerate(group.variants) if v == 0]] > 0.0)


@settings(max_examples=max(1, EXAMPLES * 2 // 3), **SETTINGS)
@given(problems())
def test_a_kept_plan_is_within_the_tolerance_of_the_best(p):
    """Re-planning with the running plan's counts and thresholds: whether the planner keeps it (no
    value MILP) or solves anew, the plan's value is within the switch tolerance of the best plan's;
    a kept plan moves nobody and keeps the thresholds."""
    first = plan_unified(dataclasses.replace(p, current={}, resident={}))
    if not all(first.assignment.get(w) for w in p.workers):
        return  # a worker left idle: no running plan on every worker to keep
    demand = p.demand_qpm * 1.1
    best = plan_unified(dataclasses.replace(p, current={}, resident={}, demand_qpm=demand), gap=0.0)
    running = dataclasses.replace(
        p, current=dict(first.assignment), current_thresholds=dict(first.thresholds), demand_qpm=demand
    )
    for formulation in FORMULATIONS:
        again = plan_unified(running, formulation=formulation, switch_tolerance=0.02)
        check_feasible(running, again)
        assert again.objective >= best.objective * (1 - 0.02) - 1e-6 * max(1.0, abs(best.objective))
        if again.backend == "kept":
            assert again.moved_workers == 0 and dict(again.assignment) == dict(first.assignment)
            assert dict(again.thresholds) == dict(first.thresholds)


@settings(max_examples=max(1, EXAMPLES * 2 // 3), **SETTINGS)
@given(problems())
def test_the_dual_bound_is_never_below_the_lp_relaxation(p):
    """The running plan's first two bounds (every request on its best path, the work's Lagrangian
    bound) never fall below the value MILP's LP relaxation: a plan they keep, the LP keeps too."""
    from solver import unified
    from solver.unified_search import best_path_bound, dual_bound, value_bound

    seen = []
    real = unified._model
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(unified, "_model", lambda *a: seen.append(real(*a)) or seen[-1])
        plan_unified(p)
    for m, _members in seen:
        lp = value_bound(m)
        if lp is not None:
            assert dual_bound(m) >= lp - 1e-7 * max(1.0, abs(lp))
            assert best_path_bound(m) >= dual_bound(m) - 1e-9 * max(1.0, abs(lp))


def _running_unified_a100(demand: float, then: float, **kw):
    """unified-a100 on 8 workers planned cold for ``demand``, then the problem of ``then`` QPM with
    that plan running (its models and thresholds)."""
    from solver.paths import problem_from_profile, ranked_deferral

    profile = load_profile("unified-a100")
    specs = list(profile.cascade_specs)
    workers = [f"w{i}" for i in range(8)]
    args = dict(cascades=specs, cascade_tables=ranked_deferral(profile, specs))
    first = plan_unified(problem_from_profile(profile, workers, demand, **args), formulation="milp")
    current = {w: next(lv.id for lv in profile.levels if lv.model == pool) for w, pool in first.assignment.items()}
    problem = problem_from_profile(profile, workers, then, current=current, **args, **kw)
    return first, problem


def test_the_running_plan_is_kept_without_a_value_milp(monkeypatch):
    """Demand moved a little: the running plan's LP is within the tolerance of the LP relaxation's
    bound, so no value MILP is solved and the plan moves no worker and keeps its thresholds. Without
    the running thresholds, or at a demand the running counts cannot carry, the MILP runs."""
    from solver import unified, unified_switch

    first, _ = _running_unified_a100(60.0, 66.0)
    _, problem = _running_unified_a100(60.0, 66.0, current_thresholds=dict(first.thresholds))
    solves, bounds = [], []
    real = unified.solve_value
    monkeypatch.setattr(unified, "solve_value", lambda *a: solves.append(1) or real(*a))
    real_bound, real_dual = unified_switch.value_bound, unified_switch.dual_bound
    monkeypatch.setattr(unified_switch, "value_bound", lambda m: bounds.append("lp") or real_bound(m))
    monkeypatch.setattr(unified_switch, "dual_bound", lambda m: bounds.append("dual") or real_dual(m))
    kept = plan_unified(problem, formulation="milp", switch_tolerance=0.02)
    # capacity to spare: every request on its best path bounds the value, no LP relaxation needed
    assert not solves and not bounds and kept.backend == "kept"
    assert kept.moved_workers == 0 and dict(kept.thresholds) == dict(first.thresholds)
    assert any("running plan kept" in n for n in kept.notes)
    fresh = plan_unified(dataclasses.replace(problem, current={}, resident={}), formulation="milp")
    assert kept.objective >= fresh.objective * (1 - 0.02)

    # capacity short: the running plan is kept on a bound of the LP relaxation, found without an LP
    first_busy, _ = _running_unified_a100(600.0, 630.0)
    _, busy_running = _running_unified_a100(600.0, 630.0, current_thresholds=dict(first_busy.thresholds))
    solves.clear()
    on_bound = plan_unified(busy_running, formulation="milp", switch_tolerance=0.02)
    assert bounds == ["dual"] and on_bound.backend == "kept" and not solves

    no_thresholds = plan_unified(dataclasses.replace(problem, current_thresholds={}), formulation="milp")
    assert solves and no_thresholds.backend != "kept"
    solves.clear()
    _, busy = _running_unified_a100(60.0, 400.0, current_thresholds=dict(first.thresholds))
    moved = plan_unified(busy, formulation="milp", switch_tolerance=0.02)
    assert solves and moved.backend != "kept"


def test_a_switch_pass_that_moves_no_worker_needs_no_milp(monkeypatch):
    """When every worker runs a pool and the plan that moves none is within the tolerance, the
    switch-cost pass answers with that plan's LP (the LP that polishes the MILP's answer) and
    solves no MILP; the plan is the one the MILP gives."""
    from solver import unified_switch
    from solver.paths import problem_from_profile, ranked_deferral

    profile = load_profile("unified-a100")
    specs = list(profile.cascade_specs)
    workers = [f"w{i}" for i in range(8)]
    kw = dict(cascades=specs, cascade_tables=ranked_deferral(profile, specs))
    first = plan_unified(problem_from_profile(profile, workers, 60.0, **kw), formulation="milp")
    current = {w: next(lv.id for lv in profile.levels if lv.model == pool) for w, pool in first.assignment.items()}
    problem = problem_from_profile(profile, workers, 66.0, current=current, **kw)
    milps = []
    real_milp = unified_switch.milp_switch
    monkeypatch.setattr(unified_switch, "milp_switch", lambda *a: milps.append(1) or real_milp(*a))
    fast = plan_unified(problem, formulation="milp", switch_tolerance=0.02)
    assert not milps and fast.moved_workers == 0

    first_call = [True]

    class NoShortcut(unified_switch.Search):
        def evaluate(self, n, ks):
            if first_call and first_call.pop():
                return None  # the shortcut's LP: as though the current counts were short
            return super().evaluate(n, ks)

    monkeypatch.setattr(unified_switch, "Search", NoShortcut)
    slow = plan_unified(problem, formulation="milp", switch_tolerance=0.02)
    assert milps
    assert dict(slow.assignment) == dict(fast.assignment)
    assert slow.thresholds == fast.thresholds and slow.objective == fast.objective
    assert {k: dict(v) for k, v in slow.routing.items()} == {k: dict(v) for k, v in fast.routing.items()}
