"""The unified plan: approximate caching, smaller models and light→heavy cascades in one allocation,
per SLO tier (docs/solver.md, "Unified plan").

Inputs are plain (:mod:`solver.paths`). With z = (tier τ, class c) a demand class, g a serving path
(its variants k: the cascade thresholds on the profiled grid; one variant otherwise) and m a worker
pool (a model)::

    maximise   Σ_{z,g} v_g(z, k_g) · x[z,g]
    s.t.       Σ_g x[z,g] = d_z                               (every planned request is routed)
               Σ_{z,g} u_{g,m}(c_z, k_g) · x[z,g] ≤ 60 n_m    (worker-seconds per minute, per pool)
               Σ_m n_m ≤ W,   n_m ∈ Z≥0,   k_g one point of g's grid,   x ≥ 0

* d_z is the demand of class c in tier τ times the tier's headroom (so ρ ≤ 1/headroom and a queue
  drains); when even the cheapest paths cannot carry it, the pre-pass cuts planned demand in
  reverse priority: the last tier's headroom, then its demand (a shortfall: the plan is
  saturated), then the previous tier's headroom and demand, ... So capacity, headroom included,
  is reserved for the first (interactive) tier ahead of the others.
* u_{g,m}(c, k): seconds of a pool-m worker per request: an AC level with K > 0 uses h·s_K + (1-h)·s_0
  (a miss runs at K = 0); a cascade uses s_light on the light pool and f_c(t_k)·s_heavy on the heavy
  pool.
* v_g(z, k): the tier's weight times the expected in-SLO value of one request: each outcome (hit /
  miss, kept / deferred) with its probability counts (goodput_weight + quality) when its latency
  meets the tier's deadline and 0 otherwise.
* The LP's objective adds tie-breaks to v (:meth:`_Model.cost`), the first of them
  ``TIE_BREAK`` × the path's quality averaged over classes: per-class quality ties between levels
  (ARGUS's class model: a prompt keeps full quality at any level at least as good as its optimal
  one), so with capacity to spare the plan would be indifferent between SD-XL and a light model
  for a class whose optimal level is light; the tie-break sends such traffic to the level that is
  better for the average prompt (the class prediction is wrong for some prompts). The reported
  objective is Σ v·x without tie-breaks.

Two formulations reach the same optimum (tests/test_unified.py):

* ``milp``: the model above with one binary per cascade threshold (x of a variant only when its
  binary is set), solved by :func:`solver.backends.solve_milp` (HiGHS, or gurobipy when licensed).
* ``exact``: a branch and bound on the worker counts and the threshold *intervals*, each node an LP
  kept warm in HiGHS (:class:`solver.bnb.WarmLP`). A node with a threshold interval [k_lo, k_hi]
  prices the cascade at its optimistic corner (the smallest usage and the best value in the
  interval), a valid relaxation that becomes exact as intervals shrink to one threshold. No model
  is rebuilt between nodes; this is the fast path.

Switch costs (with a current assignment): among plans within ``switch_tolerance`` of the best value,
the one that moves the fewest workers weighted by model load time: moving a worker costs 1, plus
the load time of its new model unless that model is already resident in its GPU memory. Solved as
a second pass (the same search, minimising a transport cost from groups of workers with the same
current pool and resident set to pools) with the thresholds of the first pass.

Every failure path returns a valid plan: a search that hits its node limit is answered by the
MILP, a failed MILP by the search's incumbent, and without either by the maximum-throughput plan
(each noted).
"""

from __future__ import annotations

import functools
import heapq
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from argusdiff.domain import Plan, Strategy
from argusdiff.errors import ConfigError
from solver.backends import check_backend, solve_milp
from solver.bnb import WarmLP
from solver.paths import ServingPath, UnifiedProblem

__all__ = ["FORMULATIONS", "UnifiedPlan", "plan_unified", "restrict"]

FORMULATIONS = ("exact", "milp")
EPS = 1e-9
SEC = 60.0  # worker-seconds per minute of one worker
NOMINAL_QPM = 1.0  # demand planned for when none is predicted (routes each class to its best path)
NEGLIGIBLE_QPM = 1e-3  # below this (one request in ~17 hours) no demand is predicted
EXACT_NODE_LIMIT = 20_000
DEFAULT_GAP = 1e-4  # relative: HiGHS's mip_rel_gap and Gurobi's MIPGap default
COLGEN_START = 4
#: weight (× the largest value of one request) of the tie-break toward the path that is better for
#: the average prompt: 10× the solvers' relative gap (DEFAULT_GAP), so a solve respects it, and far
#: below the quality steps between a profile's levels (>= 0.01), so it decides only between ties
TIE_BREAK = 1e-3
SWITCH_ABS_TOL = 1.0  # switch-cost units (one moved worker): below this, plans are not told apart


# --- the result ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class UnifiedPlan:
    """One solved unified plan. ``routing[(tier, class)]`` maps path ids to QPM."""

    levels: tuple[str, ...]
    classes: tuple[str, ...]
    tiers: tuple[str, ...]
    paths: tuple[str, ...]
    path_strategy: Mapping[str, Strategy]
    counts: Mapping[str, int]  # pool -> workers
    assignment: Mapping[str, str | None]  # worker -> pool
    level_assignment: Mapping[str, str | None]  # worker -> level id (pool workers split by load)
    routing: Mapping[tuple[str, str], Mapping[str, float]]
    thresholds: Mapping[str, float]  # cascade path id (its light level) -> t
    deferral: Mapping[str, float]  # cascade path id -> share of its traffic deferred
    batch_sizes: Mapping[str, int]
    loads: Mapping[str, float]  # pool -> worker-seconds per minute
    level_loads: Mapping[str, float]  # level -> worker-seconds per minute
    demand_qpm: float
    planned_qpm: Mapping[str, float]  # tier -> QPM planned (headroom included)
    shortfall_qpm: float
    saturated: bool
    shortfall_by_tier: Mapping[str, float]  # tier -> demand (QPM, before headroom) left unplanned
    objective: float  # Σ v·x per minute (tier-weighted in-SLO value)
    expected_quality: float  # mean quality of the planned requests (in SLO or not)
    goodput: Mapping[str, float]  # tier -> expected share of its planned requests in SLO
    switch_cost: float = 0.0
    moved_workers: int = 0
    solve_s: float = 0.0
    backend: str = "exact"
    formulation: str = "exact"
    nodes: int = 0
    headroom: float = 1.0
    notes: tuple[str, ...] = ()

    @property
    def strategy(self) -> Strategy:
        """AC when every routed path is AC, CASCADE when every one is a cascade, else SM."""
        used = {self.path_strategy[p] for r in self.routing.values() for p, q in r.items() if q > EPS}
        if not used:
            used = set(self.path_strategy.values())
        if used == {Strategy.AC}:
            return Strategy.AC
        if used == {Strategy.CASCADE}:
            return Strategy.CASCADE
        return Strategy.SM

    def pasm(self, tier: str | None = None) -> tuple[tuple[float, ...], ...]:
        """P(first-stage level | class) over :attr:`levels` (rows and columns): the flows of every
        tier (or of one ``tier``) divided by the class's planned demand. Rows of levels that are not
        classes, or with no planned demand, follow the plan's overall mix."""
        L = len(self.levels)
        idx = {lv: i for i, lv in enumerate(self.levels)}
        tiers = self.tiers if tier is None else (tier,)
        rows = np.zeros((L, L))
        for (t, c), r in self.routing.items():
            if t not in tiers:
                continue
            for p, qpm in r.items():
                rows[idx[c], idx[p]] += qpm
        total = rows.sum(axis=0)
        mix = total / total.sum() if total.sum() > EPS else None
        out = []
        for i in range(L):
            s = rows[i].sum()
            if s > EPS:
                out.append(tuple(float(v) for v in rows[i] / s))
            elif mix is not None:
                out.append(tuple(float(v) for v in mix))
            else:
                out.append(tuple(1.0 if j == i else 0.0 for j in range(L)))
        return tuple(out)

    def share(self) -> tuple[float, ...]:
        """F: the share of the planned demand each level serves first (H·PASM = F)."""
        idx = {lv: i for i, lv in enumerate(self.levels)}
        F = np.zeros(len(self.levels))
        for r in self.routing.values():
            for p, qpm in r.items():
                F[idx[p]] += qpm
        s = F.sum()
        if s <= EPS:
            return tuple(1.0 / len(F) for _ in F)
        return tuple(float(v) for v in F / s)

    def to_plan(self, *, version: int = 0, created_s: float = 0.0, policy: str = "") -> Plan:
        """The plan as today's :class:`argusdiff.domain.Plan`: levels, worker→level assignment,
        F, the PASM over all tiers, thresholds keyed by light level, batch sizes."""
        plan = Plan(
            version=version,
            created_s=created_s,
            strategy=self.strategy,
            levels=self.levels,
            assignment=dict(self.level_assignment),
            share=self.share(),
            pasm=self.pasm(),
            predicted_qpm=self.demand_qpm,
            expected_quality=self.expected_quality,
            saturated=self.saturated,
            shortfall_qpm=self.shortfall_qpm,
            moved_workers=self.moved_workers,
            thresholds=dict(self.thresholds),
            batch_sizes=dict(self.batch_sizes),
            margin=self.headroom,
            policy=policy,
            notes=self.notes,
        )
        plan.validate()
        return plan


