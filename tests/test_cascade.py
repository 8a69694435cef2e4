"""DiffServe's cascade MILP on the real f(t) and batch latency tables."""

from __future__ import annotations

import csv
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argusdiff.domain import ApproxLevel, CascadeSpec
from argusdiff.errors import ConfigError
from argusdiff.profile import load_profile
from solver.cascade import cascade_candidates, solve_cascade

CASCADES = ("cascade-sdturbo-sdv15", "cascade-sdxs-sdv15", "cascade-sdxlltn-sdxl")


def parts(name):
    p = load_profile(name)
    c = p.cascade
    return p, c, p.level(c.light), p.level(c.heavy)


def check_plan(r, c, light, heavy, S, demand, slo, over=1.05):
    D = demand * over
    assert r.x_light + r.x_heavy <= S
    t1 = 60 * r.b_light / (light.latency(r.b_light) + c.discriminator_latency_s * r.b_light)
    t2 = 60 * r.b_heavy / heavy.latency(r.b_heavy)
    assert r.x_light * t1 >= D - 1e-6
    assert r.x_heavy * t2 >= D * r.deferral - 1e-6
    assert r.latency_s <= slo + 1e-9
    assert r.deferral == pytest.approx(c.f(r.threshold))


@pytest.mark.parametrize("name", CASCADES)
@pytest.mark.parametrize(("workers", "demand"), [(16, 100), (16, 600), (16, 1500), (8, 300), (4, 40)])
def test_milp_matches_enumeration_on_shipped_tables(name, workers, demand):
    p, c, light, heavy = parts(name)
    slo = p.default_slo_s()
    r = solve_cascade(c, light, heavy, workers, demand, slo, backend="highs")
    cands = cascade_candidates(c, light, heavy, workers, demand, slo)
    if cands:
        assert r.feasible and not r.saturated
        assert r.threshold == pytest.approx(max(x[0] for x in cands))
        check_plan(r, c, light, heavy, workers, demand, slo)
        assert r.x_light + r.x_heavy == workers  # spare workers add headroom
    else:
        assert r.saturated


@pytest.mark.parametrize("name", CASCADES)
def test_backends_agree(name):
    from solver import backends

    if not backends.gurobi_available():
        pytest.skip("gurobipy is not installed")
    p, c, light, heavy = parts(name)
    for workers, demand in ((16, 300), (16, 1200), (8, 100)):
        a = solve_cascade(c, light, heavy, workers, demand, p.default_slo_s(), backend="highs")
        b = solve_cascade(c, light, heavy, workers, demand, p.default_slo_s(), backend="gurobi")
        assert b.backend == "gurobi"
        assert (a.threshold, a.x_light, a.x_heavy, a.b_light, a.b_heavy) == (
            b.threshold,
            b.x_light,
            b.x_heavy,
            b.b_light,
            b.b_heavy,
        )


def test_threshold_falls_as_demand_rises():
    p, c, light, heavy = parts("cascade-sdturbo-sdv15")
    ts = [solve_cascade(c, light, heavy, 16, d, p.default_slo_s()).threshold for d in (200, 800, 1200, 1600, 2400)]
    assert ts == sorted(ts, reverse=True)
    assert ts[0] > ts[-1]


def test_queueing_delay_by_littles_law_tightens_the_plan():
    p, c, light, heavy = parts("cascade-sdxlltn-sdxl")
    slo = p.default_slo_s()
    calm = solve_cascade(c, light, heavy, 16, 300, slo)
    # 8 queued heavy requests arriving at 100 QPM wait 8 * 60 / 100 = 4.8 s (Little's law): the
    # heavy model must run at batch 1, which serves fewer deferrals, so the threshold drops
    kw = {"queue_heavy": 8, "arrival_heavy_qpm": 100, "queue_model": "little"}
    busy = solve_cascade(c, light, heavy, 16, 300, slo, **kw)
    assert busy.latency_s <= slo
    assert (calm.b_heavy, busy.b_heavy) == (2, 1)
    assert busy.threshold < calm.threshold
    cands = cascade_candidates(c, light, heavy, 16, 300, slo, **kw)
    assert busy.threshold == pytest.approx(max(x[0] for x in cands))
    # a queue that leaves no room at all
    jammed = solve_cascade(c, light, heavy, 16, 300, slo, queue_heavy=15, arrival_heavy_qpm=100, queue_model="little")
    assert not jammed.feasible


