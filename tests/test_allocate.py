"""Allocation (ARGUS Eq. 1): formulations agree, saturation, switch cost, failures, bad input."""

from __future__ import annotations

import logging
import math
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from argusdiff.domain import ApproxLevel, Strategy
from argusdiff.errors import ConfigError
from argusdiff.profile import load_profile
from solver.allocate import allocate
from solver.model import greedy_loads, level_data, switch_cost


def make_levels(specs, model=None):
    """specs: [(latency_s, quality, load_time_s)] slowest first."""
    return tuple(
        ApproxLevel(
            id=f"v{i}",
            strategy=Strategy.SM,
            model=model or f"m{i}",
            steps=50,
            skip=0,
            latency_s={1: lat},
            quality=q,
            load_time_s=lt,
        )
        for i, (lat, q, lt) in enumerate(specs)
    )


@st.composite
def instances(draw, max_levels=5, max_workers=12):
    n = draw(st.integers(1, max_levels))
    lats = sorted(draw(st.lists(st.floats(0.2, 5.0), min_size=n, max_size=n)), reverse=True)
    qs = sorted(draw(st.lists(st.floats(0.5, 1.0), min_size=n, max_size=n)), reverse=True)
    levels = make_levels([(lat, q, 3.0) for lat, q in zip(lats, qs, strict=False)])
    W = draw(st.integers(1, max_workers))
    max_cap = W * max(lv.peak_qpm for lv in levels)
    demand = draw(st.floats(0.0, 1.0)) * max_cap
    return levels, W, demand


@pytest.fixture(scope="module")
def sdxl():
    return load_profile("sdxl-ac-a100")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_exact_aggregated_and_paper_reach_the_same_quality(inst):
    levels, W, demand = inst
    res = {f: allocate(levels, W, demand, formulation=f, backend="highs") for f in ("exact", "aggregated", "paper")}
    q = {f: r.expected_quality for f, r in res.items()}
    assert q["exact"] == pytest.approx(q["aggregated"], abs=1e-6)
    assert q["exact"] == pytest.approx(q["paper"], abs=1e-6)
    for r in res.values():
        assert sum(r.counts) == W
        assert math.fsum(r.share) == pytest.approx(1.0)
        assert r.capacity_qpm >= demand - 1e-6
        assert not r.saturated


@settings(max_examples=60, deadline=None)
@given(instances(max_levels=8, max_workers=300))
def test_exact_matches_aggregated_milp_on_larger_clusters(inst):
    levels, W, demand = inst
    # no wall-clock limit (as replays solve): a loaded machine otherwise cut a 100-worker MILP short
    a = allocate(levels, W, demand, formulation="exact", time_limit_s=math.inf)
    b = allocate(levels, W, demand, formulation="aggregated", backend="highs", time_limit_s=math.inf)
    assert a.expected_quality == pytest.approx(b.expected_quality, abs=1e-7)


@settings(max_examples=25, deadline=None)
@given(instances(max_levels=4, max_workers=6))
def test_exact_is_optimal_against_enumeration(inst):
    levels, W, demand = inst
    data = level_data(levels)
    best = -1.0

    def rec(k, left, counts):
        nonlocal best
        if k == len(levels) - 1:
            c = [*counts, left]
            loads, value = greedy_loads(data, c, demand)
            if sum(loads) >= demand - 1e-9:
                best = max(best, value)
            return
        for n in range(left + 1):
            rec(k + 1, left - n, [*counts, n])

    rec(0, W, [])
    a = allocate(levels, W, demand, formulation="exact")
    if demand > 0:
        assert a.expected_quality * demand == pytest.approx(best, abs=1e-7)
    else:
        # no load: everything at a best-quality level
        assert all(data.quality[v] == max(data.quality) for v, c in enumerate(a.counts) if c)


def test_known_instance_sdxl_8_gpus(sdxl):
    # 8 workers, 180 QPM: K=15 (20 QPM) and K=20 (23.08 QPM); 1*20 + 7*23.08 = 181.5 >= 180
    for f in ("exact", "aggregated", "paper"):
        a = allocate(sdxl.levels, 8, 180, formulation=f, backend="highs")
        assert a.counts == (0, 0, 0, 1, 7, 0)
        assert a.share[3] == pytest.approx(20 / 180)
        assert a.expected_quality == pytest.approx((20 * 0.955 + 160 * 0.93) / 180)
        assert set(a.assignment.values()) == {"sdxl-k15", "sdxl-k20"}


