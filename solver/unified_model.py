"""The unified plan's model (:mod:`solver.unified`): serving paths compiled to arrays over demand
classes and threshold variants, and the LP/MILP matrices the search and the MILP solve.

A :class:`Group` is one path with its undominated variants (usage per pool, value per tier, quality);
a :class:`Model` is a problem compiled to groups, pools and demand classes z = (tier, class);
:func:`build` lays out its columns (worker counts n, flows x, served demand, threshold binaries,
transport) and rows (demand, worker-seconds per pool, workers, served volume, thresholds, switch).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from solver.paths import ServingPath, UnifiedProblem

EPS = 1e-9
SEC = 60.0  # worker-seconds per minute of one worker
#: weight (× the largest value of one request) of the tie-break toward the path that is better for
#: the average prompt: 10× the solvers' relative gap (DEFAULT_GAP), so a solve respects it, and far
#: below the quality steps between a profile's levels (>= 0.01), so it decides only between ties
TIE_BREAK = 1e-3


# --- compiled paths ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """One path with its surviving variants, as arrays over classes (C) and variants (V)."""

    path: ServingPath
    variants: tuple[int, ...]  # indices into the path's threshold grid ([0] for a direct path)
    use: tuple[tuple[str, np.ndarray], ...]  # (pool id, seconds per request, C x V)
    val: np.ndarray  # T x C x V: tier weight x expected in-SLO (goodput_weight + quality)
    good: np.ndarray  # T x C x V: probability of meeting the tier's deadline
    qual: np.ndarray  # C x V: expected quality
    level_use: tuple[tuple[str, np.ndarray], ...]  # (level id, seconds per request, C x V)
    defer: np.ndarray  # C x V: share deferred to the heavy stage (0 for direct paths)

    @functools.cached_property
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
def compile_group(
    path: ServingPath, tiers: tuple[tuple[float, float], ...], G: float, C: int, heavy_direct: bool = False
) -> Group:
    """Usage, value and quality of every variant of ``path``; dominated variants dropped. With
    ``heavy_direct`` (the cascade's heavy level is also a direct path), a threshold that defers
    every request is dropped too: the direct heavy path serves the same images with less work and
    less latency, a domination across groups the per-group test cannot see (and that tie-breaks
    below the solvers' gap would not settle); per class, a threshold that defers every request of
    the class is worth nothing for it (the same images as the direct path, with more work).
    Cached: the path data and tiers repeat from one control period to the next."""
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
    if heavy_direct:
        # per class too: where a threshold defers every request of a class, that class's images
        # are the direct heavy path's, with more work on every pool and more latency; the entry is
        # worth nothing, so no plan (nor the switch-cost pass, which weighs value alone) routes the
        # class there at a value it only ties
        full = defer >= 1.0 - EPS  # C x K
        val = np.where(full[None], 0.0, val)
        good = np.where(full[None], 0.0, good)
    keep = _undominated(use, val) if K > 1 else np.array([0])
    if heavy_direct:
        partial = keep[np.any(defer[:, keep] < 1.0 - EPS, axis=0)]
        keep = partial if partial.size else keep
    sel = lambda a: a[..., keep]  # noqa: E731
    return Group(
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
class Model:
    """One problem compiled to arrays: groups, pools, demand classes."""

    problem: UnifiedProblem
    groups: list[Group]
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
    # what depends on the arrays above alone (positions, x data, dominated columns), made once
    memo: dict = field(init=False, default_factory=dict, repr=False, compare=False)

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


@dataclass(frozen=True)
class Compiled:
    """A problem's paths compiled (one :class:`Group` each) and its pools, with each pool's index."""

    groups: list[Group]
    pools: list[str]
    pidx: dict[str, int]


def compile_paths(problem: UnifiedProblem) -> Compiled:
    C = len(problem.classes)
    tiers = tuple((t.deadline_s, t.weight) for t in problem.tiers)
    direct = {p.stage.level for p in problem.paths if not p.is_cascade and p.miss is None}
    groups = [
        compile_group(p, tiers, float(problem.goodput_weight), C, p.is_cascade and p.heavy.level in direct)
        for p in problem.paths
    ]
    pools = [p.id for p in problem.pools]
    return Compiled(groups, pools, {p: i for i, p in enumerate(pools)})


def base_demand(problem: UnifiedProblem) -> np.ndarray:
    """T x C demand (QPM) before headroom."""
    H = np.asarray(problem.affinity, dtype=np.float64)
    H = H / H.sum() if H.sum() > 0 else np.full(len(H), 1.0 / len(H))
    S = np.array([t.share for t in problem.tiers], dtype=np.float64)
    S = S / S.sum()
    return problem.demand_qpm * S[:, None] * H[None, :]


def cheapest(groups: list[Group], pidx: dict[str, int], dC: np.ndarray) -> tuple[list[int], np.ndarray]:
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


def need(load: np.ndarray) -> np.ndarray:
    """Workers each pool needs for its load (worker-seconds per minute), with a tolerance for LP
    round-off."""
    return np.ceil(load / SEC - 1e-6 * np.maximum(1.0, load / SEC)).astype(np.int64)


def fits(d: np.ndarray, unit: np.ndarray, W: int) -> bool:
    """Whether demand d (T x C) on the per-class cheapest options fits W integer workers."""
    load = d.sum(axis=0) @ unit  # M
    return int(need(load).sum()) <= W


@dataclass
class Solution:
    n: np.ndarray  # M ints
    k: list[int]  # variant position per group
    x: np.ndarray  # Z x G: flow on each group's chosen variant
    value: float  # LP objective (with tie-breaks)
    t: np.ndarray | None = None  # switch pass: workers of each group sent to each pool


@dataclass
class Layout:
    """Column and row positions of the matrices :func:`build` makes. x columns exist for the
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


def positions(m: Model) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    got = m.memo.get("positions")
    if got is None:
        got = m.memo["positions"] = _positions(m)
    return got


def _positions(m: Model) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    Vs = np.array([g.V for g in m.groups])
    off = np.concatenate([[0], np.cumsum(Vs)[:-1]]).astype(np.int64)
    gk_g = np.repeat(np.arange(len(Vs)), Vs)
    gk_k = np.concatenate([np.arange(v) for v in Vs])
    return off, gk_g, gk_k, int(Vs.sum())


def xdata(m: Model, gk_g: np.ndarray, gk_k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Usage (Z x Kt x M), value (Z x Kt) and LP cost (Z x Kt) of every (z, group, variant) (of the
    positions ``gk_g``, ``gk_k``: :func:`positions`'s; made once per model, not to be changed)."""
    got = m.memo.get("xdata")
    if got is None or got[0] is not gk_g or got[1] is not gk_k:
        got = m.memo["xdata"] = (gk_g, gk_k, _xdata(m, gk_g, gk_k))
    return got[2]


def _xdata(m: Model, gk_g: np.ndarray, gk_k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    U = np.transpose(m.use[:, gk_g, :, gk_k], (1, 0, 2))
    Vx = m.val[:, gk_g, gk_k]
    cost = m.cost(Vx, m.qual[:, gk_g, gk_k], m.prior[:, gk_g, gk_k], U.sum(axis=2))
    return U, Vx, cost


@dataclass(frozen=True)
class LpMatrices:
    """A model as a solver takes it: maximise ``c·x`` s.t. ``row_lo <= A x <= row_hi``,
    ``col_lo <= x <= col_hi``, the columns of ``integrality`` integer; ``layout`` names the columns."""

    c: np.ndarray
    A: object  # scipy.sparse.csc_matrix
    row_lo: np.ndarray
    row_hi: np.ndarray
    col_lo: np.ndarray
    col_hi: np.ndarray
    integrality: np.ndarray
    layout: Layout


class _Rows:
    """Constraint rows as they are added: sparse triplets and their bounds."""

    def __init__(self) -> None:
        self.ri: list[np.ndarray] = []
        self.ci: list[np.ndarray] = []
        self.vv: list[np.ndarray] = []
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.r = 0

    def add(self, cols: np.ndarray, vals: np.ndarray, lo: float, hi: float) -> None:
        """One row over ``cols`` with coefficients ``vals``."""
        self.ri.append(np.full(len(cols), self.r))
        self.ci.append(cols)
        self.vv.append(vals)
        self.lo.append(lo)
        self.hi.append(hi)
        self.r += 1

    def matrix(self, n_cols: int):
        """The rows as a CSC matrix: what ``csc_matrix((vv, (ri, ci)))`` gives (entries sorted by
        column, then row; no two entries share a cell), without its conversions."""
        from scipy import sparse

        ri, ci, vv = np.concatenate(self.ri), np.concatenate(self.ci), np.concatenate(self.vv)
        order = np.lexsort((ri, ci))
        indptr = np.zeros(n_cols + 1, dtype=np.int32)
        np.cumsum(np.bincount(ci, minlength=n_cols), out=indptr[1:])
        return sparse.csc_matrix((vv[order], ri[order].astype(np.int32), indptr), shape=(self.r, n_cols), copy=False)


def build(
    m: Model,
    *,
    mask: np.ndarray | None = None,
    mode: str = "value",
    binaries: bool = False,
    cost: np.ndarray | None = None,
    sizes: Sequence[int] | None = None,
    threshold: float | None = None,
) -> LpMatrices:
    """The model's matrices. Columns: n (M), then x for the (z, position) pairs of ``mask`` (all
    by default). ``mode="value"``: maximise Σ v·x (with ``binaries``, one binary per cascade
    threshold: the MILP). ``mode="bound"``: maximise Σ v·x without the tie-breaks (solved as an LP,
    an upper bound of every plan's value). ``mode="switch"``: maximise minus the switch cost of
    moving worker groups (``cost``: groups x pools, ``sizes``) subject to Σ v·x >= ``threshold`` and
    every worker placed."""
    Z, M = len(m.Z), len(m.pools)
    off, gk_g, gk_k, Kt = positions(m)
    U, Vx, xc = xdata(m, gk_g, gk_k)
    if mask is None:
        mask = np.ones((Z, Kt), dtype=bool)
    zz, jj = np.nonzero(mask)
    nx = len(zz)
    xmap = np.full((Z, Kt), -1, dtype=np.int64)
    xmap[zz, jj] = M + np.arange(nx)
    lay = Layout(M=M, Z=Z, Kt=Kt, off=off, gk_g=gk_g, gk_k=gk_k, xmap=xmap)
    casc = [g for g in range(len(m.groups)) if m.groups[g].V > 1]
    over = m.part_lo is not None
    lay.ir = M + nx
    lay.iy = lay.ir + (2 * Z if over else 0)
    lay.it = lay.iy + (int(sum(m.groups[g].V for g in casc)) if binaries else 0)
    lay.n_h = 0 if cost is None else cost.shape[0]
    lay.n_cols = lay.it + lay.n_h * M
    xcols = M + np.arange(nx)
    rows = _Rows()
    _demand_rows(rows, m, lay, zz, xcols)
    lay.pool_row0 = rows.r
    # worker-seconds per minute of each pool, the M rows at once (the matrix is the same whatever
    # the entries' order)
    ux = U[zz, jj, :]  # nx x M
    pm, px = np.nonzero(ux.T != 0)
    rows.ri += [rows.r + pm, rows.r + np.arange(M)]
    rows.ci += [xcols[px], np.arange(M)]
    rows.vv += [ux[px, pm], np.full(M, -SEC)]
    rows.lo += [-np.inf] * M
    rows.hi += [0.0] * M
    rows.r += M
    rows.add(np.arange(M), np.ones(M), float(m.W) if mode == "switch" else -np.inf, float(m.W))  # workers
    if over:
        _served_rows(rows, m, lay)
    c = np.zeros(lay.n_cols)
    if mode == "value":
        c[:M] = -1e-9 * m.vscale  # the fewest workers the loads need (spare ones are placed after)
        c[xcols] = xc[zz, jj]
    elif mode == "bound":
        c[xcols] = Vx[zz, jj]
    if binaries:
        _threshold_rows(rows, m, lay, casc)
    if mode == "switch":
        assert cost is not None and sizes is not None and threshold is not None
        _switch_rows(rows, lay, xcols, Vx[zz, jj], sizes, threshold)
        c[lay.it :] = -cost.ravel()
        # a faint preference for value among plans of equal cost
        c[xcols] = (1e-7 / max(m.vscale * max(float(m.d.sum()), 1.0), 1e-12)) * Vx[zz, jj]
    col_lo = np.zeros(lay.n_cols)
    col_hi = np.full(lay.n_cols, np.inf)
    col_hi[:M] = float(m.W)
    if over:
        col_hi[lay.ir : lay.ir + Z] = m.raw
        col_hi[lay.ir + Z : lay.ir + 2 * Z] = m.head
    col_hi[lay.iy : lay.it] = 1.0
    integ = np.zeros(lay.n_cols, dtype=bool)
    integ[:M] = True
    integ[lay.iy : lay.it] = True
    return LpMatrices(c, rows.matrix(lay.n_cols), np.array(rows.lo), np.array(rows.hi), col_lo, col_hi, integ, lay)


def _demand_rows(rows: _Rows, m: Model, lay: Layout, zz: np.ndarray, xcols: np.ndarray) -> None:
    """Σ_g x[z, g] = d_z; in overload Σ_g x[z, g] = r_z + h_z (the demand and headroom served)."""
    Z = lay.Z
    rows.ri.append(zz)
    rows.ci.append(xcols)
    rows.vv.append(np.ones(len(zz)))
    if m.part_lo is not None:
        rows.ri += [np.arange(Z), np.arange(Z)]
        rows.ci += [lay.ir + np.arange(Z), lay.ir + Z + np.arange(Z)]
        rows.vv += [-np.ones(Z), -np.ones(Z)]
        rows.lo += [0.0] * Z
        rows.hi += [0.0] * Z
    else:
        rows.lo += [float(v) for v in m.d]
        rows.hi += [float(v) for v in m.d]
    rows.r += Z


def _served_rows(rows: _Rows, m: Model, lay: Layout) -> None:
    """Each tier serves at least the demand and headroom the served-volume stages found."""
    tier = np.array([t for t, _c in m.Z])
    for t in range(m.part_lo.shape[0]):
        members = np.flatnonzero(tier == t)
        for part in (0, 1):
            rows.add(lay.ir + part * lay.Z + members, np.ones(len(members)), float(m.part_lo[t, part]), np.inf)


def _threshold_rows(rows: _Rows, m: Model, lay: Layout, casc: Sequence[int]) -> None:
    """One threshold per cascade (Σ_k y[g, k] = 1), and flow only on it: Σ_z x[z, g, k] <= (Σ d) y[g, k]."""
    big = float(m.d.sum())
    yc = lay.iy
    for g in casc:
        V = m.groups[g].V
        rows.add(yc + np.arange(V), np.ones(V), 1.0, 1.0)
        # the V rows of the thresholds at once (the matrix is the same whatever the entries' order)
        block = lay.xmap[:, lay.off[g] : lay.off[g] + V]
        kk, zz = np.nonzero(block.T >= 0)
        rows.ri += [rows.r + kk, rows.r + np.arange(V)]
        rows.ci += [block[zz, kk], yc + np.arange(V)]
        rows.vv += [np.ones(len(kk)), np.full(V, -big)]
        rows.lo += [-np.inf] * V
        rows.hi += [0.0] * V
        rows.r += V
        yc += V


def _switch_rows(
    rows: _Rows, lay: Layout, xcols: np.ndarray, vx: np.ndarray, sizes: Sequence[int], threshold: float
) -> None:
    """The switch pass: Σ v·x >= threshold, each group of workers placed, Σ_h t[h, m] = n_m."""
    M, n_h = lay.M, lay.n_h
    lay.value_row = rows.r
    rows.add(xcols, vx, float(threshold), np.inf)
    # the n_h group rows, then the M pool rows, each set at once
    t_cols = lay.it + np.arange(n_h * M)
    rows.ri += [rows.r + np.repeat(np.arange(n_h), M), rows.r + n_h + np.tile(np.arange(M), n_h)]
    rows.ci += [t_cols, t_cols]
    rows.vv += [np.ones(n_h * M), np.ones(n_h * M)]
    rows.ri.append(rows.r + n_h + np.arange(M))
    rows.ci.append(np.arange(M))
    rows.vv.append(np.full(M, -1.0))
    rows.lo += [float(sizes[h]) for h in range(n_h)] + [0.0] * M
    rows.hi += [float(sizes[h]) for h in range(n_h)] + [0.0] * M
    rows.r += n_h + M


def dominated(m: Model, direct: Sequence[int]) -> np.ndarray:
    """:func:`_dominated`, made once per model and list of direct paths (not to be changed)."""
    key = ("dominated", tuple(direct))
    got = m.memo.get(key)
    if got is None:
        got = m.memo[key] = _dominated(m, direct)
    return got


def _dominated(m: Model, direct: Sequence[int]) -> np.ndarray:
    """Z x len(direct): direct paths another direct path beats for that class on the same pool: no
    more usage, no less value, quality and quality for the average prompt (the tie-break; of equals,
    the later one). Such a column is never
    needed: swapping its flow to the other frees capacity and loses nothing."""
    Z, D = len(m.Z), len(direct)
    if D < 2:
        return np.zeros((Z, D), dtype=bool)
    # every (i, j) pair at once, element for element the comparisons of one pair: axis 1 is i (the
    # path tested), axis 2 is j (the path that may beat it)
    idx = list(direct)
    use = m.use[:, :, :, 0][:, idx]  # Z x D x M
    val, qual, prior = (a[:, :, 0][:, idx] for a in (m.val, m.qual, m.prior))  # Z x D each
    ui, uj = use[:, :, None, :], use[:, None, :, :]
    no_more = np.all(uj <= ui + 1e-12, axis=3)
    no_less = np.ones((Z, D, D), dtype=bool)
    same = np.all(np.abs(uj - ui) <= 1e-12, axis=3)
    for a in (val, qual, prior):
        ai, aj = a[:, :, None], a[:, None, :]
        no_less &= aj >= ai - 1e-12
        same &= np.abs(aj - ai) <= 1e-12
    pools = [tuple(np.flatnonzero(m.use[0, g, :, 0] > 0)) for g in direct]
    pair = np.array([[i != j and pools[i] == pools[j] for j in range(D)] for i in range(D)])
    later = np.tri(D, D, -1, dtype=bool)  # j < i
    out = np.any(no_more & no_less & (~same | later) & pair, axis=2)
    return out


def extract(m: Model, lay: Layout, x: np.ndarray, ks: Sequence[int], value: float) -> Solution:
    F = lay.flows(x)
    flows = np.stack([F[:, int(lay.off[g]) + ks[g]] for g in range(len(m.groups))], axis=1)
    t = np.round(x[lay.it : lay.it + lay.n_h * lay.M]).reshape(-1, lay.M).astype(np.int64) if lay.n_h else None
    return Solution(np.round(x[: lay.M]).astype(np.int64), list(ks), flows, value, t)


def fixed_mask(m: Model, ks: Sequence[int]) -> np.ndarray:
    off, _gk_g, _gk_k, Kt = positions(m)
    mask = np.zeros((len(m.Z), Kt), dtype=bool)
    for g in range(len(m.groups)):
        mask[:, off[g] + ks[g]] = True
    return mask


def best_pool(m: Model) -> int:
    """The pool of the highest-value path for the demand (where spare workers go with no load)."""
    best = (-math.inf, 0)
    for g, grp in enumerate(m.groups):
        v = float((m.val[:, g, : grp.V].max(axis=1) * m.d).sum())
        if v > best[0]:
            best = (v, m.pidx[grp.path.stage.pool])
    return best[1]


def pool_loads(m: Model, flows: np.ndarray, ks: Sequence[int]) -> np.ndarray:
    loads = np.zeros(len(m.pools))
    for g in range(len(m.groups)):
        loads += flows[:, g] @ m.use[:, g, :, ks[g]]
    return loads


def throughput_solution(m: Model, var: Sequence[int]) -> Solution:
    """Every class on its cheapest option (the pre-pass guarantees it fits)."""
    Z, G = len(m.Z), len(m.groups)
    flows = np.zeros((Z, G))
    ks = list(var)
    for z in range(Z):
        tot = [float(m.use[z, g, :, ks[g]].sum()) for g in range(G)]
        g = int(np.argmin(tot))
        flows[z, g] = m.fallback[z] if m.fallback is not None else m.d[z]
    loads = pool_loads(m, flows, ks)
    return Solution(need(loads), ks, flows, 0.0)
