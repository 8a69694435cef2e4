"""The unified plan's search (:mod:`solver.unified`): a branch and bound over worker counts and
cascade threshold intervals on one warm LP (``exact``), and the same model as a MILP with one binary
per threshold (``milp``); both for the value pass and, with the thresholds fixed, the switch pass.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from solver import backends
from solver.bnb import WarmLP
from solver.unified_model import (
    SEC,
    LpMatrices,
    Model,
    Solution,
    build,
    dominated,
    extract,
    fixed_mask,
    positions,
    xdata,
)

EXACT_NODE_LIMIT = 20_000
DEFAULT_GAP = 1e-4  # relative: HiGHS's mip_rel_gap and Gurobi's MIPGap default
COLGEN_START = 4
LP_TIME_LIMIT_S = 5.0  # the value bound's LP (solve_milp's default limit; it takes about a millisecond)
SWITCH_ABS_TOL = 1.0  # switch-cost units (one moved worker): below this, plans are not told apart
#: Gurobi's parameters for the value pass's MILP: no presolve, cuts or heuristics. The models are
#: small (tens of rows, a few hundred columns, a few integers); on the 800-minute diagonal's value
#: MILPs these cut Gurobi's time ~3x, the value found within 1e-8 of the defaults' (which of
#: near-equal plans is found may differ: docs/benchmarks.md). Not for the switch pass, whose faint
#: preference for value among plans of equal switch cost (< 1e-7) the defaults resolve better
GUROBI_PARAMS = {"Presolve": 0, "Cuts": 0, "Heuristics": 0}


class Search:
    """Branch and bound over worker counts and threshold intervals on one warm LP (see module doc).

    Every cascade threshold can have x columns; a node's threshold interval sets the bounds of the
    others to 0, so the node LP is the exact relaxation of the interval (traffic may mix thresholds
    inside it). Columns enter the model when their reduced cost says they improve a node's LP
    (column generation: a cold LP over every threshold takes hundreds of simplex iterations).
    A node whose LP uses one threshold per cascade and integral counts is a plan.
    ``mode="value"`` maximises the value (pass 1); ``mode="switch"`` minimises the switch cost with
    the thresholds ``fixed`` and the value at least ``threshold`` (pass 2). Nodes are explored
    depth first until a plan is found, then best bound first; a node is pruned when its bound is
    within ``gap`` (relative) of the best plan.
    """

    def __init__(
        self,
        m: Model,
        *,
        mode: str = "value",
        fixed: Sequence[int] | None = None,
        cost: np.ndarray | None = None,
        sizes: Sequence[int] | None = None,
        threshold: float | None = None,
        node_limit: int = EXACT_NODE_LIMIT,
        gap: float = 1e-4,
        time_limit_s: float = math.inf,
    ) -> None:
        self.m = m
        self.node_limit = node_limit
        self.gap = gap
        self.time_limit_s = time_limit_s
        self.open_bound = -math.inf  # after a stop at a limit: the best bound left unexplored
        # the switch pass stops once no open node can save a whole move (1 unit of switch cost)
        self.abs_tol = SWITCH_ABS_TOL if mode == "switch" and gap > 0 else 0.0
        self.nodes = 0
        self.G = len(m.groups)
        self.M = len(m.pools)
        self.Z = len(m.Z)
        off, gk_g, gk_k, Kt = positions(m)
        self.U, self.Vx, self.xcost = xdata(m, gk_g, gk_k)
        if mode == "switch":  # the cost build gives x columns in the switch pass
            self.xcost = (1e-7 / max(m.vscale * max(float(m.d.sum()), 1.0), 1e-12)) * self.Vx
        self.root = [(k, k) for k in fixed] if fixed is not None else [(0, grp.V - 1) for grp in m.groups]
        mask = np.zeros((self.Z, Kt), dtype=bool)
        for g in range(self.G):
            lo, hi = self.root[g]
            start = np.arange(lo, hi + 1, max(1, (hi - lo + 1) // COLGEN_START)) if hi > lo else np.array([lo])
            mask[:, off[g] + start] = True
            mask[:, off[g] + hi] = True
        direct = [g for g in range(self.G) if m.groups[g].V == 1]
        mask[:, off[direct]] &= ~dominated(m, direct)
        lp = build(m, mask=mask, mode=mode, cost=cost, sizes=sizes, threshold=threshold)
        self.lay = lp.layout
        self.lp = WarmLP(lp.c, lp.A, lp.row_lo, lp.row_hi, lp.col_lo, lp.col_hi, sense="max")
        self.pricing = mode == "value"
        self._set_root()

    # -- model updates ----------------------------------------------------------------------------
    def _add(self, zz: np.ndarray, jj: np.ndarray) -> None:
        """Add the x columns of (z, position) pairs to the model."""
        lay = self.lay
        n = len(zz)
        if n == 0:
            return
        u = self.U[zz, jj, :]  # n x M
        rows = np.concatenate([zz[:, None], lay.pool_row0 + np.broadcast_to(np.arange(self.M), u.shape)], axis=1)
        vals = np.concatenate([np.ones((n, 1)), u], axis=1)
        if lay.value_row >= 0:  # the switch pass's value row
            rows = np.concatenate([rows, np.full((n, 1), lay.value_row)], axis=1)
            vals = np.concatenate([vals, self.Vx[zz, jj][:, None]], axis=1)
        keep = vals != 0
        per = keep.sum(axis=1)
        starts = np.concatenate([[0], np.cumsum(per)[:-1]])
        self.lp.add_cols(self.xcost[zz, jj], np.zeros(n), np.full(n, np.inf), starts, rows[keep], vals[keep])
        lay.xmap[zz, jj] = lay.n_cols + np.arange(n)
        lay.n_cols += n

    def _set_root(self) -> None:
        """Every group at its root interval: what :meth:`_set_interval` does group by group (the
        same columns added in the same order, the same bounds), with one bounds call."""
        lay = self.lay
        inside = np.zeros(lay.Kt, dtype=bool)
        for g, (lo, hi) in enumerate(self.root):
            o = int(lay.off[g])
            if self.m.groups[g].V > 1:
                missing = np.flatnonzero(lay.xmap[:, o + lo] < 0)
                self._add(missing, np.full(len(missing), o + lo))
            inside[o + lo : o + hi + 1] = True
        have = lay.xmap >= 0
        ub = np.where(np.broadcast_to(inside, have.shape)[have], np.inf, 0.0)
        self.lp.set_col_bounds(lay.xmap[have], np.zeros(len(ub)), ub)
        self.state: list[tuple[int, int]] = list(self.root)

    def _set_interval(self, g: int, iv: tuple[int, int]) -> None:
        if self.state[g] == iv:
            return
        lay = self.lay
        lo, hi = iv
        o = int(lay.off[g])
        V = self.m.groups[g].V
        if V > 1:
            # the interval's first threshold defers least: with its columns present, whatever is
            # feasible on the interval is feasible on the model (usage is non-decreasing in t)
            missing = np.flatnonzero(lay.xmap[:, o + lo] < 0)
            self._add(missing, np.full(len(missing), o + lo))
        cols = lay.xmap[:, o : o + V]
        have = cols >= 0
        inside = np.zeros(V, dtype=bool)
        inside[lo : hi + 1] = True
        ub = np.where(np.broadcast_to(inside, cols.shape), np.inf, 0.0)[have]
        self.lp.set_col_bounds(cols[have], np.zeros(len(ub)), ub)
        self.state[g] = iv

    def _set_counts(self, nlo: np.ndarray, nhi: np.ndarray) -> None:
        self.lp.set_col_bounds(range(self.M), nlo, nhi)

    def _solve(self):
        """The node LP, with the columns of thresholds whose reduced cost improves it priced in."""
        lay = self.lay
        while True:
            res = self.lp.solve(duals=self.pricing)
            if not res.ok or not self.pricing:
                return res
            y = res.row_dual
            price = y[lay.pool_row0 : lay.pool_row0 + self.M]
            grew = False
            for g in range(self.G):
                lo, hi = self.state[g]
                if hi == lo:
                    continue
                o = int(lay.off[g])
                sl = slice(o + lo, o + hi + 1)
                rc = self.xcost[:, sl] - y[: self.Z, None] - self.U[:, sl, :] @ price
                enter = (lay.xmap[:, sl] < 0) & (rc > 1e-9 * self.m.vscale)
                if enter.any():
                    zz, jj = np.nonzero(enter)
                    self._add(zz, jj + o + lo)
                    grew = True
            if not grew:
                return res

    def _tol(self) -> float:
        if self.best_val == -math.inf:
            return 0.0
        return max(self.gap * max(1.0, abs(self.best_val)), self.abs_tol)

    def _used(self, F: np.ndarray, g: int) -> np.ndarray:
        """Per variant of group g, the traffic the LP sends to it."""
        o = int(self.lay.off[g])
        return F[:, o : o + self.m.groups[g].V].sum(axis=0)

    # -- the search -------------------------------------------------------------------------------
    def run(self, incumbent: Solution | None = None) -> tuple[Solution | None, str]:
        """(best solution, status): status "optimal", "node_limit" or "infeasible".

        Node order: depth first until a plan is found (a dive), then best bound first."""
        m = self.m
        self.best = incumbent
        self.best_val = incumbent.value if incumbent is not None else -math.inf
        G = self.G
        flow_tol = 1e-9 * max(1.0, float(m.d.sum()))
        t_end = time.perf_counter() + self.time_limit_s
        stack: list[tuple] = [(math.inf, 0, tuple(self.root), np.zeros(self.M), np.full(self.M, float(m.W)))]
        heap: list[tuple] = []
        seq = 0
        rounded: set[tuple] = set()

        def push(bound: float, depth: int, node: tuple) -> None:
            nonlocal seq
            seq += 1
            if self.best is None:
                stack.append((bound, depth, *node))
            else:
                heapq.heappush(heap, (-bound, -depth, seq, (bound, depth, *node)))

        while stack or heap:
            if self.best is not None and stack:  # the dive found a plan: best bound first from now on
                for item in stack:
                    seq += 1
                    heapq.heappush(heap, (-item[0], -item[1], seq, item))
                stack.clear()
            parent, depth, ivs, nlo, nhi = stack.pop() if stack else heapq.heappop(heap)[3]
            if parent <= self.best_val + self._tol():
                continue
            self.nodes += 1
            stop = "node_limit" if self.nodes > self.node_limit else None
            if stop is None and time.perf_counter() > t_end:
                stop = "time_limit"
            if stop is not None:
                left = [parent] + [item[0] for item in stack] + [item[3][0] for item in heap]
                self.open_bound = max(left)
                return self.best, stop
            for g in range(G):
                self._set_interval(g, ivs[g])
            self._set_counts(nlo, nhi)
            res = self._solve()
            if not res.ok or res.objective <= self.best_val + self._tol():
                continue
            bound = res.objective
            x = res.x
            n = x[: self.M]
            F = self.lay.flows(x)
            split = self._mixed(ivs, F, flow_tol)
            frac = np.abs(n - np.round(n))
            if split is not None or frac.max() > 1e-6:
                key = (ivs, tuple(nlo), tuple(nhi))
                if key not in rounded:
                    rounded.add(key)
                    self._round(ivs, n, nlo, nhi, F, res.row_dual)
                    if bound <= self.best_val + self._tol():
                        continue
                if split is not None:
                    children = self._split(ivs, split, F, nlo, nhi)
                else:
                    children = self._branch(ivs, n, frac, nlo, nhi)
                for child in reversed(children):  # the first child is explored first
                    push(bound, depth + 1, child)
                continue
            self._accept(ivs, x, F, bound)
        if self.best is None:
            return None, "infeasible"
        return self.best, "optimal"

    def _mixed(self, ivs, F: np.ndarray, flow_tol: float) -> tuple[int, int, int] | None:
        """The cascade whose traffic mixes thresholds farthest apart, with the first and the last
        threshold it uses: (group, first, last); None when every cascade uses one."""
        split = None
        for g in range(self.G):
            lo, hi = ivs[g]
            if hi > lo:
                used = np.flatnonzero(self._used(F, g) > flow_tol)
                if len(used) > 1 and (split is None or used[-1] - used[0] > split[2] - split[1]):
                    split = (g, int(used[0]), int(used[-1]))
        return split

    def _split(self, ivs, split: tuple[int, int, int], F: np.ndarray, nlo: np.ndarray, nhi: np.ndarray):
        """Two child nodes: the cascade's interval split halfway between the first and the last
        threshold carrying traffic; the side carrying more first."""
        g, a, b = split
        lo, hi = ivs[g]
        mid = a + (b - a) // 2
        u = self._used(F, g)
        heavier_left = u[lo : mid + 1].sum() >= u[mid + 1 : hi + 1].sum()
        left = tuple(iv if j != g else (lo, mid) for j, iv in enumerate(ivs))
        right = tuple(iv if j != g else (mid + 1, hi) for j, iv in enumerate(ivs))
        first, second = (left, right) if heavier_left else (right, left)
        return (first, nlo, nhi), (second, nlo, nhi)

    def _branch(self, ivs, n: np.ndarray, frac: np.ndarray, nlo: np.ndarray, nhi: np.ndarray):
        """Two child nodes on the fractional pool with the fewest workers (rounding it changes its
        capacity most; on near-identical pools, e.g. SD-1.5 and SD-1.4, the most fractional count
        makes the search walk every way of splitting workers between them); the nearer side first."""
        fr = np.flatnonzero(frac > 1e-6)
        j = int(fr[np.argmin(n[fr])])
        fl, ce = math.floor(n[j]), math.ceil(n[j])
        down_hi = nhi.copy()
        down_hi[j] = fl
        up_lo = nlo.copy()
        up_lo[j] = ce
        down = (ivs, nlo, down_hi)
        up = (ivs, up_lo, nhi)
        return (down, up) if n[j] - fl >= 0.5 else (up, down)

    def _choice(self, ivs, F: np.ndarray) -> list[int]:
        """Per group the threshold its traffic uses most (the interval's first when unused)."""
        out = []
        for g in range(self.G):
            lo, hi = ivs[g]
            u = self._used(F, g)[lo : hi + 1]
            out.append(lo + int(np.argmax(u)) if u.sum() > 0 else lo)
        return out

    def _accept(self, ivs, x: np.ndarray, F: np.ndarray, value: float) -> None:
        if value <= self.best_val + self._tol():
            return
        self.best = extract(self.m, self.lay, x, self._choice(ivs, F), value)
        self.best_val = value

    def _round(self, ivs, n: np.ndarray, nlo: np.ndarray, nhi: np.ndarray, F: np.ndarray, duals=None) -> None:
        """Rounding heuristic: thresholds at the one each cascade's traffic uses most, counts floored
        and the spare workers to the pools whose capacity is worth most (the LP's prices; else the
        largest fractions); one LP with all of that fixed."""
        m = self.m
        fl = np.clip(np.floor(n + 1e-9), nlo, nhi)
        spare = m.W - int(fl.sum())
        r = fl.copy()
        if duals is not None:
            price = np.abs(duals[self.lay.pool_row0 : self.lay.pool_row0 + self.M])
            order = np.lexsort((-(n - fl), -price))
        else:
            order = np.argsort(-(n - fl))
        for j in order:
            if spare <= 0:
                break
            if n[j] - fl[j] > 1e-9 and r[j] + 1 <= nhi[j]:
                r[j] += 1
                spare -= 1
        got = self.evaluate(r, self._choice(ivs, F))
        if got is not None and got.value > self.best_val + self._tol():
            self.best, self.best_val = got, got.value

    def evaluate(self, n: np.ndarray, ks: Sequence[int]) -> Solution | None:
        """The LP with counts and thresholds fixed."""
        for g in range(self.G):
            self._set_interval(g, (ks[g], ks[g]))
        self._set_counts(np.asarray(n, dtype=float), np.asarray(n, dtype=float))
        res = self.lp.solve()
        if not res.ok:
            return None
        return extract(self.m, self.lay, res.x, ks, res.objective)


@dataclass(frozen=True)
class SolveOptions:
    """How :func:`solver.unified.plan_unified` solves: the formulation, the MILP backend, and the
    limits of each search and MILP."""

    formulation: str = "exact"
    backend: str = "auto"
    switch_tolerance: float = 0.005
    time_limit_s: float = 5.0
    node_limit: int = EXACT_NODE_LIMIT
    gap: float = DEFAULT_GAP


@dataclass(frozen=True)
class ValueSolve:
    """The value pass: its solution (None when every solver failed), who found it ("exact",
    "exact-incumbent", a MILP backend, or "fallback" when none did) and the search nodes spent."""

    solution: Solution | None
    backend: str
    nodes: int


def solve_value(m: Model, opts: SolveOptions, notes: list[str]) -> ValueSolve:
    """Pass 1: the plan of the most value, by the chosen formulation, the other answering when it
    fails; the solution polished with its counts and thresholds fixed exactly (no flow rides on a
    solver's integrality tolerance, e.g. 6e-7 workers carrying a sliver of load)."""
    limit, tl = opts.node_limit, opts.time_limit_s
    search: Search | None = None
    nodes = 0
    if opts.formulation == "exact":
        search = Search(m, node_limit=limit, gap=opts.gap, time_limit_s=tl)
        sol, status = search.run()
        nodes = search.nodes
        used = opts.formulation
        if status in ("node_limit", "time_limit"):
            what = f"node limit ({limit})" if status == "node_limit" else f"time limit ({tl:g} s)"
            if sol is not None:
                within = (search.open_bound - sol.value) / max(1e-12, abs(sol.value))
                notes.append(f"exact search stopped at its {what}: best plan within {100 * within:.3g}% of the bound")
                used = "exact-incumbent"
            else:
                notes.append(f"exact search stopped at its {what} without a plan; answered by the MILP")
                sol, be, st = milp_value(m, opts.backend, tl)
                used = be
                if sol is None:
                    notes.append(f"{be} returned {st}; using the maximum-throughput plan")
                    used = "fallback"
    else:
        sol, used, st = milp_value(m, opts.backend, tl)
        if sol is None:
            notes.append(f"{used} returned {st}; answered by the exact search")
            search = Search(m, node_limit=limit, gap=opts.gap, time_limit_s=tl)
            sol, status = search.run()
            nodes = search.nodes
            used = ("exact" if status == "optimal" else "exact-incumbent") if sol is not None else "fallback"
    if sol is not None and used != "fallback":
        polish = search if used in ("exact", "exact-incumbent") and search is not None else Search(m, fixed=sol.k)
        sol = polish.evaluate(sol.n, sol.k) or sol
    return ValueSolve(sol, used, nodes)


# --- MILP formulation ----------------------------------------------------------------------------


def milp_value(m: Model, backend: str, time_limit_s: float) -> tuple[Solution | None, str, str]:
    """The model with one binary per cascade threshold. Returns (solution, backend, status)."""
    lp = build(m, binaries=True)
    lay = lp.layout
    res = _solve(lp, backend, time_limit_s, GUROBI_PARAMS)
    if not res.ok:
        return None, res.backend, f"{res.status} ({res.message})"
    x = res.x
    ks = [0] * len(m.groups)
    y = lay.iy
    for g, grp in enumerate(m.groups):
        if grp.V > 1:
            ks[g] = int(np.argmax(x[y : y + grp.V]))
            y += grp.V
    return extract(m, lay, x, ks, float(res.objective)), res.backend, res.status


def best_path_bound(m: Model) -> float:
    """An upper bound of every plan's value of ``m`` with no capacity at all: every request on its
    best path (:func:`dual_bound` at a price of 0 for work)."""
    return float(m.d @ np.maximum(m.val.reshape(len(m.Z), -1).max(axis=1, initial=0.0), 0.0))


def tolerance_floor(value: float, tolerance: float) -> float:
    """The least value within ``tolerance`` (relative) of ``value``, with room for the LP's
    rounding: the switch pass's threshold and the running plan's test."""
    return value - max(tolerance * abs(value), 1e-7 * abs(value) + 1e-9)


def plan_value(m: Model, flows: np.ndarray, ks: Sequence[int]) -> float:
    """Σ v·x of ``flows`` at the variants ``ks``, in the order of a sum over z, then g (the products
    at once, added in that order)."""
    terms = m.val[:, np.arange(len(m.groups)), np.asarray(ks, dtype=np.int64)] * flows
    return float(sum(terms.ravel().tolist()))


def value_bound(m: Model) -> float | None:
    """An upper bound of the value (Σ v·x, no tie-breaks) of every plan of ``m``: the value MILP's
    LP relaxation (worker counts continuous, and traffic free to mix a cascade's thresholds, which
    is what the MILP's threshold binaries allow once relaxed). None when the LP fails."""
    lp = build(m, mode="bound")
    res = _solve(replace(lp, integrality=np.zeros(len(lp.c), dtype=bool)), "highs", LP_TIME_LIMIT_S)
    return float(res.objective) if res.status == "optimal" and res.objective is not None else None


def dual_bound(m: Model, points: int = 33) -> float:
    """An upper bound of every plan's value of ``m`` without an LP, never below :func:`value_bound`:
    with worker counts continuous the pools' rows and the workers' row add up to one (the work of
    every flow <= 60 s x W), and for any price λ >= 0 of that work, Σ_z d_z max(0, max_j v_zj - λ
    u_zj) + λ 60 W bounds the value (weak duality of that one row; in overload, where a class may
    be served in part, each class's term is at least 0). Minimised over a grid of prices, then a
    finer grid around the best one; λ = 0 is every request on its best path."""
    Zn = len(m.Z)
    work = m.use.sum(axis=2).reshape(Zn, -1)
    ok = np.isfinite(work)
    work = np.where(ok, work, 0.0)
    vals = np.where(ok, m.val.reshape(Zn, -1), -np.inf)
    cap = SEC * m.W
    ratio = np.where(ok & (work > 0), np.maximum(vals, 0.0) / np.where(work > 0, work, 1.0), 0.0)
    top = float(ratio.max(initial=0.0))

    served_all = m.part_lo is None  # every request is routed: no clamp at 0 (a tighter bound)

    def bounds(lams: np.ndarray) -> np.ndarray:
        best = (vals[None] - lams[:, None, None] * work[None]).max(axis=2)  # K x Z
        return (best if served_all else np.maximum(best, 0.0)) @ m.d + lams * cap

    if top <= 0:
        return float(bounds(np.zeros(1))[0])
    lams = np.concatenate([[0.0], top * np.exp2(-np.linspace(0.0, 16.0, points))[::-1]])
    got = bounds(lams)
    i = int(np.argmin(got))
    lo, hi = lams[max(i - 1, 0)], lams[min(i + 1, len(lams) - 1)]
    fine = np.linspace(lo, hi, points)
    return float(min(got[i], bounds(fine).min()))


def milp_switch(
    m: Model, ks: Sequence[int], cost: np.ndarray, sizes: Sequence[int], threshold: float, backend: str, tl: float
) -> tuple[Solution | None, str]:
    """Pass 2 as a MILP (thresholds fixed): min switch cost s.t. value >= threshold, every worker placed."""
    lp = build(m, mask=fixed_mask(m, ks), mode="switch", cost=cost, sizes=sizes, threshold=threshold)
    lay = lp.layout
    res = _solve(lp, backend, tl)
    if not res.ok:
        return None, res.backend
    return extract(m, lay, res.x, ks, float(res.objective)), res.backend


def _solve(lp: LpMatrices, backend: str, time_limit_s: float, gurobi_params=None):
    return backends.solve_milp(
        lp.c,
        lp.A,
        lp.row_lo,
        lp.row_hi,
        lp.col_lo,
        lp.col_hi,
        lp.integrality,
        sense="max",
        backend=backend,
        time_limit_s=time_limit_s,
        gurobi_params=gurobi_params,
    )
