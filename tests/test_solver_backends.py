"""The MILP backends: same answers, statuses instead of raw solver errors."""

from __future__ import annotations

import numpy as np
import pytest

from argusdiff.errors import ConfigError
from solver import backends

BACKS = ["highs"] + (["gurobi"] if backends.gurobi_available() else [])


def knapsack():
    # max 5a + 4b + 3c  s.t. 2a + 3b + c <= 5, 4a + b + 2c <= 11, 3a + 4b + 2c <= 8, integers in [0, 10]
    c = np.array([5.0, 4.0, 3.0])
    A = np.array([[2.0, 3.0, 1.0], [4.0, 1.0, 2.0], [3.0, 4.0, 2.0]])
    return c, A, np.full(3, -np.inf), np.array([5.0, 11.0, 8.0]), np.zeros(3), np.full(3, 10.0)


@pytest.mark.parametrize("backend", BACKS)
def test_integer_and_lp_optimum(backend):
    c, A, lo, hi, clo, chi = knapsack()
    milp = backends.solve_milp(c, A, lo, hi, clo, chi, np.ones(3, dtype=bool), sense="max", backend=backend)
    assert milp.status == "optimal" and milp.backend == backend
    assert milp.objective == pytest.approx(13.0)  # a=2, b=0, c=1
    np.testing.assert_allclose(milp.x, [2, 0, 1], atol=1e-6)
    lp = backends.solve_milp(c, A, lo, hi, clo, chi, np.zeros(3, dtype=bool), sense="max", backend=backend)
    assert lp.objective == pytest.approx(13.0)  # this LP's optimum is integral too
    mn = backends.solve_milp(
        c, A, np.array([1.0, -np.inf, -np.inf]), hi, clo, chi, np.ones(3, dtype=bool), sense="min", backend=backend
    )
    assert mn.objective == pytest.approx(3.0)  # cheapest way to 2a + 3b + c >= 1: c = 1


@pytest.mark.parametrize("backend", BACKS)
def test_infeasible_is_a_status(backend):
    c = np.array([1.0])
    A = np.array([[1.0]])
    res = backends.solve_milp(
        c, A, np.array([5.0]), np.array([np.inf]), np.zeros(1), np.array([2.0]), np.ones(1, dtype=bool), backend=backend
    )
    assert res.status == "infeasible" and not res.ok and res.x is None


def test_unknown_backend():
    with pytest.raises(ConfigError, match="backend"):
        backends.check_backend("cplex")


def test_preload_warms_without_error():
    backends.preload()
    assert backends._state["highs"] is not None


def test_gurobi_requested_but_missing_falls_back(monkeypatch):
    monkeypatch.setitem(backends._state, "gurobi", False)
    monkeypatch.setitem(backends._state, "fallback_logged", False)
    c, A, lo, hi, clo, chi = knapsack()
    res = backends.solve_milp(c, A, lo, hi, clo, chi, np.ones(3, dtype=bool), backend="gurobi")
    assert res.backend == "highs" and res.objective == pytest.approx(13.0)


@pytest.mark.parametrize("backend", BACKS)
def test_a_solve_stopped_by_its_work_limit_keeps_its_best_solution(backend, monkeypatch):
    # the deterministic limits (HiGHS's node limit, Gurobi's work limit) stop a hard MILP with no
    # wall-clock limit at all; the best solution found is kept, as at a time limit
    monkeypatch.setattr(backends, "HIGHS_NODE_LIMIT", 1)
    monkeypatch.setattr(backends, "GUROBI_WORK_LIMIT", 1e-6)
    rng = np.random.default_rng(3)
    n = 60
    w = rng.integers(1000, 5000, (3, n)).astype(float)
    v = rng.integers(1000, 5000, n).astype(float)
    args = (v, w, np.full(3, -np.inf), w.sum(axis=1) / 2 + 0.5, np.zeros(n), np.ones(n), np.ones(n, dtype=bool))
    res = backends.solve_milp(*args, backend=backend, time_limit_s=float("inf"))
    assert res.backend == backend and res.status == "time_limit"
    if res.x is not None:
        assert np.all(w @ res.x <= w.sum(axis=1) / 2 + 0.5 + 1e-6)
