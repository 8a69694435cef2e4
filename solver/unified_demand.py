"""Planned demand for the unified plan (:mod:`solver.unified`): all of it when it fits on the
cheapest paths; in overload, the volume each tier serves, maximised in priority order (its demand,
then its headroom) with integer pools, or cut by one share across classes when that MILP fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from solver import backends
from solver.paths import UnifiedProblem
from solver.unified_model import SEC, Group, base_demand, fits


@dataclass(frozen=True)
class PlannedDemand:
    """What the plan is asked to serve."""

    planned: np.ndarray  # T x C demand, headroom included (an upper bound when ``part_lo`` is set)
    part_lo: np.ndarray | None  # T x 2: per tier the least demand and headroom to serve; None: all fits
    served: np.ndarray  # T x C: the QPM the maximum-throughput plan serves
    shortfall_by_tier: np.ndarray  # T: demand (QPM, before headroom) left unplanned


def planned_demand(
    problem: UnifiedProblem,
    groups: list[Group],
    pidx: dict[str, int],
    var: Sequence[int],
    unit: np.ndarray,
    W: int,
    notes: list[str],
    backend: str = "auto",
    time_limit_s: float = 5.0,
) -> PlannedDemand:
    """The demand to plan (see :class:`PlannedDemand`). When every class fits on its cheapest path,
    all of it is planned. Otherwise the served volume is maximised tier by tier, each tier's demand
    before its headroom, with integer pools (:func:`_max_volume`); the value solve then chooses
    which classes those are. If that MILP fails, each part is cut by one share across classes until
    the cheapest paths fit (noted)."""
    base = base_demand(problem)
    head = base * (np.array([t.headroom for t in problem.tiers])[:, None] - 1.0)
    T = len(problem.tiers)
    if fits(base + head, unit, W):
        return PlannedDemand(base + head, None, base + head, np.zeros(T))
    got = _max_volume(base, head, groups, pidx, var, W, backend, time_limit_s, notes)
    if got is None:
        notes.append("the served-volume MILP failed: demand cut by one share across classes")
        raw, extra = _cut_uniform(base, head, unit, W)
    else:
        raw, extra = got
    tol = 1e-9 * max(1.0, problem.demand_qpm)
    # a hair inside the boundary: LP round-off never needs W + 1 workers
    part_lo = np.stack([raw.sum(axis=1), extra.sum(axis=1)], axis=1) * (1.0 - 1e-6)
    part_lo[part_lo < tol] = 0.0
    served = (raw + extra) * (1.0 - 1e-6)
    short = (base - raw).sum(axis=1)
    short[short < tol * 100] = 0.0
    name = [tier.name for tier in problem.tiers]
    if short.sum() > 0:
        cut = [f"{name[t]} {short[t]:.1f}" for t in range(T) if short[t] > 0]
        notes.append(
            f"saturated: demand {problem.demand_qpm:.1f} QPM exceeds what {W} workers serve on the fastest paths; "
            f"shortfall by tier (QPM): {', '.join(cut)}"
        )
    elif (head - extra).sum() > tol * 100:
        notes.append(f"headroom cannot be met in full on {W} workers: cut from the lowest-priority tier up")
    if got is None:  # the uniform cut serves exactly this: plan it as the demand
        return PlannedDemand(served, None, served, short)
    return PlannedDemand(base + head, part_lo, served, short)


def _max_volume(
    base: np.ndarray,
    head: np.ndarray,
    groups: list[Group],
    pidx: dict[str, int],
    var: Sequence[int],
    W: int,
    backend: str,
    time_limit_s: float,
    notes: list[str],
) -> tuple[np.ndarray, np.ndarray] | None:
    """Served demand (raw, headroom; T x C) maximised lexicographically: tier 1's demand, tier 1's
    headroom, tier 2's demand, ... on integer pools, each cascade at its least-usage threshold.
    One small MILP per part, each fixing the parts before it. None when a MILP fails."""
    from scipy import sparse

    T, C = base.shape
    lp = _VolumeLp.of(base, head, groups, pidx, var, W)
    Z, ir, ih, n_cols = lp.Z, lp.ir, lp.ih, lp.n_cols
    ri, ci, vv, lo, hi, col_lo, col_hi, integ = lp.ri, lp.ci, lp.vv, lp.lo, lp.hi, lp.col_lo, lp.col_hi, lp.integ
    r = lp.r
    x = None
    for t in range(T):
        for first in (ir, ih):
            members = [z for z, (tz, _c) in enumerate(Z) if tz == t]
            full = float(sum(col_hi[first + z] for z in members))
            if full <= 0:
                continue
            c = np.zeros(n_cols)
            c[[first + z for z in members]] = 1.0
            A = sparse.csr_matrix((vv, (ri, ci)), shape=(r, n_cols))
            res = backends.solve_milp(
                c,
                A,
                np.array(lo),
                np.array(hi),
                col_lo,
                col_hi,
                integ,
                sense="max",
                backend=backend,
                time_limit_s=time_limit_s,
            )
            if not res.ok:
                if x is None:
                    return None
                # the parts before keep their maximum; the rest what the last solve served
                notes.append(
                    f"served-volume MILP: {res.backend} returned {res.status} at tier {t}; kept the tiers before"
                )
                break
            x = res.x
            got = float(res.objective)
            for z in members:  # fix this part at its maximum for the parts after it
                ri.append(r), ci.append(first + z), vv.append(1.0)
            lo.append(min(got, full) * (1.0 - 1e-7) - 1e-7), hi.append(np.inf)
            r += 1
        else:
            continue
        break
    raw = np.zeros((T, C))
    extra = np.zeros((T, C))
    if x is not None:
        for z, (t, c) in enumerate(Z):
            raw[t, c] = min(base[t, c], max(0.0, x[ir + z]))
            extra[t, c] = min(head[t, c], max(0.0, x[ih + z]))
    return raw, extra


def _cut_uniform(base: np.ndarray, head: np.ndarray, unit: np.ndarray, W: int) -> tuple[np.ndarray, np.ndarray]:
    """Each part (last tier's headroom, then its demand, then the tier before, ...) cut by one share
    across its classes until the per-class cheapest paths fit: a valid, not always maximal, cut."""
    raw, extra = base.copy(), head.copy()
    T = base.shape[0]
    for t in reversed(range(T)):
        for arr in (extra, raw):
            keep = arr[t].copy()
            arr[t] = 0.0
            if keep.sum() <= 0 or not fits(raw + extra, unit, W):
                continue
            lo, hi = 0.0, 1.0  # the largest share of this part that still fits
            for _ in range(50):
                mid = 0.5 * (lo + hi)
                arr[t] = keep * mid
                if fits(raw + extra, unit, W):
                    lo = mid
                else:
                    hi = mid
            arr[t] = keep * lo
            return raw, extra
    return raw, extra


@dataclass
class _VolumeLp:
    """The served-volume MILP of :func:`_max_volume` as sparse triplets: columns n (M), x[z, g]
    (z x G), served demand r_z, served headroom h_z; rows: demand split, pool capacity, workers."""

    Z: list[tuple[int, int]]
    ir: int
    ih: int
    n_cols: int
    ri: list[int]
    ci: list[int]
    vv: list[float]
    lo: list[float]
    hi: list[float]
    r: int
    col_lo: np.ndarray
    col_hi: np.ndarray
    integ: np.ndarray

    @classmethod
    def of(
        cls,
        base: np.ndarray,
        head: np.ndarray,
        groups: list[Group],
        pidx: dict[str, int],
        var: Sequence[int],
        W: int,
    ) -> _VolumeLp:
        T, C = base.shape
        Z = [(t, c) for t in range(T) for c in range(C) if base[t, c] > 0]
        nZ, G, M = len(Z), len(groups), len(pidx)
        U = np.zeros((nZ, G, M))
        for g, grp in enumerate(groups):
            for pool, u in grp.use:
                for z, (_t, c) in enumerate(Z):
                    U[z, g, pidx[pool]] += u[c, var[g]]
        ix, ir, ih = M, M + nZ * G, M + nZ * G + nZ
        n_cols = ih + nZ
        ri: list[int] = []
        ci: list[int] = []
        vv: list[float] = []
        lo: list[float] = []
        hi: list[float] = []
        r = 0
        for z in range(nZ):  # Σ_g x[z, g] = r_z + h_z
            for g in range(G):
                ri.append(r), ci.append(ix + z * G + g), vv.append(1.0)
            ri += [r, r]
            ci += [ir + z, ih + z]
            vv += [-1.0, -1.0]
            lo.append(0.0), hi.append(0.0)
            r += 1
        for mm in range(M):
            for z in range(nZ):
                for g in range(G):
                    if U[z, g, mm] != 0:
                        ri.append(r), ci.append(ix + z * G + g), vv.append(float(U[z, g, mm]))
            ri.append(r), ci.append(mm), vv.append(-SEC)
            lo.append(-np.inf), hi.append(0.0)
            r += 1
        for mm in range(M):
            ri.append(r), ci.append(mm), vv.append(1.0)
        lo.append(-np.inf), hi.append(float(W))
        r += 1
        col_lo = np.zeros(n_cols)
        col_hi = np.full(n_cols, np.inf)
        col_hi[:M] = float(W)
        col_hi[ir : ir + nZ] = [base[t, c] for t, c in Z]
        col_hi[ih : ih + nZ] = [head[t, c] for t, c in Z]
        integ = np.zeros(n_cols, dtype=bool)
        integ[:M] = True
        return cls(Z, ir, ih, n_cols, ri, ci, vv, lo, hi, r, col_lo, col_hi, integ)