def test_low_load_runs_everything_at_the_best_level(sdxl):
    a = allocate(sdxl.levels, 8, 10, formulation="exact")
    assert a.counts == (8, 0, 0, 0, 0, 0)
    assert a.expected_quality == 1.0
    z = allocate(sdxl.levels, 8, 0)
    assert z.counts == (8, 0, 0, 0, 0, 0) and z.share[0] == 1.0


@pytest.mark.parametrize("formulation", ["exact", "aggregated", "paper"])
def test_saturation_returns_max_throughput_plan(sdxl, formulation):
    a = allocate(sdxl.levels, 8, 300, formulation=formulation, backend="highs")
    cap = 8 * 60 / 2.2
    assert a.saturated
    assert a.counts == (0, 0, 0, 0, 0, 8)
    assert a.capacity_qpm == pytest.approx(cap)
    assert a.shortfall_qpm == pytest.approx(300 - cap)
    assert a.share == (0, 0, 0, 0, 0, 1.0)


def test_margin_that_cannot_be_met_is_not_saturation(sdxl):
    cap = 8 * 60 / 2.2
    a = allocate(sdxl.levels, 8, cap * 0.95, margin=1.2)
    assert not a.saturated and a.shortfall_qpm == 0
    assert a.counts[-1] == 8
    assert any("margin" in n for n in a.notes)


def test_margin_adds_capacity(sdxl):
    plain = allocate(sdxl.levels, 8, 150)
    more = allocate(sdxl.levels, 8, 150, margin=1.2)
    assert more.capacity_qpm >= 180 - 1e-6
    assert more.expected_quality <= plain.expected_quality


@pytest.mark.parametrize("formulation", ["exact", "aggregated", "paper"])
def test_switch_cost_keeps_a_near_optimal_current_plan(sdxl, formulation):
    cur = allocate(sdxl.levels, 8, 150).assignment
    strict = allocate(sdxl.levels, 8, 160, current=cur, formulation=formulation, switch_tolerance=0.0, backend="highs")
    lax = allocate(sdxl.levels, 8, 160, current=cur, formulation=formulation, switch_tolerance=0.005, backend="highs")
    assert strict.moved_workers > lax.moved_workers
    assert lax.expected_quality >= strict.expected_quality * (1 - 0.005) - 1e-9
    assert lax.capacity_qpm >= 160 - 1e-9
    # workers that did not move kept their level
    kept = [w for w, lv in lax.assignment.items() if cur[w] == lv]
    assert len(kept) == 8 - lax.moved_workers


def test_switch_cost_prefers_moves_within_one_model():
    # levels 0 and 1 share a model, level 2 is another model with a long load time
    levels = (
        ApproxLevel("a", Strategy.SM, "big", 50, 0, {1: 2.0}, 1.0, 10.0),
        ApproxLevel("b", Strategy.SM, "big", 50, 10, {1: 1.5}, 0.93, 10.0),
        ApproxLevel("c", Strategy.SM, "small", 50, 0, {1: 1.5}, 0.93, 10.0),
    )
    data = level_data(levels)
    assert switch_cost(data, [2, 2, 0], [4, 0, 0]) == (2.0, 2)
    assert switch_cost(data, [2, 0, 2], [4, 0, 0]) == (22.0, 2)
    cur = {f"w{i}": "a" for i in range(4)}
    a = allocate(levels, 4, 140, current=cur, formulation="exact", switch_tolerance=0.0)
    assert a.counts[2] == 0 and a.switch_cost == 2.0


def test_lost_worker_replans_on_what_is_left(sdxl):
    ids = [f"gpu{i}" for i in range(8)]
    before = allocate(sdxl.levels, ids, 150)
    left = ids[:4]
    after = allocate(sdxl.levels, left, 150, current=before.assignment)
    assert set(after.assignment) == set(left)
    assert sum(after.counts) == 4
    assert after.saturated  # 4 workers at K=25 serve 109 QPM < 150
    assert after.shortfall_qpm == pytest.approx(150 - 4 * 60 / 2.2)
    assert any("gone" in n for n in after.notes)
    after2 = allocate(sdxl.levels, ids[:6], 150, current=before.assignment)
    assert not after2.saturated and sum(after2.counts) == 6


