"""The ``exact`` allocation: branch and bound over the aggregated worker counts.

The aggregated problem (ARGUS Eq. 1 with one integer count per level)::

    maximize  sum_v q_v * l_v
    s.t.      sum_v l_v = D,   0 <= l_v <= n_v * P_v,   sum_v n_v = W,   n_v integer >= 0

has a structure a general MILP solver does not know about:

* For fixed counts the best loads are a greedy fill: serve as much as possible at the
  best-quality level, then the next, ... . So a plan is just its count vector.
* Its LP relaxation (continuous counts) is a two-constraint LP whose value is the upper concave
  hull of the points (1/P_v, q_v) evaluated at W/D (workers per unit of load). Each suffix of the
  quality order gets its hull once; a bound is a scan of at most L breakpoints.
* The bound as a function of one level's count is concave, so each branching level only visits
  counts outward from the relaxed optimum until the bound falls below the incumbent.

The search is exact (it proves optimality by the bound), needs no model build and runs in
about a millisecond to ~15 ms for 12 levels and up to 10,000 workers (scripts/bench_solver.py).

Switch costs (:func:`solver.model.switch_cost`) are applied by :mod:`solver.allocate` with a second, small
aggregated MILP (a few dozen columns whatever the cluster size): a branch and bound over counts
near the current ones has to walk ranges of counts that grow with the cluster, which was
measured at seconds for 256+ workers, while the MILP stays at milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from solver.model import EPS, LevelData


class _Hull:
    """Upper concave majorant of points (a = 1/P, q) for the LP bound of a set of levels."""

    __slots__ = ("a", "idx", "q")

    def __init__(self, levels: Sequence[int], data: LevelData):
        pts = sorted(((1.0 / data.peak[v], data.quality[v], v) for v in levels), key=lambda t: (t[0], -t[1]))
        hull: list[tuple[float, float, int]] = []
        for p in pts:
            if hull and p[1] <= hull[-1][1] + EPS:
                continue  # needs more workers for no more quality: never on the majorant
            while len(hull) >= 2:
                (a1, q1, _), (a2, q2, _) = hull[-2], hull[-1]
                # drop the middle point when it lies on or below the chord
                if (q2 - q1) * (p[0] - a1) <= (p[1] - q1) * (a2 - a1) + EPS:
                    hull.pop()
                else:
                    break
            hull.append(p)
        self.a = [h[0] for h in hull]
        self.q = [h[1] for h in hull]
        self.idx = [h[2] for h in hull]

    def value(self, workers: float, demand: float) -> float:
        """LP optimum of sum q*l over these levels with ``workers`` workers and ``demand`` load."""
        if demand <= EPS:
            return 0.0
        a, q = self.a, self.q
        if not a:
            return -math.inf
        r = workers / demand
        if r < a[0] - EPS:
            return -math.inf
        if r >= a[-1]:
            return q[-1] * demand
        for k in range(1, len(a)):
            if r <= a[k]:
                w = (r - a[k - 1]) / (a[k] - a[k - 1])
                return (q[k - 1] + w * (q[k] - q[k - 1])) * demand
        return q[-1] * demand  # pragma: no cover

    def workers_at(self, level: int, workers: float, demand: float) -> float:
        """Workers the LP optimum puts on ``level`` (fractional)."""
        if demand <= EPS or level not in self.idx:
            return 0.0
        a = self.a
        r = workers / demand
        pos = self.idx.index(level)
        if r >= a[-1]:
            return demand * a[-1] if pos == len(a) - 1 else 0.0
        for k in range(1, len(a)):
            if r <= a[k]:
                w = (r - a[k - 1]) / (a[k] - a[k - 1])
                if pos == k:
                    return w * demand * a[k]
                if pos == k - 1:
                    return (1 - w) * demand * a[k - 1]
                return 0.0
        return 0.0  # pragma: no cover


class NodeLimit(Exception):
    pass


class ExactSolver:
    """Branch and bound on the aggregated counts for one (levels, workers, demand) instance."""

    def __init__(self, data: LevelData, workers: int, demand: float, *, node_limit: int = 2_000_000):
        self.data = data
        self.W = workers
        self.D = demand
        self.order = sorted(range(len(data)), key=lambda v: (-data.quality[v], -data.peak[v]))
        self.hulls = [_Hull(self.order[k:], data) for k in range(len(self.order))]
        self.node_limit = node_limit
        self.nodes = 0

    # -- optimal pass --------------------------------------------------------------------------
    def solve(self) -> tuple[list[int], float] | None:
        """The optimal count vector and its value, or None when the demand cannot be met."""
        if self.hulls[0].value(self.W, self.D) == -math.inf:
            return None
        self.best_value = -math.inf
        self.best: list[int] | None = None
        self._counts = [0] * len(self.data)
        self._dfs(0, self.W, self.D, 0.0)
        if self.best is None:  # pragma: no cover - the LP says feasible, so a leaf exists
            return None
        return list(self.best), self.best_value

    def _leaf(self, value: float) -> None:
        if value > self.best_value + EPS * max(1.0, abs(value)):
            self.best_value = value
            self.best = list(self._counts)

    def _dfs(self, k: int, w_rem: int, d_rem: float, value: float) -> None:
        self.nodes += 1
        if self.nodes > self.node_limit:
            raise NodeLimit
        data, order = self.data, self.order
        v = order[k]
        P, q = data.peak[v], data.quality[v]
        last = k == len(order) - 1
        need = 0 if d_rem <= EPS else math.ceil(d_rem / P - EPS)
        if need <= w_rem:
            # cover the remaining demand here; spare workers stay on this (better) level
            self._counts[v] = w_rem
            self._leaf(value + q * max(d_rem, 0.0))
            self._counts[v] = 0
        if last:
            return
        hull = self.hulls[k + 1]
        hi = min(need - 1, w_rem)
        if hi < 0:
            return

        def bound(n: int) -> float:
            return value + q * n * P + hull.value(w_rem - n, d_rem - n * P)

        frac = self.hulls[k].workers_at(v, w_rem, d_rem)
        start = min(max(math.floor(frac), 0), hi)
        tol = EPS * max(1.0, abs(self.best_value)) if self.best_value > -math.inf else 0.0
        # concave bound: walk outward from the relaxed optimum in both directions
        for direction, first in ((1, start + 1), (-1, start)):
            n = first
            while 0 <= n <= hi:
                if bound(n) <= self.best_value + tol:
                    break  # concave bound (and an interval of feasible n): nothing better further out
                self._counts[v] = n
                self._dfs(k + 1, w_rem - n, d_rem - n * P, value + q * n * P)
                self._counts[v] = 0
                n += direction