# --- compiled paths ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Group:
    """One path with its surviving variants, as arrays over classes (C) and variants (V)."""

    path: ServingPath
    variants: tuple[int, ...]  # indices into the path's threshold grid ([0] for a direct path)
    use: tuple[tuple[str, np.ndarray], ...]  # (pool id, seconds per request, C x V)
    val: np.ndarray  # T x C x V: tier weight x expected in-SLO (goodput_weight + quality)
    good: np.ndarray  # T x C x V: probability of meeting the tier's deadline
    qual: np.ndarray  # C x V: expected quality
    level_use: tuple[tuple[str, np.ndarray], ...]  # (level id, seconds per request, C x V)
    defer: np.ndarray  # C x V: share deferred to the heavy stage (0 for direct paths)

    @property
    def V(self) -> int:
        return len(self.variants)

    def total_use(self) -> np.ndarray:
        return sum(u for _, u in self.use)


def _rows(table: tuple[tuple[float, ...], ...], C: int, K: int, default: np.ndarray | None = None) -> np.ndarray:
    if not table:
        assert default is not None
        return np.repeat(np.asarray(default, dtype=np.float64)[:, None], K, axis=1)
    arr = np.asarray(table, dtype=np.float64)
    return np.repeat(arr, C, axis=0) if arr.shape[0] == 1 else arr


@functools.lru_cache(maxsize=512)
def _compile_group(
    path: ServingPath, tiers: tuple[tuple[float, float], ...], G: float, C: int, heavy_direct: bool = False
) -> _Group:
    """Usage, value and quality of every variant of ``path``; dominated variants dropped. With
    ``heavy_direct`` (the cascade's heavy level is also a direct path), a threshold that defers
    every request is dropped too: the direct heavy path serves the same images with less work and
    less latency, a domination across groups the per-group test cannot see (and that tie-breaks
    below the solvers' gap would not settle). Cached: the path data and tiers repeat from one
    control period to the next."""
    st = path.stage
    qs = np.asarray(st.quality, dtype=np.float64)
    dl = np.array([d for d, _ in tiers])[:, None, None]  # T x 1 x 1
    wt = np.array([w for _, w in tiers])[:, None, None]
    outcomes: list[tuple[np.ndarray, float, np.ndarray]] = []  # (prob C x V, latency, quality C x V)
    use: dict[str, np.ndarray] = {}
    level_use: dict[str, np.ndarray] = {}

    def add(d: dict[str, np.ndarray], key: str, arr: np.ndarray) -> None:
        d[key] = d[key] + arr if key in d else arr

    if path.heavy is not None:
        K = len(path.thresholds)
        f = _rows(path.deferral, C, K)
        acc = _rows(path.accepted, C, K, default=qs)
        hv = path.heavy
        ones = np.ones((C, K))
        add(use, st.pool, st.service_s * ones)
        add(use, hv.pool, f * hv.service_s)
        add(level_use, st.level, st.service_s * ones)
        add(level_use, hv.level, f * hv.service_s)
        outcomes.append((1.0 - f, st.latency_s, acc))
        qh = np.repeat(np.asarray(hv.quality, dtype=np.float64)[:, None], K, axis=1)
        outcomes.append((f, st.latency_s + hv.latency_s, qh))
        defer = f
    else:
        K = 1
        h = path.hit_rate if path.miss is not None else 1.0
        one = np.ones((C, 1))
        add(use, st.pool, h * st.service_s * one)
        add(level_use, st.level, h * st.service_s * one)
        outcomes.append((h * one, st.latency_s, qs[:, None]))
        if path.miss is not None and h < 1.0:
            ms = path.miss
            add(use, ms.pool, (1.0 - h) * ms.service_s * one)
            # a miss runs on the worker that took the request: its load stays with the path's level
            add(level_use, st.level, (1.0 - h) * ms.service_s * one)
            outcomes.append(((1.0 - h) * one, ms.latency_s, np.asarray(ms.quality, dtype=np.float64)[:, None]))
        defer = np.zeros((C, 1))
    T = len(tiers)
    val = np.zeros((T, C, K))
    good = np.zeros((T, C, K))
    qual = np.zeros((C, K))
    for prob, lat, q in outcomes:
        ok = (lat <= dl + 1e-9).astype(np.float64)  # T x 1 x 1
        good += ok * prob[None]
        val += wt * ok * (prob * (G + q))[None]
        qual += prob * q
    keep = _undominated(use, val) if K > 1 else np.array([0])
    if heavy_direct:
        partial = keep[np.any(defer[:, keep] < 1.0 - EPS, axis=0)]
        keep = partial if partial.size else keep
    sel = lambda a: a[..., keep]  # noqa: E731
    return _Group(
        path=path,
        variants=tuple(int(k) for k in keep),
        use=tuple((p, sel(u)) for p, u in use.items()),
        val=sel(val),
        good=sel(good),
        qual=sel(qual),
        level_use=tuple((lv, sel(u)) for lv, u in level_use.items()),
        defer=sel(defer),
    )


def _undominated(use: Mapping[str, np.ndarray], val: np.ndarray) -> np.ndarray:
    """Variants no other variant dominates (no more usage on any pool and class, no less value in
    any tier and class; of identical variants the first). A dominated threshold is never needed."""
    U = np.concatenate([u for u in use.values()], axis=0)  # rows x K
    Vv = val.reshape(-1, val.shape[-1])
    K = U.shape[1]
    tol = 1e-12
    # le[a, b]: variant a uses no more than b everywhere; ge[a, b]: a is worth no less than b
    le = np.all(U[:, :, None] <= U[:, None, :] + tol, axis=0)
    ge = np.all(Vv[:, :, None] >= Vv[:, None, :] - tol, axis=0)
    dom = le & ge
    same = dom & dom.T
    # a dominates b: a is no worse everywhere, and strictly better somewhere or earlier among equals
    earlier = np.arange(K)[:, None] < np.arange(K)[None, :]
    beats = dom & (~same | earlier)
    np.fill_diagonal(beats, False)
    return np.flatnonzero(~beats.any(axis=0))


# --- the solve -----------------------------------------------------------------------------------