def test_no_workers():
    levels = make_levels([(1.0, 1.0, 1.0)])
    a = allocate(levels, 0, 10)
    assert a.saturated and a.shortfall_qpm == 10 and a.counts == (0,)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"demand_qpm": -1}, "demand_qpm"),
        ({"demand_qpm": float("nan")}, "demand_qpm"),
        ({"formulation": "magic"}, "formulation"),
        ({"backend": "cplex"}, "backend"),
        ({"margin": 0.5}, "margin"),
        ({"switch_tolerance": 2}, "switch_tolerance"),
        ({"workers": -3}, "workers"),
        ({"workers": 2.5}, "workers"),
        ({"workers": "w0"}, "workers"),
        ({"workers": ["a", "a"]}, "workers"),
        ({"current": {"w0": "nope"}}, "current"),
    ],
)
def test_bad_input_names_the_field(sdxl, kwargs, field):
    args = {"levels": sdxl.levels, "workers": 4, "demand_qpm": 50}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=field):
        allocate(**args)


@pytest.mark.parametrize("backend", ["highs", "gurobi", "auto"])
def test_backends_agree(sdxl, backend):
    a = allocate(sdxl.levels, 16, 300, formulation="aggregated", backend=backend)
    b = allocate(sdxl.levels, 16, 300, formulation="exact")
    assert a.expected_quality == pytest.approx(b.expected_quality, abs=1e-9)
    from solver import backends

    expected = "gurobi" if backend != "highs" and backends.gurobi_available() else "highs"
    assert a.backend == expected


def test_gurobi_size_limit_falls_back_to_highs(sdxl, caplog, monkeypatch):
    from solver import backends

    if not backends.gurobi_available():
        pytest.skip("gurobipy is not installed")
    # 6 levels x 200 workers: 2600 variables, over the bundled licence's 2000
    monkeypatch.setitem(backends._state, "fallback_logged", False)
    with caplog.at_level(logging.WARNING, logger="solver.backends"):
        a = allocate(sdxl.levels, 200, 3000, formulation="paper", backend="gurobi", time_limit_s=20)
        allocate(sdxl.levels, 200, 2900, formulation="paper", backend="gurobi", time_limit_s=20)
    assert a.backend == "highs"
    logged = [r for r in caplog.records if "falling back to HiGHS" in r.getMessage()]
    assert len(logged) == 1 and "10010" in logged[0].getMessage()
    b = allocate(sdxl.levels, 200, 3000, formulation="exact")
    assert a.expected_quality == pytest.approx(b.expected_quality, abs=1e-6)


def test_importing_solver_does_not_import_heavy_packages():
    code = (
        "import sys, solver, solver.allocate, solver.oda, solver.backends, solver.cascade, solver.exact\n"
        "import argusdiff.predictors, argusdiff.commands.plan\n"
        "heavy = [m for m in ('torch', 'diffusers', 'transformers', 'timm', 'open_clip', 'highspy', 'gurobipy')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_large_cluster_with_current_keeps_workers(sdxl):
    ids = [f"g{i}" for i in range(10000)]
    before = allocate(sdxl.levels, ids, 200000, formulation="exact")
    after = allocate(sdxl.levels, ids, 205000, current=before.assignment, formulation="exact")
    assert sum(after.counts) == 10000
    assert after.capacity_qpm >= 205000 - 1e-6
    moved = sum(1 for w in ids if after.assignment[w] != before.assignment[w])
    assert moved == after.moved_workers
    # no more moves than the count changes force
    forced = sum(max(0, a - b) for a, b in zip(after.counts, before.counts, strict=True))
    assert after.moved_workers == forced


@settings(max_examples=40, deadline=None)
@given(
    instances(max_levels=6, max_workers=40),
    st.floats(0.5, 1.0),
    st.sampled_from([0.0, 0.005, 0.02]),
    st.sampled_from(["exact", "aggregated"]),
)
def test_switch_aware_plans_stay_within_tolerance(inst, previous, tol, formulation):
    levels, W, demand = inst
    before = allocate(levels, W, demand * previous, formulation="exact")
    best = allocate(levels, W, demand, formulation="exact")
    after = allocate(
        levels, W, demand, current=before.assignment, formulation=formulation, switch_tolerance=tol, backend="highs"
    )
    assert sum(after.counts) == W
    assert after.capacity_qpm >= demand - 1e-6
    assert after.expected_quality >= best.expected_quality * (1 - tol) - 1e-7
    # never more switch cost than re-planning from scratch would cost
    data = level_data(levels)
    cur = list(before.counts)
    assert after.switch_cost <= switch_cost(data, best.counts, cur)[0] + 1e-9
    kept = sum(1 for w, lv in after.assignment.items() if before.assignment[w] == lv)
    assert kept == W - after.moved_workers


@st.composite
def unordered_instances(draw):
    """Levels in any order, with ties: dominated levels, equal speeds, equal qualities."""
    n = draw(st.integers(1, 6))
    lats = draw(st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.2, 4.2]), min_size=n, max_size=n))
    qs = draw(st.lists(st.sampled_from([0.6, 0.8, 0.9, 0.93, 1.0]), min_size=n, max_size=n))
    levels = make_levels([(lat, q, 1.0) for lat, q in zip(lats, qs, strict=True)])
    W = draw(st.integers(1, 60))
    demand = draw(st.floats(0.0, 1.0)) * W * max(lv.peak_qpm for lv in levels)
    return levels, W, demand