def test_light_load_with_small_queues_is_feasible():
    """Little's law W = L / lambda with the few requests a model gets at low load says the queue
    waits minutes (2 heavy requests at 2 QPM: 60 s) and no split looks feasible. The drain model
    (the backlog served by the plan's workers) finds the plan the cluster can obviously run."""
    p, c, light, heavy = parts("cascade-sdturbo-sdv15")
    slo = p.default_slo_s()
    kw = {"queue_light": 3, "queue_heavy": 2, "arrival_heavy_qpm": 2, "backend": "highs"}
    old = solve_cascade(c, light, heavy, 8, 20, slo, queue_model="little", **kw)
    assert not old.feasible and old.saturated  # the reported symptom
    r = solve_cascade(c, light, heavy, 8, 20, slo, **kw)
    assert r.feasible and not r.saturated
    assert r.threshold == 1.0 and r.x_light + r.x_heavy == 8 and r.x_light >= 1 and r.x_heavy >= 1
    check_plan(r, c, light, heavy, 8, 20, slo)
    # the reported latency is execution plus each backlog drained by the plan's workers
    e1 = light.latency(r.b_light) + c.discriminator_latency_s * r.b_light
    e2 = heavy.latency(r.b_heavy)
    expect = e1 + 3 * e1 / (r.x_light * r.b_light) + e2 + 2 * e2 / (r.x_heavy * r.b_heavy)
    assert r.latency_s == pytest.approx(expect)
    for qm in ("little", "drain"):  # the MILP matches the enumeration under both models
        cands = cascade_candidates(c, light, heavy, 8, 20, slo, queue_light=3, queue_heavy=2, queue_model=qm)
        got = solve_cascade(c, light, heavy, 8, 20, slo, queue_light=3, queue_heavy=2, queue_model=qm)
        assert bool(cands) == got.feasible
        if cands:
            assert got.threshold == pytest.approx(max(x[0] for x in cands))


@pytest.mark.parametrize("name", CASCADES)
def test_no_queue_means_no_wait_and_light_load_never_infeasible(name):
    p, c, light, heavy = parts(name)
    slo = p.default_slo_s()
    for demand in (1, 5, 20):
        for ql, qh in ((0, 0), (1, 0), (0, 1), (3, 2), (8, 8)):
            r = solve_cascade(c, light, heavy, 8, demand, slo, queue_light=ql, queue_heavy=qh, backend="highs")
            if qh:
                assert r.x_heavy >= 1  # a backlog is never stranded, even when nothing is feasible
            if ql + qh > 8:
                continue  # 8 + 8 queued SD-XL requests do not fit a 15 s SLO on 8 workers
            assert r.feasible and not r.saturated, (demand, ql, qh, r.notes)
            check_plan(r, c, light, heavy, 8, demand, slo)


def test_drain_wait_grows_with_the_backlog():
    """A deep heavy backlog must be drained within the SLO: the threshold falls and, past what
    every worker can drain in time, nothing is feasible."""
    p, c, light, heavy = parts("cascade-sdxlltn-sdxl")
    slo = p.default_slo_s()
    ts = []
    for qh in (0, 8, 32, 64):
        r = solve_cascade(c, light, heavy, 16, 300, slo, queue_heavy=qh, backend="highs")
        cands = cascade_candidates(c, light, heavy, 16, 300, slo, queue_heavy=qh)
        assert r.feasible == bool(cands)
        if cands:
            assert r.threshold == pytest.approx(max(x[0] for x in cands))
            check_plan(r, c, light, heavy, 16, 300, slo)
        ts.append(r.threshold if r.feasible else -1.0)
    assert ts == sorted(ts, reverse=True) and ts[0] > ts[-1]
    jammed = solve_cascade(c, light, heavy, 16, 300, slo, queue_heavy=10_000, backend="highs")
    assert not jammed.feasible


def test_saturation_reports_shortfall():
    p, c, light, heavy = parts("cascade-sdturbo-sdv15")
    r = solve_cascade(c, light, heavy, 4, 20000, p.default_slo_s())
    assert r.saturated and r.x_light == 4 and r.x_heavy == 0
    assert r.threshold == 0.0
    assert r.shortfall_qpm == pytest.approx(20000 * 1.05 - r.capacity_light_qpm)
    assert r.shortfall_qpm > 0