@dataclass
class _Model:
    """One problem compiled to arrays: groups, pools, demand classes."""

    problem: UnifiedProblem
    groups: list[_Group]
    pools: list[str]
    pidx: dict[str, int]
    Z: list[tuple[int, int]]  # (tier index, class index) with planned demand > 0
    d: np.ndarray  # planned QPM per z (an upper bound when ``part_lo`` is set)
    W: int
    # overload: per z its demand and headroom caps, and per tier the least demand and headroom the
    # plan must serve (T x 2, from _max_volume); None when all of d is served
    raw: np.ndarray | None = None
    head: np.ndarray | None = None
    part_lo: np.ndarray | None = None
    fallback: np.ndarray | None = None  # per z the QPM the maximum-throughput plan serves
    use: np.ndarray = field(init=False)  # Z x G x M x Vmax usage (padded)
    val: np.ndarray = field(init=False)  # Z x G x Vmax
    qual: np.ndarray = field(init=False)
    prior: np.ndarray = field(init=False)  # Z x G x Vmax: the variant's quality averaged over classes

    def __post_init__(self) -> None:
        Z, G, M = len(self.Z), len(self.groups), len(self.pools)
        Vm = max(g.V for g in self.groups)
        self.use = np.zeros((Z, G, M, Vm))
        self.val = np.zeros((Z, G, Vm))
        self.qual = np.zeros((Z, G, Vm))
        self.prior = np.zeros((Z, G, Vm))
        ti = np.array([t for t, _ in self.Z], dtype=np.int64)
        ci = np.array([c for _, c in self.Z], dtype=np.int64)
        for gi, g in enumerate(self.groups):
            for pool, u in g.use:
                self.use[:, gi, self.pidx[pool], : g.V] = u[ci]
            self.val[:, gi, : g.V] = g.val[ti, ci]
            self.qual[:, gi, : g.V] = g.qual[ci]
            self.prior[:, gi, : g.V] = g.qual.mean(axis=0)[None, :]
            if Vm > g.V:  # padding never chosen
                self.use[:, gi, :, g.V :] = np.inf
        vs = float(np.max(np.abs(self.val))) if self.val.size else 1.0
        self.vscale = max(vs, 1e-12)
        finite = self.use[np.isfinite(self.use)]
        self.uscale = max(float(finite.max()) if finite.size else 1.0, 1e-12)

    def cost(self, vals: np.ndarray, qual: np.ndarray, prior: np.ndarray, use_total: np.ndarray) -> np.ndarray:
        """LP cost of x[z, g]: its value plus tie-breaks below any value difference (prefer the path
        better for the average prompt, then higher quality for the class, then less work)."""
        return vals + self.vscale * (TIE_BREAK * prior + 1e-7 * qual - 1e-8 * use_total / self.uscale)


def _compile(problem: UnifiedProblem) -> tuple[list[_Group], list[str], dict[str, int]]:
    C = len(problem.classes)
    tiers = tuple((t.deadline_s, t.weight) for t in problem.tiers)
    direct = {p.stage.level for p in problem.paths if not p.is_cascade and p.miss is None}
    groups = [
        _compile_group(p, tiers, float(problem.goodput_weight), C, p.is_cascade and p.heavy.level in direct)
        for p in problem.paths
    ]
    pools = [p.id for p in problem.pools]
    return groups, pools, {p: i for i, p in enumerate(pools)}


def _base_demand(problem: UnifiedProblem) -> np.ndarray:
    """T x C demand (QPM) before headroom."""
    H = np.asarray(problem.affinity, dtype=np.float64)
    H = H / H.sum() if H.sum() > 0 else np.full(len(H), 1.0 / len(H))
    S = np.array([t.share for t in problem.tiers], dtype=np.float64)
    S = S / S.sum()
    return problem.demand_qpm * S[:, None] * H[None, :]


def _cheapest(groups: list[_Group], pidx: dict[str, int], dC: np.ndarray) -> tuple[list[int], np.ndarray]:
    """Per group its least-usage variant (for its demand-weighted classes); per class the pool usage
    vector (M) of its cheapest option among those. Returns (variant per group, C x M usage)."""
    M = len(pidx)
    C = len(dC)
    best_tot = np.full(C, np.inf)
    best_use = np.zeros((C, M))
    var = []
    w = dC if dC.sum() > 0 else np.ones(C)
    for g in groups:
        tot = g.total_use()  # C x V
        k = int(np.argmin(w @ tot)) if g.V > 1 else 0
        var.append(k)
        better = tot[:, k] < best_tot - 1e-15
        if better.any():
            best_tot[better] = tot[better, k]
            vec = np.zeros((C, M))
            for pool, u in g.use:
                vec[:, pidx[pool]] += u[:, k]
            best_use[better] = vec[better]
    return var, best_use


def _need(load: np.ndarray) -> np.ndarray:
    """Workers each pool needs for its load (worker-seconds per minute), with a tolerance for LP
    round-off."""
    return np.ceil(load / SEC - 1e-6 * np.maximum(1.0, load / SEC)).astype(np.int64)


def _fits(d: np.ndarray, unit: np.ndarray, W: int) -> bool:
    """Whether demand d (T x C) on the per-class cheapest options fits W integer workers."""
    load = d.sum(axis=0) @ unit  # M
    return int(_need(load).sum()) <= W


