"""ODA → PASM (ARGUS Algorithm 1) properties and the Eq. 2 LP comparison."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from argusdiff.errors import ConfigError
from solver.oda import degradation_matrix, eq2_cost, is_super_linear, oda, oda_flows, solve_eq2


@st.composite
def distributions(draw, min_levels=1, max_levels=8):
    n = draw(st.integers(min_levels, max_levels))

    def dist():
        raw = draw(st.lists(st.one_of(st.just(0.0), st.floats(0.0, 1.0)), min_size=n, max_size=n))
        if sum(raw) <= 0:
            raw[draw(st.integers(0, n - 1))] = 1.0
        s = sum(raw)
        return [x / s for x in raw]

    return dist(), dist()


@settings(max_examples=300, deadline=None)
@given(distributions())
def test_rows_are_distributions_and_map_h_to_f(hf):
    H, F = hf
    P = oda(H, F)
    assert len(P) == len(H)
    for row in P:
        assert all(p >= 0 for p in row)
        assert math.fsum(row) == pytest.approx(1.0)
    applied = np.asarray(H) @ np.asarray(P)
    np.testing.assert_allclose(applied, F, atol=1e-9)


@settings(max_examples=300, deadline=None)
@given(distributions())
def test_never_shifted_faster_while_slower_room_remains(hf):
    """Across every boundary between level j-1 and j, mass crosses in one direction only, and the
    mass moved to faster levels is exactly the room the faster side lacks: max(0, F(>=j) - H(>=j))."""
    H, F = hf
    X = oda_flows(H, F)
    L = len(H)
    for j in range(1, L):
        to_faster = sum(X[i, k] for i in range(j) for k in range(j, L))
        to_slower = sum(X[i, k] for i in range(j, L) for k in range(j))
        room = sum(F[j:]) - sum(H[j:])
        assert to_faster == pytest.approx(max(0.0, room), abs=1e-9)
        assert to_slower == pytest.approx(max(0.0, -room), abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 10).flatmap(lambda n: st.lists(st.floats(0.01, 1.0), min_size=n, max_size=n)))
def test_identity_when_h_equals_f(h):
    P = oda(h, h)
    np.testing.assert_allclose(P, np.eye(len(h)), atol=1e-12)


def test_paper_style_example():
    # 3 levels, best first. Prompts want the fast level, the cluster serves mostly the middle one.
    P = oda([0.2, 0.3, 0.5], [0.2, 0.6, 0.2])
    # fastest: surplus 0.3 moves to the middle (60% of it), middle then holds 0.6 = F
    assert P[2] == pytest.approx((0.0, 0.6, 0.4))
    assert P[1] == pytest.approx((0.0, 1.0, 0.0))
    assert P[0] == pytest.approx((1.0, 0.0, 0.0))
    # deficit at the fastest level is pulled from the nearest slower level first
    P = oda([0.5, 0.5, 0.0], [0.5, 0.25, 0.25])
    assert P[1] == pytest.approx((0.0, 0.5, 0.5))
    assert P[0] == pytest.approx((1.0, 0.0, 0.0))


def test_zero_affinity_rows():
    P = oda([1.0, 0.0, 0.0], [0.5, 0.5, 0.0])
    assert P[1] == (0.0, 1.0, 0.0)  # level serves load: a stray prompt stays
    assert P[2] == (0.0, 1.0, 0.0)  # level serves nothing: nearest slower level that does
    P = oda([0.0, 1.0], [0.0, 1.0])
    assert P[0] == (0.0, 1.0)  # nothing slower serves: nearest faster


def test_counts_are_normalised_and_empty_affinity_is_identity():
    assert oda([2, 2], [1, 1]) == ((1.0, 0.0), (0.0, 1.0))
    assert oda([0, 0], [0.3, 0.7]) == ((1.0, 0.0), (0.0, 1.0))


@pytest.mark.parametrize(
    ("h", "f", "match"),
    [
        ([0.5, 0.5], [1.0], "affinity has 2"),
        ([-1, 2], [1, 1], "affinity"),
        ([1, 1], [0, 0], "share"),
        ([], [], "affinity"),
        ([1, float("nan")], [1, 1], "affinity"),
    ],
)
def test_bad_input(h, f, match):
    with pytest.raises(ConfigError, match=match):
        oda(h, f)


@settings(max_examples=150, deadline=None)
@given(distributions(min_levels=2, max_levels=6), st.sampled_from([1.0, 1.5, 2.0, 3.0]))
def test_oda_reaches_the_eq2_optimum_for_super_linear_degradation(hf, exponent):
    H, F = hf
    D = degradation_matrix(len(H), exponent)
    assert is_super_linear(D)
    lp_cost, lp_pasm = solve_eq2(H, F, D)
    oda_cost = eq2_cost(H, oda(H, F), D)
    # ODA is never worse than the LP optimum ...
    assert oda_cost <= lp_cost * (1 + 1e-6) + 1e-6
    # ... and the LP undercuts ODA only by what its row tolerances (1e-9 slack on F, HiGHS'
    # 1e-7 primal feasibility) let it shave off, each unit of mass costing at most max D
    assert oda_cost >= lp_cost - len(H) * (1e-9 + 1e-7) * float(D.max()) - 1e-9
    np.testing.assert_allclose(np.asarray(H) @ np.asarray(lp_pasm), F, atol=1e-6)


def test_oda_is_suboptimal_for_sub_linear_degradation():
    """Counter-example (docs/solver.md): D(g) = sqrt(g)."""
    H, F = [0.5, 0.5, 0.0], [0.0, 0.5, 0.5]
    D = degradation_matrix(3, 0.5)
    assert not is_super_linear(D)
    oda_cost = eq2_cost(H, oda(H, F), D)
    lp_cost, lp_pasm = solve_eq2(H, F, D)
    assert oda_cost == pytest.approx(1.0)  # two half-masses, one level each
    assert lp_cost == pytest.approx(0.5 * math.sqrt(2))  # one half-mass, two levels
    assert lp_pasm[0] == pytest.approx((0.0, 0.0, 1.0), abs=1e-6)


@settings(max_examples=100, deadline=None)
@given(distributions(min_levels=2, max_levels=6))
def test_oda_never_beats_the_lp_for_sub_linear_degradation(hf):
    H, F = hf
    D = degradation_matrix(len(H), 0.5)
    lp_cost, _ = solve_eq2(H, F, D)
    assert eq2_cost(H, oda(H, F), D) >= lp_cost - 1e-6