def test_a_saturated_plan_prints_as_json(capsys):
    """Regression: a saturated cascade plan carried numpy booleans, and `argusdiff plan --json`
    raised a TypeError instead of printing it."""
    from argusdiff.cli import main

    assert main(["plan", "--profile", "cascade-sdxlltn-sdxl", "--gpus", "2", "--load-qpm", "2000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["saturated"] is True and out["shortfall_qpm"] > 0


def test_latency_bound_that_nothing_meets():
    _p, c, light, heavy = parts("cascade-sdturbo-sdv15")
    r = solve_cascade(c, light, heavy, 16, 100, 0.5)  # below the heavy model's 1.78 s
    assert not r.feasible and r.saturated
    assert any("latency" in n for n in r.notes)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"workers": -1}, "workers"),
        ({"demand_qpm": -5}, "demand_qpm"),
        ({"slo_s": 0}, "slo_s"),
        ({"overprovision": 0.9}, "overprovision"),
        ({"backend": "x"}, "backend"),
        ({"queue_light": -1}, "queue"),
        ({"queue_model": "fifo"}, "queue_model"),
    ],
)
def test_bad_input(kwargs, field):
    _p, c, light, heavy = parts("cascade-sdturbo-sdv15")
    args = {"spec": c, "light": light, "heavy": heavy, "workers": 8, "demand_qpm": 100, "slo_s": 5.0}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=field):
        solve_cascade(**args)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 24), st.floats(0, 3000), st.integers(0, 30), st.integers(0, 30))
def test_random_instances_match_enumeration(workers, demand, ql, qh):
    p, c, light, heavy = parts("cascade-sdxs-sdv15")
    slo = p.default_slo_s()
    r = solve_cascade(c, light, heavy, workers, demand, slo, queue_light=ql, queue_heavy=qh, backend="highs")
    cands = cascade_candidates(c, light, heavy, workers, demand, slo, queue_light=ql, queue_heavy=qh)
    if cands:
        assert not r.saturated
        assert r.threshold == pytest.approx(max(x[0] for x in cands))
    else:
        assert r.saturated


def _runtimes(path):
    """{model: {batch: seconds}} from a DiffServe artifact runtime CSV (feasible rows only)."""
    out: dict[str, dict[int, float]] = {}
    with open(path, newline="", encoding="utf-8-sig") as fh:
        for row in csv.DictReader(fh):
            ms = float(row["avg_runtime"])
            if ms >= 100000:
                continue
            out.setdefault(row["Model"], {})[int(row["batchsize"])] = ms / 1000
    return out


def test_on_the_diffserve_artifact_tables(shared_dir):
    """Build the cascade straight from ../shared/data/diffserve and check the shipped profile and
    the MILP against it."""
    d = shared_dir / "data" / "diffserve"
    with open(d / "f_t_grid.csv", newline="", encoding="utf-8-sig") as fh:
        rows = list(csv.DictReader(fh))
    ts = tuple(float(r["t"]) for r in rows)
    fs = tuple(float(r["f_sdturbo_sdv15"]) for r in rows)
    rt = _runtimes(d / "stable_diffusion_runtimes_sdturbo.csv")
    assert set(rt) >= {"sdturbo", "sdv15"}
    _p, c, light_p, heavy_p = parts("cascade-sdturbo-sdv15")
    assert c.thresholds == pytest.approx(ts) and c.deferral == pytest.approx(fs)
    for b, s in rt["sdv15"].items():
        assert heavy_p.latency(b) == pytest.approx(s)
    spec = CascadeSpec("sdturbo", "sdv15", 0.01, ts, fs)
    light = ApproxLevel("sdturbo", light_p.strategy, "sd-turbo", 1, 0, rt["sdturbo"], 0.85, 5.0)
    heavy = ApproxLevel("sdv15", heavy_p.strategy, "sd-1.5", 50, 0, rt["sdv15"], 1.0, 5.0)
    for workers, demand in ((16, 400), (16, 1000), (16, 2000), (32, 2000)):
        r = solve_cascade(spec, light, heavy, workers, demand, 5.0, backend="highs")
        cands = cascade_candidates(spec, light, heavy, workers, demand, 5.0)
        assert r.threshold == pytest.approx(max(x[0] for x in cands))
        check_plan(r, spec, light, heavy, workers, demand, 5.0)
        assert 0 <= r.deferral <= 1 and math.isfinite(r.latency_s)