@settings(max_examples=80, deadline=None)
@given(unordered_instances())
def test_exact_matches_the_milp_on_unordered_levels(inst):
    levels, W, demand = inst
    # no wall-clock limit (as replays solve): a loaded machine otherwise cut a 100-worker MILP short
    a = allocate(levels, W, demand, formulation="exact", time_limit_s=math.inf)
    b = allocate(levels, W, demand, formulation="aggregated", backend="highs", time_limit_s=math.inf)
    assert a.expected_quality == pytest.approx(b.expected_quality, abs=1e-7)
    assert a.capacity_qpm >= demand - 1e-6


# --- solver failures never reach the caller --------------------------------------------------------


def _check_valid(a, levels, W, demand):
    assert sum(a.counts) == W and len(a.counts) == len(levels)
    assert a.capacity_qpm >= demand - 1e-6
    assert sum(a.loads_qpm) == pytest.approx(demand)
    assert sum(a.share) == pytest.approx(1.0)
    assert sum(1 for v in a.assignment.values() if v is not None) == W
    assert not a.saturated


def _broken_highs(*args, **kwargs):
    raise RuntimeError("simulated HiGHS crash")


@pytest.mark.parametrize("formulation", ["exact", "aggregated", "paper"])
def test_node_limit_and_failing_milp_still_give_a_plan(sdxl, monkeypatch, formulation):
    import solver.allocate as alloc
    from solver import backends

    optimal = allocate(sdxl.levels, 8, 180, formulation="exact")
    # the exact search stops after its first leaf; every MILP backend crashes
    monkeypatch.setattr(alloc, "EXACT_NODE_LIMIT", 1)
    monkeypatch.setattr(backends, "gurobi_available", lambda: False)
    monkeypatch.setattr(backends, "_solve_highs", _broken_highs)
    a = allocate(sdxl.levels, 8, 180, formulation=formulation, backend="highs")
    _check_valid(a, sdxl.levels, 8, 180)
    assert any("node limit" in n for n in a.notes)
    assert any("HiGHS failed: simulated HiGHS crash" in n for n in a.notes)
    assert a.backend in ("exact-incumbent", "fallback")
    assert a.expected_quality <= optimal.expected_quality + 1e-12


def test_node_limit_without_incumbent_gives_the_max_throughput_plan(sdxl, monkeypatch):
    import solver.allocate as alloc
    from solver.backends import SolveResult

    monkeypatch.setattr(alloc, "EXACT_NODE_LIMIT", 0)  # not even one node
    monkeypatch.setattr(alloc, "solve_milp", lambda *a, **k: SolveResult("error", None, None, "highs", "boom"))
    a = allocate(sdxl.levels, 8, 180, formulation="exact")
    _check_valid(a, sdxl.levels, 8, 180)
    assert a.backend == "fallback"
    assert a.counts == (0, 0, 0, 0, 0, 8)  # every worker at the fastest level
    assert any("maximum-throughput" in n for n in a.notes)


def test_node_limit_answered_by_the_milp(sdxl, monkeypatch):
    import solver.allocate as alloc

    monkeypatch.setattr(alloc, "EXACT_NODE_LIMIT", 1)
    a = allocate(sdxl.levels, 8, 180, formulation="exact", backend="highs")
    assert a.counts == (0, 0, 0, 1, 7, 0) and a.backend == "highs"  # the optimum, by the MILP
    assert any("node limit" in n for n in a.notes)


def test_milp_backend_crash_is_a_status_not_an_exception(monkeypatch):
    import numpy as np

    from solver import backends

    monkeypatch.setattr(backends, "gurobi_available", lambda: False)
    monkeypatch.setattr(backends, "_solve_highs", _broken_highs)
    res = backends.solve_milp(
        np.ones(1), np.ones((1, 1)), np.zeros(1), np.ones(1), np.zeros(1), np.ones(1), np.zeros(1, dtype=bool)
    )
    assert res.status == "error" and not res.ok and "simulated" in res.message