def _planned_demand(
    problem: UnifiedProblem,
    groups: list[_Group],
    pidx: dict[str, int],
    var: Sequence[int],
    unit: np.ndarray,
    W: int,
    notes: list[str],
    backend: str = "auto",
    time_limit_s: float = 5.0,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    """(demand per tier and class (T x C, headroom included), the per-tier least demand and
    headroom to serve (T x 2, None when all of it fits), the QPM the maximum-throughput plan serves
    (T x C), the shortfall per tier (QPM)).

    When every class fits on its cheapest path, all of it is planned. Otherwise the served volume
    is maximised tier by tier, each tier's demand before its headroom, with integer pools
    (:func:`_max_volume`); the value solve then chooses which classes those are. If that MILP
    fails, each part is cut by one share across classes until the cheapest paths fit (noted)."""
    base = _base_demand(problem)
    head = base * (np.array([t.headroom for t in problem.tiers])[:, None] - 1.0)
    T = len(problem.tiers)
    if _fits(base + head, unit, W):
        return base + head, None, base + head, np.zeros(T)
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
        return served, None, served, short
    return base + head, part_lo, served, short


def _max_volume(
    base: np.ndarray,
    head: np.ndarray,
    groups: list[_Group],
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
            res = solve_milp(
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
            if keep.sum() <= 0 or not _fits(raw + extra, unit, W):
                continue
            lo, hi = 0.0, 1.0  # the largest share of this part that still fits
            for _ in range(50):
                mid = 0.5 * (lo + hi)
                arr[t] = keep * mid
                if _fits(raw + extra, unit, W):
                    lo = mid
                else:
                    hi = mid
            arr[t] = keep * lo
            return raw, extra
    return raw, extra


@dataclass
class _Solution:
    n: np.ndarray  # M ints
    k: list[int]  # variant position per group
    x: np.ndarray  # Z x G: flow on each group's chosen variant
    value: float  # LP objective (with tie-breaks)
    t: np.ndarray | None = None  # switch pass: workers of each group sent to each pool


@dataclass
class _Layout:
    """Column and row positions of the matrices :func:`_build` makes. x columns exist for the
    (z, group, variant) triples of a mask; ``xmap`` gives each one's column (-1: not in the model)."""

    M: int
    Z: int
    Kt: int  # Σ_g V_g positions (group, variant)
    off: np.ndarray  # first position of each group
    gk_g: np.ndarray  # group of each position
    gk_k: np.ndarray  # variant of each position
    xmap: np.ndarray  # Z x Kt column index or -1
    n_cols: int = 0
    ir: int = -1  # first served-demand column, then the served-headroom ones (overload)
    iy: int = -1  # first threshold binary (MILP)
    it: int = -1  # first transport column (switch)
    n_h: int = 0  # worker groups (switch)
    pool_row0: int = 0
    value_row: int = -1

    def flows(self, x: np.ndarray) -> np.ndarray:
        """Z x Kt flows of a solution vector."""
        F = np.zeros(self.xmap.shape)
        have = self.xmap >= 0
        F[have] = x[self.xmap[have]]
        return F


def _positions(m: _Model) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    Vs = np.array([g.V for g in m.groups])
    off = np.concatenate([[0], np.cumsum(Vs)[:-1]]).astype(np.int64)
    gk_g = np.repeat(np.arange(len(Vs)), Vs)
    gk_k = np.concatenate([np.arange(v) for v in Vs])
    return off, gk_g, gk_k, int(Vs.sum())


def _xdata(m: _Model, gk_g: np.ndarray, gk_k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Usage (Z x Kt x M), value (Z x Kt) and LP cost (Z x Kt) of every (z, group, variant)."""
    U = np.transpose(m.use[:, gk_g, :, gk_k], (1, 0, 2))
    Vx = m.val[:, gk_g, gk_k]
    cost = m.cost(Vx, m.qual[:, gk_g, gk_k], m.prior[:, gk_g, gk_k], U.sum(axis=2))
    return U, Vx, cost


def _build(
    m: _Model,
    *,
    mask: np.ndarray | None = None,
    mode: str = "value",
    binaries: bool = False,
    cost: np.ndarray | None = None,
    sizes: Sequence[int] | None = None,
    threshold: float | None = None,
):
    """The model's matrices. Columns: n (M), then x for the (z, position) pairs of ``mask`` (all
    by default). ``mode="value"``: maximise Σ v·x (with ``binaries``, one binary per cascade
    threshold: the MILP). ``mode="switch"``: maximise minus the switch cost of moving worker groups
    (``cost``: groups x pools, ``sizes``) subject to Σ v·x >= ``threshold`` and every worker placed.
    Returns (c, A, row_lo, row_hi, col_lo, col_hi, integrality, layout)."""
    from scipy import sparse

    Z, G, M = len(m.Z), len(m.groups), len(m.pools)
    off, gk_g, gk_k, Kt = _positions(m)
    U, Vx, xc = _xdata(m, gk_g, gk_k)
    if mask is None:
        mask = np.ones((Z, Kt), dtype=bool)
    zz, jj = np.nonzero(mask)
    nx = len(zz)
    xmap = np.full((Z, Kt), -1, dtype=np.int64)
    xmap[zz, jj] = M + np.arange(nx)
    lay = _Layout(M=M, Z=Z, Kt=Kt, off=off, gk_g=gk_g, gk_k=gk_k, xmap=xmap)
    Vs = [g.V for g in m.groups]
    casc = [g for g in range(G) if Vs[g] > 1]
    over = m.part_lo is not None
    n_rh = 2 * Z if over else 0
    n_y = int(sum(Vs[g] for g in casc)) if binaries else 0
    n_h = 0 if cost is None else cost.shape[0]
    lay.ir = M + nx
    lay.iy = M + nx + n_rh
    lay.it = lay.iy + n_y
    lay.n_h = n_h
    n_cols = lay.it + n_h * M
    lay.n_cols = n_cols
    xcols = M + np.arange(nx)
    ri: list[np.ndarray] = [zz]  # demand rows
    ci: list[np.ndarray] = [xcols]
    vv: list[np.ndarray] = [np.ones(nx)]
    if over:  # Σ x[z] = r_z + h_z: the demand and headroom the plan serves
        ri += [np.arange(Z), np.arange(Z)]
        ci += [lay.ir + np.arange(Z), lay.ir + Z + np.arange(Z)]
        vv += [-np.ones(Z), -np.ones(Z)]
        lo: list[float] = [0.0] * Z
        hi: list[float] = [0.0] * Z
    else:
        lo = [float(v) for v in m.d]
        hi = [float(v) for v in m.d]
    r = Z
    lay.pool_row0 = r
    for mm in range(M):
        u = U[zz, jj, mm]
        nz = u != 0
        ri.append(np.full(int(nz.sum()) + 1, r + mm))
        ci.append(np.concatenate([xcols[nz], [mm]]))
        vv.append(np.concatenate([u[nz], [-SEC]]))
        lo.append(-np.inf)
        hi.append(0.0)
    r += M
    ri.append(np.full(M, r))  # workers
    ci.append(np.arange(M))
    vv.append(np.ones(M))
    lo.append(float(m.W) if mode == "switch" else -np.inf)
    hi.append(float(m.W))
    r += 1
    if over:  # each tier serves at least what the served-volume stages found
        tier = np.array([t for t, _c in m.Z])
        for t in range(m.part_lo.shape[0]):
            members = np.flatnonzero(tier == t)
            for part in (0, 1):
                ri.append(np.full(len(members), r))
                ci.append(lay.ir + part * Z + members)
                vv.append(np.ones(len(members)))
                lo.append(float(m.part_lo[t, part]))
                hi.append(np.inf)
                r += 1
    c = np.zeros(n_cols)
    if mode == "value":
        c[:M] = -1e-9 * m.vscale  # the fewest workers the loads need (spare ones are placed after)
        c[xcols] = xc[zz, jj]
    if binaries:
        big = float(m.d.sum())
        yc = lay.iy
        for g in casc:
            ri.append(np.full(Vs[g], r))
            ci.append(yc + np.arange(Vs[g]))
            vv.append(np.ones(Vs[g]))
            lo.append(1.0)
            hi.append(1.0)
            r += 1
            for k in range(Vs[g]):  # Σ_z x[z, g, k] <= (Σ d) y[g, k]
                col = xmap[:, off[g] + k]
                col = col[col >= 0]
                ri.append(np.full(len(col) + 1, r))
                ci.append(np.concatenate([col, [yc + k]]))
                vv.append(np.concatenate([np.ones(len(col)), [-big]]))
                lo.append(-np.inf)
                hi.append(0.0)
                r += 1
            yc += Vs[g]
    if mode == "switch":
        assert cost is not None and sizes is not None and threshold is not None
        lay.value_row = r
        ri.append(np.full(nx, r))
        ci.append(xcols)
        vv.append(Vx[zz, jj])
        lo.append(float(threshold))
        hi.append(np.inf)
        r += 1
        for h in range(n_h):  # each group of workers goes somewhere
            ri.append(np.full(M, r))
            ci.append(lay.it + h * M + np.arange(M))
            vv.append(np.ones(M))
            lo.append(float(sizes[h]))
            hi.append(float(sizes[h]))
            r += 1
        for mm in range(M):  # Σ_h t[h, m] = n_m
            ri.append(np.full(n_h + 1, r))
            ci.append(np.concatenate([lay.it + np.arange(n_h) * M + mm, [mm]]))
            vv.append(np.concatenate([np.ones(n_h), [-1.0]]))
            lo.append(0.0)
            hi.append(0.0)
            r += 1
        c[lay.it :] = -cost.ravel()
        # a faint preference for value among plans of equal cost
        c[xcols] = (1e-7 / max(m.vscale * max(float(m.d.sum()), 1.0), 1e-12)) * Vx[zz, jj]
    A = sparse.csc_matrix((np.concatenate(vv), (np.concatenate(ri), np.concatenate(ci))), shape=(r, n_cols))
    col_lo = np.zeros(n_cols)
    col_hi = np.full(n_cols, np.inf)
    col_hi[:M] = float(m.W)
    if over:
        col_hi[lay.ir : lay.ir + Z] = m.raw
        col_hi[lay.ir + Z : lay.ir + 2 * Z] = m.head
    col_hi[lay.iy : lay.iy + n_y] = 1.0
    integ = np.zeros(n_cols, dtype=bool)
    integ[:M] = True
    integ[lay.iy : lay.iy + n_y] = True
    return c, A, np.array(lo), np.array(hi), col_lo, col_hi, integ, lay


def _dominated(m: _Model, direct: Sequence[int]) -> np.ndarray:
    """Z x len(direct): direct paths another direct path beats for that class on the same pool: no
    more usage, no less value, quality and quality for the average prompt (the tie-break; of equals,
    the later one). Such a column is never
    needed: swapping its flow to the other frees capacity and loses nothing."""
    Z = len(m.Z)
    out = np.zeros((Z, len(direct)), dtype=bool)
    pools = [tuple(np.flatnonzero(m.use[0, g, :, 0] > 0)) for g in direct]
    for i, gi in enumerate(direct):
        for j, gj in enumerate(direct):
            if i == j or pools[i] != pools[j]:
                continue
            no_more = np.all(m.use[:, gj, :, 0] <= m.use[:, gi, :, 0] + 1e-12, axis=1)
            no_less = (
                (m.val[:, gj, 0] >= m.val[:, gi, 0] - 1e-12)
                & (m.qual[:, gj, 0] >= m.qual[:, gi, 0] - 1e-12)
                & (m.prior[:, gj, 0] >= m.prior[:, gi, 0] - 1e-12)
            )
            same = (
                np.all(np.abs(m.use[:, gj, :, 0] - m.use[:, gi, :, 0]) <= 1e-12, axis=1)
                & (np.abs(m.val[:, gj, 0] - m.val[:, gi, 0]) <= 1e-12)
                & (np.abs(m.qual[:, gj, 0] - m.qual[:, gi, 0]) <= 1e-12)
                & (np.abs(m.prior[:, gj, 0] - m.prior[:, gi, 0]) <= 1e-12)
            )
            out[:, i] |= no_more & no_less & (~same | (j < i))
    return out


def _extract(m: _Model, lay: _Layout, x: np.ndarray, ks: Sequence[int], value: float) -> _Solution:
    F = lay.flows(x)
    flows = np.stack([F[:, int(lay.off[g]) + ks[g]] for g in range(len(m.groups))], axis=1)
    t = np.round(x[lay.it : lay.it + lay.n_h * lay.M]).reshape(-1, lay.M).astype(np.int64) if lay.n_h else None
    return _Solution(np.round(x[: lay.M]).astype(np.int64), list(ks), flows, value, t)


class _Search:
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
        m: _Model,
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
        off, gk_g, gk_k, Kt = _positions(m)
        self.U, self.Vx, self.xcost = _xdata(m, gk_g, gk_k)
        if mode == "switch":  # the cost _build gives x columns in the switch pass
            self.xcost = (1e-7 / max(m.vscale * max(float(m.d.sum()), 1.0), 1e-12)) * self.Vx
        self.root = [(k, k) for k in fixed] if fixed is not None else [(0, grp.V - 1) for grp in m.groups]
        mask = np.zeros((self.Z, Kt), dtype=bool)
        for g in range(self.G):
            lo, hi = self.root[g]
            start = np.arange(lo, hi + 1, max(1, (hi - lo + 1) // COLGEN_START)) if hi > lo else np.array([lo])
            mask[:, off[g] + start] = True
            mask[:, off[g] + hi] = True
        direct = [g for g in range(self.G) if m.groups[g].V == 1]
        mask[:, off[direct]] &= ~_dominated(m, direct)
        c, A, lo_, hi_, col_lo, col_hi, _integ, lay = _build(
            m, mask=mask, mode=mode, cost=cost, sizes=sizes, threshold=threshold
        )
        self.lay = lay
        self.lp = WarmLP(c, A, lo_, hi_, col_lo, col_hi, sense="max")
        self.state: list[tuple[int, int]] = [(0, grp.V - 1) for grp in m.groups]
        self.pricing = mode == "value"
        for g in range(self.G):
            self._set_interval(g, self.root[g], force=True)

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

    def _set_interval(self, g: int, iv: tuple[int, int], *, force: bool = False) -> None:
        if self.state[g] == iv and not force:
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
    def run(self, incumbent: _Solution | None = None) -> tuple[_Solution | None, str]:
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
            # a cascade whose traffic mixes thresholds: split its interval between them
            split = None
            for g in range(G):
                lo, hi = ivs[g]
                if hi > lo:
                    used = np.flatnonzero(self._used(F, g) > flow_tol)
                    if len(used) > 1 and (split is None or used[-1] - used[0] > split[2] - split[1]):
                        split = (g, int(used[0]), int(used[-1]))
            frac = np.abs(n - np.round(n))
            if split is not None or frac.max() > 1e-6:
                key = (ivs, tuple(nlo), tuple(nhi))
                if key not in rounded:
                    rounded.add(key)
                    self._round(ivs, n, nlo, nhi, F, res.row_dual)
                    if bound <= self.best_val + self._tol():
                        continue
            if split is not None:
                # two intervals, split halfway between the first and the last threshold carrying
                # traffic; the side carrying more first
                g, a, b = split
                lo, hi = ivs[g]
                mid = a + (b - a) // 2
                u = self._used(F, g)
                heavier_left = u[lo : mid + 1].sum() >= u[mid + 1 : hi + 1].sum()
                left = tuple(iv if j != g else (lo, mid) for j, iv in enumerate(ivs))
                right = tuple(iv if j != g else (mid + 1, hi) for j, iv in enumerate(ivs))
                first, second = (left, right) if heavier_left else (right, left)
                push(bound, depth + 1, (second, nlo, nhi))
                push(bound, depth + 1, (first, nlo, nhi))
                continue
            if frac.max() > 1e-6:
                # the fractional pool with the fewest workers: rounding it changes its capacity
                # most (on near-identical pools, e.g. SD-1.5 and SD-1.4, the most fractional count
                # makes the search walk every way of splitting workers between them)
                fr = np.flatnonzero(frac > 1e-6)
                j = int(fr[np.argmin(n[fr])])
                fl, ce = math.floor(n[j]), math.ceil(n[j])
                down_hi = nhi.copy()
                down_hi[j] = fl
                up_lo = nlo.copy()
                up_lo[j] = ce
                down = (ivs, nlo, down_hi)
                up = (ivs, up_lo, nhi)
                first, second = (down, up) if n[j] - fl >= 0.5 else (up, down)
                push(bound, depth + 1, second)
                push(bound, depth + 1, first)
                continue
            self._accept(ivs, x, F, bound)
        if self.best is None:
            return None, "infeasible"
        return self.best, "optimal"

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
        self.best = _extract(self.m, self.lay, x, self._choice(ivs, F), value)
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

    def evaluate(self, n: np.ndarray, ks: Sequence[int]) -> _Solution | None:
        """The LP with counts and thresholds fixed."""
        for g in range(self.G):
            self._set_interval(g, (ks[g], ks[g]))
        self._set_counts(np.asarray(n, dtype=float), np.asarray(n, dtype=float))
        res = self.lp.solve()
        if not res.ok:
            return None
        return _extract(self.m, self.lay, res.x, ks, res.objective)


# --- MILP formulation ----------------------------------------------------------------------------


def _milp_value(m: _Model, backend: str, time_limit_s: float) -> tuple[_Solution | None, str, str]:
    """The model with one binary per cascade threshold. Returns (solution, backend, status)."""
    c, A, lo, hi, col_lo, col_hi, integ, lay = _build(m, binaries=True)
    res = solve_milp(c, A, lo, hi, col_lo, col_hi, integ, sense="max", backend=backend, time_limit_s=time_limit_s)
    if not res.ok:
        return None, res.backend, f"{res.status} ({res.message})"
    x = res.x
    ks = [0] * len(m.groups)
    y = lay.iy
    for g, grp in enumerate(m.groups):
        if grp.V > 1:
            ks[g] = int(np.argmax(x[y : y + grp.V]))
            y += grp.V
    return _extract(m, lay, x, ks, float(res.objective)), res.backend, res.status


def _fixed_mask(m: _Model, ks: Sequence[int]) -> np.ndarray:
    off, _gk_g, _gk_k, Kt = _positions(m)
    mask = np.zeros((len(m.Z), Kt), dtype=bool)
    for g in range(len(m.groups)):
        mask[:, off[g] + ks[g]] = True
    return mask


def _milp_switch(
    m: _Model, ks: Sequence[int], cost: np.ndarray, sizes: Sequence[int], threshold: float, backend: str, tl: float
) -> tuple[_Solution | None, str]:
    """Pass 2 as a MILP (thresholds fixed): min switch cost s.t. value >= threshold, every worker placed."""
    c, A, lo, hi, col_lo, col_hi, integ, lay = _build(
        m, mask=_fixed_mask(m, ks), mode="switch", cost=cost, sizes=sizes, threshold=threshold
    )
    res = solve_milp(c, A, lo, hi, col_lo, col_hi, integ, sense="max", backend=backend, time_limit_s=tl)
    if not res.ok:
        return None, res.backend
    return _extract(m, lay, res.x, ks, float(res.objective)), res.backend


# --- switch costs and assignment -----------------------------------------------------------------


def _worker_groups(problem: UnifiedProblem, pools: list[str], pidx: dict[str, int], load_time: np.ndarray, models):
    """Workers grouped by (current pool, resident models); the cost of moving one of each group to
    each pool: 0 to stay, else 1 plus the pool's load time unless its model is current or resident;
    0 everywhere for a worker with no model and none resident (it loads one whatever the plan)."""
    sig: dict[tuple, list[str]] = {}
    for w in problem.workers:
        cur = problem.current.get(w)
        res = frozenset(problem.resident.get(w, frozenset()))
        sig.setdefault((cur, res), []).append(w)
    keys = list(sig)
    cost = np.zeros((len(keys), len(pools)))
    for h, (cur, res) in enumerate(keys):
        cur_model = models[pidx[cur]] if cur is not None else None
        if cur is None and not res:
            continue  # a worker with no model loads one whatever the plan: placing it moves nothing
        for mm, pool in enumerate(pools):
            if cur == pool:
                continue
            free = models[mm] == cur_model or models[mm] in res
            cost[h, mm] = 1.0 + (0.0 if free else float(load_time[mm]))
    return keys, [sig[k] for k in keys], cost


def _transport(cost: np.ndarray, sizes: Sequence[int], n: np.ndarray) -> np.ndarray:
    """An assignment of worker groups to pools with the given counts: the cheapest moves first
    (exact when costs are 0/1-plus-load; a small LP answers the general case through the MILP path)."""
    H, M = cost.shape
    t = np.zeros((H, M), dtype=np.int64)
    supply = np.array(sizes, dtype=np.int64)
    need = n.astype(np.int64).copy()
    order = sorted((cost[h, mm], h, mm) for h in range(H) for mm in range(M))
    for _c, h, mm in order:
        k = min(supply[h], need[mm])
        if k > 0:
            t[h, mm] += k
            supply[h] -= k
            need[mm] -= k
    return t


def _switch_cost(t: np.ndarray, cost: np.ndarray) -> tuple[float, int]:
    moved = int(sum(t[h, mm] for h in range(t.shape[0]) for mm in range(t.shape[1]) if cost[h, mm] > 0))
    return float((t * cost).sum()), moved


def _keep_in_place(n: np.ndarray, cur: np.ndarray, loads: np.ndarray, W: int, fallback: int) -> np.ndarray:
    """The counts the loads need, plus spare workers left on the pools they run now (up to their
    current count), the rest placed by :func:`_place_spare`: the start of the switch pass."""
    out = n.astype(np.int64).copy()
    spare = W - int(out.sum())
    for mm in np.argsort(-(cur - out)):
        if spare <= 0:
            break
        keep = int(min(spare, max(0, cur[mm] - out[mm])))
        out[mm] += keep
        spare -= keep
    return _place_spare(out, loads, W, fallback)


def _place_spare(n: np.ndarray, loads: np.ndarray, W: int, fallback: int) -> np.ndarray:
    """Workers the loads do not need go where utilisation is highest (queues drain faster there)."""
    out = n.astype(np.int64).copy()
    spare = W - int(out.sum())
    if spare <= 0:
        return out
    if loads.sum() <= EPS:
        out[fallback] += spare
        return out
    heap = [(-(loads[mm] / (SEC * max(out[mm], 1e-9))), mm) for mm in range(len(out)) if loads[mm] > EPS]
    heapq.heapify(heap)
    while spare > 0:
        _u, mm = heapq.heappop(heap)
        out[mm] += 1
        spare -= 1
        heapq.heappush(heap, (-(loads[mm] / (SEC * out[mm])), mm))
    return out


# --- entry point ---------------------------------------------------------------------------------


def plan_unified(
    problem: UnifiedProblem,
    *,
    formulation: str = "exact",
    backend: str = "auto",
    switch_tolerance: float = 0.005,
    time_limit_s: float = 5.0,
    node_limit: int | None = None,
    gap: float = DEFAULT_GAP,
) -> UnifiedPlan:
    """Solve the unified plan (see the module doc). Never raises on a solver failure.

    ``gap``: the ``exact`` search stops when no open node can beat the best plan by more than this
    share of its value (the default is HiGHS's and Gurobi's default MIP gap); 0 proves optimality
    to rounding. The ``milp`` formulation solves to 1e-9. ``time_limit_s`` bounds each search and
    each MILP: a search stopped by it (or by ``node_limit``) keeps its best plan and notes how far
    from the bound it may be."""
    t0 = time.perf_counter()
    if formulation not in FORMULATIONS:
        raise ConfigError(f"formulation: unknown value {formulation!r}; choose one of {', '.join(FORMULATIONS)}")
    check_backend(backend)
    if not (0.0 <= switch_tolerance <= 1.0):
        raise ConfigError(f"switch_tolerance: must be in [0, 1], got {switch_tolerance}")
    if not time_limit_s > 0:
        raise ConfigError(f"time_limit_s: must be > 0, got {time_limit_s}")
    if not (math.isfinite(gap) and 0.0 <= gap < 1.0):
        raise ConfigError(f"gap: must be in [0, 1), got {gap}")
    problem.validate()
    limit = EXACT_NODE_LIMIT if node_limit is None else int(node_limit)
    notes: list[str] = []
    groups, pools, pidx = _compile(problem)
    models = [p.model for p in problem.pools]
    load_time = np.array([p.load_time_s for p in problem.pools])
    W = len(problem.workers)
    up = set(problem.workers)
    gone = [w for w in problem.current if w not in up]
    if gone:
        notes.append(f"{len(gone)} worker(s) of the current plan are gone; re-planned on {W}")
    nominal = problem.demand_qpm < NEGLIGIBLE_QPM
    prob_eff = replace(problem, demand_qpm=NOMINAL_QPM) if nominal else problem
    base = _base_demand(prob_eff)
    _var, unit = _cheapest(groups, pidx, base.sum(axis=0))
    planned, part_lo, served, short_tier = _planned_demand(
        prob_eff, groups, pidx, _var, unit, W, notes, backend, time_limit_s
    )
    shortfall = float(short_tier.sum())
    if nominal:
        shortfall = 0.0
        short_tier = np.zeros_like(short_tier)
        notes = [n for n in notes if not n.startswith("saturated")]
        notes.append(f"no demand predicted: routed as for a nominal {NOMINAL_QPM:g} QPM")
    # classes with a negligible share of the demand are not planned (their PASM rows follow the mix)
    floor = 1e-6 * max(1.0, float(planned.sum()))
    Z = [(t, c) for t in range(planned.shape[0]) for c in range(planned.shape[1]) if planned[t, c] > floor]
    d = np.array([planned[t, c] for t, c in Z])
    if W == 0 or not Z:
        why = "no workers: nothing can be served" if W == 0 else "no demand can be planned on these workers"
        return _finish(
            problem,
            groups,
            pools,
            pidx,
            [],
            np.zeros((0, len(groups))),
            [0] * len(groups),
            np.zeros(len(pools), dtype=np.int64),
            {},
            short_tier,
            problem.demand_qpm >= NEGLIGIBLE_QPM,
            0.0,
            0,
            t0,
            "none",
            formulation,
            0,
            [*notes, why],
        )
    # tiers with the same deadline and weight give identical columns: one LP class for each such
    # group of (tier, class), its flows split back in proportion to the demand (not in overload,
    # where each tier has its own served-volume rows)
    lp_members: list[list[int]] = []
    if part_lo is None:
        key: dict[tuple, int] = {}
        Zm: list[tuple[int, int]] = []
        for i, (t, c) in enumerate(Z):
            tier = prob_eff.tiers[t]
            k = (tier.deadline_s, tier.weight, c)
            if k not in key:
                key[k] = len(Zm)
                Zm.append((t, c))
                lp_members.append([])
            lp_members[key[k]].append(i)
        dm = np.array([sum(d[i] for i in ms) for ms in lp_members])
    else:
        Zm, dm = Z, d
        lp_members = [[i] for i in range(len(Z))]
    m = _Model(prob_eff, groups, pools, pidx, Zm, dm, W)
    if part_lo is not None:
        base = _base_demand(prob_eff)
        m.raw = np.array([base[t, c] for t, c in Z])
        m.head = d - m.raw
        m.part_lo = part_lo
    m.fallback = np.array([sum(served[Z[i]] for i in ms) for ms in lp_members])
    sol: _Solution | None = None
    used_backend = formulation
    nodes = 0
    if formulation == "exact":
        search = _Search(m, node_limit=limit, gap=gap, time_limit_s=time_limit_s)
        sol, status = search.run()
        nodes = search.nodes
        if status in ("node_limit", "time_limit"):
            what = f"node limit ({limit})" if status == "node_limit" else f"time limit ({time_limit_s:g} s)"
            if sol is not None:
                within = (search.open_bound - sol.value) / max(1e-12, abs(sol.value))
                notes.append(f"exact search stopped at its {what}: best plan within {100 * within:.3g}% of the bound")
                used_backend = "exact-incumbent"
            else:
                notes.append(f"exact search stopped at its {what} without a plan; answered by the MILP")
                got, be, st = _milp_value(m, backend, time_limit_s)
                if got is not None:
                    sol, used_backend = got, be
                else:
                    notes.append(f"{be} returned {st}; using the maximum-throughput plan")
                    sol, used_backend = None, "fallback"
    else:
        sol, be, st = _milp_value(m, backend, time_limit_s)
        used_backend = be
        if sol is None:
            notes.append(f"{be} returned {st}; answered by the exact search")
            search = _Search(m, node_limit=limit, gap=gap, time_limit_s=time_limit_s)
            sol, status = search.run()
            nodes = search.nodes
            used_backend = ("exact" if status == "optimal" else "exact-incumbent") if sol is not None else "fallback"
    if sol is not None and used_backend != "fallback":
        # with the counts and thresholds fixed exactly, no flow rides on a solver's integrality
        # tolerance (e.g. 6e-7 workers carrying a sliver of load)
        polish = search if used_backend in ("exact", "exact-incumbent") else _Search(m, fixed=sol.k)
        sol = polish.evaluate(sol.n, sol.k) or sol
    if sol is None:  # the maximum-throughput plan: every class on its cheapest option
        sol = _throughput_solution(m, _var, unit)
        used_backend = "fallback"
        if not any(n.startswith("exact search") or "maximum-throughput" in n for n in notes):
            notes.append("no plan found by the solver; using the maximum-throughput plan")
    flows = sol.x
    ks = sol.k
    loads = _pool_loads(m, flows, ks)
    best_pool = _best_pool(m)
    n = _need(loads)  # the LP may leave slack on a pool; spare workers are placed below
    _keys, members, cost = _worker_groups(problem, pools, pidx, load_time, models)
    sizes = [len(x) for x in members]
    switch_backend = ""
    t = None
    if problem.current and used_backend != "fallback":
        value = float(sum(m.val[z, g, ks[g]] * flows[z, g] for z in range(len(m.Z)) for g in range(len(groups))))
        cur_counts = np.zeros(len(pools), dtype=np.int64)
        for w in problem.workers:
            pool = problem.current.get(w)
            if pool is not None:
                cur_counts[pidx[pool]] += 1
        thr = value - max(switch_tolerance * abs(value), 1e-7 * abs(value) + 1e-9)
        start = _keep_in_place(n, cur_counts, loads, W, best_pool)
        if formulation == "exact":
            s2 = _Search(
                m,
                mode="switch",
                fixed=ks,
                cost=cost,
                sizes=sizes,
                threshold=thr,
                node_limit=limit,
                gap=gap,
                time_limit_s=time_limit_s,
            )
            got, st2 = s2.run(incumbent=s2.evaluate(start, ks))
            got = s2.evaluate(got.n, ks) or got if got is not None else None
            nodes += s2.nodes
            switch_backend = "exact"
            if st2 in ("node_limit", "time_limit"):
                notes.append(f"switch-cost search stopped at its {st2.replace('_', ' ')}; using its best plan")
        else:
            got, switch_backend = _milp_switch(m, ks, cost, sizes, thr, backend, time_limit_s)
            if got is not None:
                s2 = _Search(m, mode="switch", fixed=ks, cost=cost, sizes=sizes, threshold=thr)
                got = s2.evaluate(got.n, ks) or got
        if got is not None:
            flows = got.x
            n = got.n
            t = got.t
            loads = _pool_loads(m, flows, ks)
            if (n < _need(loads)).any() or t is None or (t.sum(axis=0) != n).any():  # pragma: no cover
                n, t = np.maximum(n, _need(loads)), None
            else:
                n = t.sum(axis=0)
        else:
            notes.append("switch-cost pass found no plan; kept the best-value plan")
            n = start
        used_backend = (
            f"{used_backend}+{switch_backend}" if switch_backend and switch_backend != used_backend else used_backend
        )
    n = _place_spare(n, loads, W, best_pool)
    if int(n.sum()) > W:  # pragma: no cover - numerical safety net
        notes.append("plan needed more workers than exist after rounding; using the maximum-throughput plan")
        sol = _throughput_solution(m, _var, unit)
        flows, ks = sol.x, sol.k
        loads = _pool_loads(m, flows, ks)
        n = _place_spare(_need(loads), loads, W, best_pool)
        t = None
    if t is None or (t.sum(axis=0) != n).any():
        t = _transport(cost, sizes, n)
    assignment: dict[str, str | None] = {}
    for h, ws in enumerate(members):
        pos = 0
        # workers that stay come first in each group, so the ones kept are the same each period
        for mm in sorted(range(len(pools)), key=lambda mm, h=h: cost[h, mm]):
            for _ in range(int(t[h, mm])):
                assignment[ws[pos]] = pools[mm]
                pos += 1
        for w in ws[pos:]:
            assignment[w] = None
    sw_cost, moved = _switch_cost(t, cost) if problem.current else (0.0, 0)
    flows = _split_back(flows, lp_members, d, len(Z))
    return _finish(
        problem,
        groups,
        pools,
        pidx,
        Z,
        flows,
        ks,
        n,
        assignment,
        short_tier,
        shortfall > 1e-9,
        sw_cost,
        moved,
        t0,
        used_backend,
        formulation,
        nodes,
        notes,
    )


def _split_back(flows: np.ndarray, members: list[list[int]], d: np.ndarray, n: int) -> np.ndarray:
    """Flows of merged LP classes back onto their (tier, class) members, in proportion to demand."""
    owner = np.zeros(n, dtype=np.int64)
    for zm, ms in enumerate(members):
        owner[ms] = zm
    total = np.bincount(owner, weights=d, minlength=len(members))
    ratio = np.divide(d, total[owner], out=np.zeros(n), where=total[owner] > 0)
    return flows[owner] * ratio[:, None]


def _best_pool(m: _Model) -> int:
    """The pool of the highest-value path for the demand (where spare workers go with no load)."""
    best = (-math.inf, 0)
    for g, grp in enumerate(m.groups):
        v = float((m.val[:, g, : grp.V].max(axis=1) * m.d).sum())
        if v > best[0]:
            best = (v, m.pidx[grp.path.stage.pool])
    return best[1]


def _pool_loads(m: _Model, flows: np.ndarray, ks: Sequence[int]) -> np.ndarray:
    loads = np.zeros(len(m.pools))
    for g in range(len(m.groups)):
        loads += flows[:, g] @ m.use[:, g, :, ks[g]]
    return loads


def _throughput_solution(m: _Model, var: Sequence[int], unit: np.ndarray) -> _Solution:
    """Every class on its cheapest option (the pre-pass guarantees it fits)."""
    Z, G = len(m.Z), len(m.groups)
    flows = np.zeros((Z, G))
    ks = list(var)
    for z in range(Z):
        tot = [float(m.use[z, g, :, ks[g]].sum()) for g in range(G)]
        g = int(np.argmin(tot))
        flows[z, g] = m.fallback[z] if m.fallback is not None else m.d[z]
    loads = _pool_loads(m, flows, ks)
    n = _need(loads)
    del unit
    return _Solution(n, ks, flows, 0.0)


def _finish(
    problem: UnifiedProblem,
    groups: list[_Group],
    pools: list[str],
    pidx: dict[str, int],
    Z: list[tuple[int, int]],
    flows: np.ndarray,
    ks: Sequence[int],
    n: np.ndarray,
    assignment: Mapping[str, str | None],
    short_tier: np.ndarray,
    saturated: bool,
    sw_cost: float,
    moved: int,
    t0: float,
    backend: str,
    formulation: str,
    nodes: int,
    notes: list[str],
) -> UnifiedPlan:
    tiers = [t.name for t in problem.tiers]
    classes = problem.classes
    path_ids = [g.path.id for g in groups]
    routing: dict[tuple[str, str], dict[str, float]] = {}
    objective = 0.0
    qsum = 0.0
    total = 0.0
    good = dict.fromkeys(tiers, 0.0)
    pool_load = np.zeros(len(pools))
    level_load: dict[str, float] = {}
    for z, (t, c) in enumerate(Z):
        r = routing.setdefault((tiers[t], classes[c]), {})
        for g, grp in enumerate(groups):
            x = float(flows[z, g])
            if x <= 1e-12:
                continue
            k = ks[g]
            r[grp.path.id] = r.get(grp.path.id, 0.0) + x
            objective += x * float(grp.val[t, c, k])
            qsum += x * float(grp.qual[c, k])
            good[tiers[t]] += x * float(grp.good[t, c, k])
            total += x
            for pool, u in grp.use:
                pool_load[pidx[pool]] += x * float(u[c, k])
            for lv, u in grp.level_use:
                level_load[lv] = level_load.get(lv, 0.0) + x * float(u[c, k])
    planned_tier = dict.fromkeys(tiers, 0.0)
    for z, (t, _c) in enumerate(Z):
        planned_tier[tiers[t]] += float(flows[z].sum())
    goodput = {tname: (good[tname] / planned_tier[tname] if planned_tier[tname] > EPS else 1.0) for tname in tiers}
    thresholds: dict[str, float] = {}
    deferral: dict[str, float] = {}
    batch: dict[str, int] = {}
    for g, grp in enumerate(groups):
        p = grp.path
        k = ks[g] if g < len(ks) else 0
        if p.is_cascade:
            thresholds[p.id] = float(p.thresholds[grp.variants[k]])
            served = sum(float(flows[z, g]) for z in range(len(Z)))
            defer = sum(float(flows[z, g]) * float(grp.defer[Z[z][1], k]) for z in range(len(Z)))
            deferral[p.id] = defer / served if served > EPS else float(grp.defer[:, k].mean())
        for st in (p.stage, p.miss, p.heavy):
            if st is not None:
                batch[st.level] = max(batch.get(st.level, 1), st.batch)
    counts = {pools[mm]: int(n[mm]) for mm in range(len(pools))} if len(n) else dict.fromkeys(pools, 0)
    level_assignment = _split_levels(problem, assignment, level_load, path_ids)
    head = max((t.headroom for t in problem.tiers), default=1.0)
    return UnifiedPlan(
        levels=problem.plan_levels(),
        classes=classes,
        tiers=tuple(tiers),
        paths=tuple(path_ids),
        path_strategy={g.path.id: g.path.strategy for g in groups},
        counts=counts,
        assignment=dict(assignment),
        level_assignment=level_assignment,
        routing=routing,
        thresholds=thresholds,
        deferral=deferral,
        batch_sizes=batch,
        loads={pools[mm]: float(pool_load[mm]) for mm in range(len(pools))},
        level_loads=level_load,
        demand_qpm=float(problem.demand_qpm),
        planned_qpm=planned_tier,
        shortfall_qpm=float(np.sum(short_tier)),
        shortfall_by_tier={tiers[t]: float(short_tier[t]) for t in range(len(tiers))},
        saturated=bool(saturated),
        objective=float(objective),
        expected_quality=float(qsum / total) if total > EPS else 0.0,
        goodput=goodput,
        switch_cost=float(sw_cost),
        moved_workers=int(moved),
        solve_s=time.perf_counter() - t0,
        backend=backend,
        formulation=formulation,
        nodes=int(nodes),
        headroom=float(head),
        notes=tuple(notes),
    )


def _split_levels(
    problem: UnifiedProblem,
    assignment: Mapping[str, str | None],
    level_load: Mapping[str, float],
    path_ids: Sequence[str],
) -> dict[str, str | None]:
    """Worker → level: each pool's workers over the levels of that pool by the load the plan puts on
    each (at least one worker per loaded level while workers last); a pool with no load gives its
    workers to its first level that is a path."""
    by_pool: dict[str, list[str]] = {}
    for w in problem.workers:
        p = assignment.get(w)
        if p is not None:
            by_pool.setdefault(p, []).append(w)
    pool_levels = {p.id: p.levels for p in problem.pools}
    stage_levels: dict[str, list[str]] = {}
    for path in problem.paths:
        for st in (path.stage, path.miss, path.heavy):
            if st is not None and st.level not in stage_levels.setdefault(st.pool, []):
                stage_levels[st.pool].append(st.level)
    out: dict[str, str | None] = dict.fromkeys(problem.workers)
    paths = set(path_ids)
    for pool, ws in by_pool.items():
        lvls = [lv for lv in (pool_levels.get(pool) or ()) if lv in stage_levels.get(pool, [])] or stage_levels.get(
            pool, []
        )
        loaded = sorted((lv for lv in lvls if level_load.get(lv, 0.0) > 1e-12), key=lambda lv: -level_load[lv])
        if not loaded:
            target = next((lv for lv in lvls if lv in paths), lvls[0] if lvls else None)
            for w in ws:
                out[w] = target
            continue
        k = len(ws)
        counts = dict.fromkeys(loaded, 0)
        for lv in loaded[:k]:
            counts[lv] = 1
        rest = k - sum(counts.values())
        if rest > 0:
            tot = sum(level_load[lv] for lv in loaded)
            ideal = {lv: k * level_load[lv] / tot for lv in loaded}
            extra = {lv: max(0.0, ideal[lv] - counts[lv]) for lv in loaded}
            base = {lv: math.floor(extra[lv]) for lv in loaded}
            give = min(rest, sum(base.values()))
            for lv in loaded:
                add = min(base[lv], give)
                counts[lv] += add
                give -= add
            rest = k - sum(counts.values())
            for lv in sorted(loaded, key=lambda lv: -(extra[lv] - math.floor(extra[lv]))):
                if rest <= 0:
                    break
                counts[lv] += 1
                rest -= 1
            while rest > 0:  # pragma: no cover - arithmetic safety
                counts[loaded[0]] += 1
                rest -= 1
        i = 0
        for lv in loaded:
            for _ in range(counts[lv]):
                out[ws[i]] = lv
                i += 1
    return out


def restrict(problem: UnifiedProblem, strategies: Iterable[Strategy]) -> UnifiedProblem:
    """The same problem with only the paths of ``strategies`` (e.g. {AC}: ARGUS's AC ladder alone;
    {CASCADE}: cascades alone, as DiffServe runs them). Raises ConfigError when none is left."""
    keep = frozenset(strategies)
    paths = tuple(p for p in problem.paths if p.strategy in keep)
    if not paths:
        raise ConfigError(f"restrict: the problem has no path of {sorted(s.value for s in keep)}")
    return replace(problem, paths=paths, levels=problem.plan_levels())