def test_switch_pass_counts_idle_workers_it_must_place(sdxl):
    """Regression: the aggregated switch-cost MILP could leave currently idle workers unassigned
    (free in its objective), and placing them afterwards gave a plan worse in quality AND in switch
    cost than the optimum. Both formulations now give the same plan."""
    ids = sdxl.ids
    per_level = [1, 3, 2, 1, 3, 0]
    current = {}
    for v, n in enumerate(per_level):
        for _ in range(n):
            current[f"w{len(current)}"] = ids[v]
    current["w10"] = current["w11"] = None
    W = 12
    D = 0.9 * W * max(lv.peak_qpm for lv in sdxl.levels)
    a = allocate(sdxl.levels, W, D, current=current, formulation="exact", switch_tolerance=0.02, backend="highs")
    b = allocate(sdxl.levels, W, D, current=current, formulation="aggregated", switch_tolerance=0.02, backend="highs")
    assert a.counts == b.counts
    assert a.expected_quality == pytest.approx(b.expected_quality, abs=1e-12)
    assert a.switch_cost == pytest.approx(b.switch_cost)


@pytest.mark.parametrize("profile", ["sdxl-ac-a100", "sm-a100"])
def test_aggregated_and_exact_give_the_same_plans(profile):
    """Same quality and switch cost, on a grid of loads, with and without a current plan; the same
    counts whenever there is a current plan (without one, only ties of equal quality may differ)."""
    import random

    p = load_profile(profile)
    rng = random.Random(7)
    for W in (3, 8, 16):
        cap = W * max(lv.peak_qpm for lv in p.levels)
        for frac in (0.1, 0.5, 0.8, 0.95):
            for cur in (None, {f"w{i}": rng.choice([*p.ids, None]) for i in range(W)}):
                a = allocate(p.levels, W, frac * cap, current=cur, formulation="exact", backend="highs")
                b = allocate(p.levels, W, frac * cap, current=cur, formulation="aggregated", backend="highs")
                assert a.expected_quality == pytest.approx(b.expected_quality, abs=1e-9)
                assert a.switch_cost == pytest.approx(b.switch_cost)
                if cur is not None:
                    assert a.counts == b.counts


@pytest.mark.parametrize("formulation", ["exact", "aggregated", "paper"])
def test_spare_workers_are_not_parked_where_no_load_goes(formulation):
    """Switch-cost awareness must not leave spare workers idle at levels the plan routes nothing
    to: at low load every spare worker joins the best level when moving it disrupts nothing."""
    from argusdiff.profile import load_profile

    ac = load_profile("sdxl-ac-a100")
    ids = [f"w{i}" for i in range(8)]
    # AC: workers spread over the K levels of one model; moving between them loads nothing
    current = {w: ac.levels[i % 4].id for i, w in enumerate(ids)}
    a = allocate(ac.levels, ids, 20.0, current=current, formulation=formulation)
    assert a.counts[0] == 8, a.counts
    # SM at a cold start: idle workers must load some model; they go to the best level
    sm = load_profile("sm-a100")
    b = allocate(sm.levels, ids, 20.0, current={w: None for w in ids}, formulation=formulation)
    assert b.counts[0] == 8, b.counts
    # SM with workers already running small models: spare ones that run something stay (no reload)
    cur = {w: sm.levels[-1].id for w in ids}
    c = allocate(sm.levels, ids, 20.0, current=cur, formulation=formulation)
    assert sum(c.counts) == 8 and c.expected_quality >= b.expected_quality - 0.005 * b.expected_quality


def test_spare_workers_can_form_a_burst_reserve_at_the_fastest_level():
    from argusdiff.errors import ConfigError
    from argusdiff.profile import load_profile

    sm = load_profile("sm-a100")
    ids = [f"w{i}" for i in range(8)]
    best = allocate(sm.levels, ids, 20.0, current={w: None for w in ids}, formulation="exact")
    fast = allocate(sm.levels, ids, 20.0, current={w: None for w in ids}, formulation="exact", spare="fastest")
    assert best.counts[0] == 8
    # the load still fits the levels it is routed to, and the spare workers wait at the fastest level
    assert fast.counts[-1] >= 1 and fast.counts[0] >= 1 and sum(fast.counts) == 8
    assert fast.expected_quality == pytest.approx(best.expected_quality)
    with pytest.raises(ConfigError, match="spare"):
        allocate(sm.levels, ids, 20.0, spare="nowhere")
