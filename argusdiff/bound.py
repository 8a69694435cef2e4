"""The clairvoyant bound: the most any policy could reach on a trace, from a linear program that
knows every arrival in advance (docs/bound.md).

For a workload (arrivals, prompts and the per-prompt quality tables the simulator scores with), a
deployment profile, a worker count and an SLO, :func:`clairvoyant_bound` gives

* ``min_violation``: the smallest SLO violation ratio any schedule could reach;
* ``quality``: the highest mean relative quality of the requests served within their SLO that any
  schedule reaching ``min_violation`` could have (with 0 violations: serving every request in time);
* ``served_quality``: the highest total relative quality of the requests served within their SLO,
  per request of the trace (a late or dropped request scores 0). No schedule with violation ratio
  v has a mean relative quality above ``served_quality / (1 - v)`` (:meth:`Bound.quality_at`): the
  yardstick of every policy whatever its violations.

**The relaxation.** Each request r (arrival a_r, deadline d_r = a_r + its SLO) picks a convex
combination of the profile's levels (paths), or is not served in time. A path costs its level's
best per-image time over the batch sizes whose batch latency fits r's SLO
(min_b latency(b) / b), and it scores the request's relative quality at that level (the
workload's per-prompt table). Time is cut into bins of ``bin_s`` seconds. For every window of
consecutive bins [T_i, T_k), the work of the requests that arrive at or after T_i and are due by
T_k fits in the worker-seconds of the up workers over [T_i, T_k). Every real schedule satisfies
this: an on-time request's batch runs inside [a_r, d_r] on one worker, a worker runs one batch at
a time, and a batch of b images at a level takes latency(b) >= b x the per-image time above.
So the LP's optimum bounds every policy. Deadlines are rounded up to bin ends and arrivals down to
bin starts (both loosen the window constraints, never tighten them).

**Every window at O(bins) size.** With one SLO the O(B^2) windows are equivalent to a backlog
recursion (Lindley): b_j >= b_{j-1} + u_j - c_j, b_j >= 0, b_j <= (capacity of the bins after j
up to the deadline of bin j's arrivals); summing the recursion over i..j gives exactly the window
[i, j]'s constraint, and the smallest backlog (the recursion with equality) meets every bound when
every window holds. With several SLOs (tiers, per-request deadlines) each (arrival bin, deadline)
group's work flows into the bins between them under each bin's capacity; by Hall's theorem on this
interval structure the flow exists exactly when every window holds. Both keep the bound exact.

**Grouping.** Requests of the same prompt (hence the same quality row), SLO class and arrival bin
are one LP column per path with their count as its bound (exact). Per prompt only the paths on the
upper concave hull of (work, quality) can matter in the LP (a path below it is a convex mix of two
on it that costs no more work and scores no less), so each group keeps only those.

What the bound does not model (relaxed, so it is an upper bound, not a schedule): integrality and
non-preemption, batching beyond its per-image time, model loads and residency, cache misses and
lookup time, the discriminator's time and the cascade threshold, latency jitter, per-request
minimum quality levels (:data:`RELAXED`). Solved with HiGHS (:mod:`solver.backends`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argusdiff.domain import DEFAULT_TIER_SLO, ApproxLevel, Profile, Tier
from argusdiff.errors import ConfigError

__all__ = [
    "BOUND_LABEL",
    "RELAXED",
    "Bound",
    "clairvoyant_bound",
    "path_costs",
    "request_slos",
]

#: how replay tables label the bound's row: it is a yardstick, not a policy
BOUND_LABEL = "clairvoyant bound, not a policy"

#: the constraints of a real schedule that the LP relaxes (docs/bound.md)
RELAXED: tuple[str, ...] = (
    "integrality and non-preemption: a request may be split across paths, and work is fluid over the "
    "workers' capacity in every window",
    "batching: an image costs its level's best per-image time over the batch sizes whose batch latency fits its SLO",
    "model loads and residency: none",
    "cache: every K > 0 request hits (a miss is the K = 0 path, also offered); no lookup time",
    "cascades: a per-request choice of the light or the heavy image, no discriminator time",
    "latency jitter and per-request minimum quality levels: none",
)

BINS_PER_SLO = 8  # default bin: the shortest SLO / 8 (a window's slack is at most two bins)
MAX_CLASSES = 8  # distinct SLO classes kept; more are merged upwards (deadlines rounded up: still valid)


@dataclass(frozen=True)
class Bound:
    """The clairvoyant bound of one trace on one profile (see the module doc)."""

    profile: str
    gpus: int
    slo_s: float
    requests: int
    min_violation: float
    quality: float
    served_quality: float
    bin_s: float
    windows: str  # how every window was expressed: "backlog" (one SLO) or "flow" (several)
    columns: int
    rows: int
    solve_s: float
    unservable: int  # requests no path of the profile serves within their SLO
    max_quality: float = 1.0  # the best relative quality of any request on any path within its SLO
    relaxed: tuple[str, ...] = RELAXED
    notes: tuple[str, ...] = ()

    def quality_at(self, violation: float) -> float:
        """Upper bound on the mean relative quality of the on-time requests of any schedule whose
        violation ratio is ``violation`` (nan below :attr:`min_violation`: no schedule has it)."""
        if violation < self.min_violation - 1e-9 or violation >= 1.0:
            return float("nan")
        if violation <= self.min_violation + 1e-12:
            return self.quality
        return min(self.served_quality / (1.0 - violation), self.max_quality)

    def gap(self, violation: float, quality: float) -> float:
        """A policy's distance to the bound: the bound's served quality per request minus the
        policy's ((1 - violation) x quality; late and dropped requests score 0). Never negative
        for a real schedule."""
        if not (math.isfinite(quality) and math.isfinite(violation)):
            quality = 0.0 if not math.isfinite(quality) else quality
        return self.served_quality - (1.0 - violation) * quality

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": BOUND_LABEL,
            "profile": self.profile,
            "gpus": self.gpus,
            "slo_s": self.slo_s,
            "requests": self.requests,
            "min_violation": self.min_violation,
            "quality": self.quality,
            "served_quality": self.served_quality,
            "bin_s": self.bin_s,
            "windows": self.windows,
            "lp_columns": self.columns,
            "lp_rows": self.rows,
            "solve_s": self.solve_s,
            "unservable": self.unservable,
            "max_quality": self.max_quality,
            "relaxed": list(self.relaxed),
            "notes": list(self.notes),
        }


def request_slos(workload: Any, slo_s: float, tier_slo: Mapping[str, float] | None = None) -> np.ndarray:
    """Each request's SLO as the simulator sets it: the trace's explicit deadline, else ``slo_s``
    times its tier's multiplier (``standard`` when untiered)."""
    factors = dict(DEFAULT_TIER_SLO if tier_slo is None else tier_slo)
    n = workload.n_requests
    if workload.tier is None:
        slo = np.full(n, float(slo_s) * factors.get(Tier.STANDARD.value, 1.0))
    else:
        unknown = sorted(set(workload.tier) - set(factors))
        if unknown:
            raise ConfigError(f"tier_slo: no SLO multiplier for tier(s) {', '.join(map(repr, unknown))} of the trace")
        slo = np.array([float(slo_s) * factors[t] for t in workload.tier], dtype=np.float64)
    if workload.slo_s is not None:
        explicit = np.isfinite(workload.slo_s)
        slo = np.where(explicit, workload.slo_s, slo)
    return slo


def path_costs(level: ApproxLevel, slo_s: float) -> tuple[float, float]:
    """(per-image work, shortest batch latency) of ``level`` for a request whose SLO is ``slo_s``:
    the least latency(b) / b over the batch sizes b whose latency(b) fits the SLO (inf, inf when
    none does). Batch sizes above the largest profiled one cost the same per image (the profile's
    linear extrapolation), so the profiled range is enough."""
    best_work, best_lat = math.inf, math.inf
    for b in range(1, max(level.batch_sizes) + 1):
        lat = level.latency(b)
        if lat <= slo_s + 1e-9:
            best_work = min(best_work, lat / b)
            best_lat = min(best_lat, lat)
    return best_work, best_lat


@dataclass
class _Hulls:
    """Per (prompt, class): the upper concave hull's vertices of (work, quality) over the paths.

    ``work``/``qual``: (keys, max vertices) padded with nan; ``count``: vertices per key.
    ``origin``: hulls that start at (0, 0) (the request may go unserved), else at the fastest path."""

    work: np.ndarray
    qual: np.ndarray
    count: np.ndarray


def _upper_hull(points: list[tuple[float, float]], origin: bool) -> list[tuple[float, float]]:
    """Vertices of the upper concave hull, left to right, that raise quality with work (the
    Pareto-concave chain), from (0, 0) when ``origin`` else from the fastest point (its best)."""
    pts = sorted(points, key=lambda p: (p[0], -p[1]))
    if not pts:
        return []
    if origin:
        chain = [(0.0, 0.0)]
        rest = [p for p in pts if p[0] > 0]
    else:
        chain, rest = [pts[0]], pts[1:]
    for w, q in rest:
        if q <= chain[-1][1] + 1e-15:
            continue  # no more quality for at least as much work
        while len(chain) >= 2:
            (w1, q1), (w2, q2) = chain[-2], chain[-1]
            # drop the last vertex when it lies on or below the chord to (w, q)
            if (q2 - q1) * (w - w1) <= (q - q1) * (w2 - w1) + 1e-15:
                chain.pop()
            else:
                break
        chain.append((w, q))
    return chain


def _hulls(work: np.ndarray, rel: np.ndarray, origin: bool) -> _Hulls:
    """``work``: (paths,) per-image work of one class (inf: path infeasible); ``rel``: (prompts, paths)."""
    ok = np.isfinite(work)
    chains = []
    for row in rel:
        pts = [(float(w), float(q)) for w, q, good in zip(work, row, ok, strict=True) if good]
        chains.append(_upper_hull(pts, origin))
    m = max((len(c) for c in chains), default=0)
    W = np.full((len(chains), max(m, 1)), np.nan)
    Q = np.full_like(W, np.nan)
    cnt = np.zeros(len(chains), dtype=np.int64)
    for k, c in enumerate(chains):
        cnt[k] = len(c)
        if c:
            W[k, : len(c)] = [p[0] for p in c]
            Q[k, : len(c)] = [p[1] for p in c]
    return _Hulls(W, Q, cnt)


def _capacity(gpus: int, faults: Sequence[Any], bin_s: float, bins: int, longest_s: float = 0.0) -> np.ndarray:
    """Worker-seconds of the up workers in each bin (workers off during ``gpus`` faults). A ``slow``
    fault with a factor F < 1 (workers faster than profiled) raises its workers' capacity by 1/F
    over its interval and the longest batch after it (a batch started inside runs F times as long);
    F >= 1 only lengthens work, which keeps the bound an upper bound as it is."""
    cap = np.full(bins, gpus * bin_s, dtype=np.float64)
    edges = np.arange(bins + 1) * bin_s

    def overlap(start: float, end: float) -> np.ndarray:
        lo = np.clip(start, edges[:-1], edges[1:])
        hi = np.clip(end, edges[:-1], edges[1:])
        return np.maximum(hi - lo, 0.0)

    for f in faults:
        kind = getattr(f, "kind", None)
        if kind == "gpus":
            cap -= f.count * overlap(f.start_s, f.end_s)
        elif kind == "slow" and 0 < getattr(f, "factor", 1.0) < 1.0:
            cap += f.count * (1.0 / f.factor - 1.0) * overlap(f.start_s, f.end_s + longest_s)
    return np.maximum(cap, 0.0)


@dataclass
class _Columns:
    """Request-side LP columns: group (capacity group index), work coefficient, objective, bound,
    and (for the count form) the type (row) index."""

    group: np.ndarray
    work: np.ndarray
    obj: np.ndarray
    upper: np.ndarray
    typ: np.ndarray | None = None


@dataclass
class _Instance:
    n: int
    bin_s: float
    classes: np.ndarray  # (C,) offset in bins from arrival bin to deadline bin
    class_slo: np.ndarray  # (C,) the SLO each class's path costs use (its largest)
    cap: np.ndarray  # (bins,) capacity per bin
    groups: np.ndarray  # (G, 2): (class, arrival bin) of each capacity group
    # request types: (prompt key within class hulls, group, count)
    t_class: np.ndarray
    t_prompt: np.ndarray
    t_group: np.ndarray
    t_count: np.ndarray
    work: np.ndarray  # (C, paths) per-image work (inf: infeasible for the class)
    rel: np.ndarray  # (prompts used, paths) relative quality
    notes: list[str] = field(default_factory=list)


def _instance(
    workload: Any,
    levels: Sequence[ApproxLevel],
    gpus: int,
    slo: np.ndarray,
    faults: Sequence[Any],
    bin_s: float,
) -> _Instance:
    arr = np.asarray(workload.arrivals_s, dtype=np.float64)
    n = len(arr)
    t0 = float(arr.min()) if n else 0.0
    if t0 > 0:
        t0 = 0.0
    arr = arr - t0
    ibin = np.floor(arr / bin_s + 1e-12).astype(np.int64)
    # SLO classes by deadline offset in bins: d <= a + slo < T_{i+1} + slo <= T_{i + 1 + ceil(slo / bin)}
    offset = 1 + np.ceil(slo / bin_s - 1e-9).astype(np.int64)
    notes: list[str] = []
    uniq = np.unique(offset)
    if len(uniq) > MAX_CLASSES:
        # merge upwards onto MAX_CLASSES offsets (quantiles): a later deadline only loosens
        keep = np.unique(np.quantile(uniq, np.linspace(0, 1, MAX_CLASSES), method="higher"))
        offset = keep[np.searchsorted(keep, offset)]
        notes.append(f"{len(uniq)} distinct deadlines merged upwards onto {len(keep)} classes")
        uniq = keep
    cls = np.searchsorted(uniq, offset)
    class_slo = np.array([float(slo[cls == c].max()) for c in range(len(uniq))])
    work = np.array([[path_costs(lv, s)[0] for lv in levels] for s in class_slo], dtype=np.float64)
    prompts = np.asarray(workload.prompt_idx, dtype=np.int64)
    used, p_key = np.unique(prompts, return_inverse=True)
    rel = np.stack([np.asarray(workload.relative[lv.id], dtype=np.float64)[used] for lv in levels], axis=1)
    last = int(ibin.max()) if n else 0
    bins = last + int(uniq.max()) + 1
    longest = max(lv.latency(max(lv.batch_sizes)) for lv in levels)
    cap = _capacity(gpus, faults, bin_s, bins, longest)
    if t0 < 0:
        notes.append("arrivals shifted to start at 0 s")
    # capacity groups (class, arrival bin) and request types (prompt, group)
    gkey = cls * (last + 1) + ibin
    g_uniq, g_inv = np.unique(gkey, return_inverse=True)
    groups = np.stack([g_uniq // (last + 1), g_uniq % (last + 1)], axis=1)
    tkey = g_inv.astype(np.int64) * len(used) + p_key
    t_uniq, t_count = np.unique(tkey, return_counts=True)
    t_group = t_uniq // len(used)
    t_prompt = t_uniq % len(used)
    return _Instance(
        n=n,
        bin_s=bin_s,
        classes=uniq,
        class_slo=class_slo,
        cap=cap,
        groups=groups,
        t_class=groups[t_group, 0],
        t_prompt=t_prompt,
        t_group=t_group,
        t_count=t_count.astype(np.float64),
        work=work,
        rel=rel,
        notes=notes,
    )


def _assemble(inst: _Instance, cols: _Columns, base: np.ndarray, windows: str = "auto"):
    """The full LP (matrix form) over request columns ``cols`` and the window constraints.

    Capacity groups g have work ``base[g]`` + sum of their columns' work. One SLO class: backlog
    columns b_j per arrival bin, rows b_j - b_{j-1} - u_j >= base_j - c_j with
    0 <= b_j <= c(j+1 .. j+delta-1). Several: flow columns f_{g,t} for t in the group's bins, rows
    sum_t f_{g,t} - u_g >= base_g, and per bin sum f <= c_t. ``windows="all"``: one row per window
    (arrival bin i, deadline bin k), O(B^2) rows (for checking the other two on small instances).

    Returns c, A (csc), row_lo, row_hi, col_lo, col_hi, form.
    """
    from scipy import sparse

    nc = len(cols.obj)
    parts = _LPParts(col_lo=[np.zeros(nc)], col_hi=[cols.upper], obj=[cols.obj])
    if windows == "auto":
        windows = "backlog" if len(inst.classes) == 1 else "flow"
    writer = _WINDOW_FORMS.get(windows)
    if writer is None:
        raise ConfigError(f"windows: expected auto, backlog, flow or all, got {windows!r}")
    n_rows, n_cols = writer(inst, cols, base, parts)
    A = sparse.csc_matrix(
        (np.concatenate(parts.rows_v), (np.concatenate(parts.rows_r), np.concatenate(parts.rows_c))),
        shape=(n_rows, n_cols),
    )
    return (
        np.concatenate(parts.obj),
        A,
        np.concatenate(parts.row_lo),
        np.concatenate(parts.row_hi),
        np.concatenate(parts.col_lo),
        np.concatenate(parts.col_hi),
        windows,
    )


@dataclass
class _LPParts:
    """The LP's pieces as a window form adds them: A's entries (row, column, value), the row
    bounds, and the bounds and objective of the columns after the request columns."""

    col_lo: list[np.ndarray]
    col_hi: list[np.ndarray]
    obj: list[np.ndarray]
    rows_r: list[np.ndarray] = field(default_factory=list)
    rows_c: list[np.ndarray] = field(default_factory=list)
    rows_v: list[np.ndarray] = field(default_factory=list)
    row_lo: list[np.ndarray] = field(default_factory=list)
    row_hi: list[np.ndarray] = field(default_factory=list)


def _all_windows(inst: _Instance, cols: _Columns, base: np.ndarray, parts: _LPParts) -> tuple[int, int]:
    """One row per window (arrival bin i, deadline bin k) that holds a group: its work within the
    capacity of bins i .. k-1. Returns the LP's rows and columns."""
    cap = inst.cap
    prefix = np.concatenate([[0.0], np.cumsum(cap)])
    gbin = inst.groups[:, 1]
    gdue = gbin + inst.classes[inst.groups[:, 0]]
    starts, dues = np.unique(gbin), np.unique(gdue)
    pairs = [(i, k) for i in starts for k in dues if k > i and np.any((gbin >= i) & (gdue <= k))]
    col_group = cols.group
    for r, (i, k) in enumerate(pairs):
        inside = (gbin >= i) & (gdue <= k)
        m = np.nonzero(inside[col_group])[0]
        parts.rows_r.append(np.full(len(m), r))
        parts.rows_c.append(m)
        parts.rows_v.append(cols.work[m])
        parts.row_lo.append(np.array([-np.inf]))
        parts.row_hi.append(np.array([prefix[min(k, len(cap))] - prefix[i] - float(base[inside].sum())]))
    return len(pairs), len(cols.obj)


def _backlog_windows(inst: _Instance, cols: _Columns, base: np.ndarray, parts: _LPParts) -> tuple[int, int]:
    """One SLO class: a backlog column per arrival bin, carried at most until its deadline.
    Returns the LP's rows and columns."""
    if len(inst.classes) != 1:
        raise ConfigError("windows: the backlog form needs one SLO class")
    nc = len(cols.obj)
    cap = inst.cap
    prefix = np.concatenate([[0.0], np.cumsum(cap)])
    delta = int(inst.classes[0])
    last = int(inst.groups[:, 1].max())
    J = last + 1
    # group g -> its bin j (one class: groups are bins with arrivals)
    gbin = inst.groups[:, 1]
    u_base = np.zeros(J)
    np.add.at(u_base, gbin, base)
    # request columns: -work in the row of their bin
    parts.rows_r.append(gbin[cols.group])
    parts.rows_c.append(np.arange(nc))
    parts.rows_v.append(-cols.work)
    # backlog columns nc .. nc+J-1
    j = np.arange(J)
    parts.rows_r += [j, j[1:]]
    parts.rows_c += [nc + j, nc + j[:-1]]
    parts.rows_v += [np.ones(J), -np.ones(J - 1)]
    parts.row_lo.append(u_base - cap[:J])
    parts.row_hi.append(np.full(J, np.inf))
    parts.col_lo.append(np.zeros(J))
    parts.col_hi.append(prefix[np.minimum(j + delta, len(cap))] - prefix[j + 1])
    parts.obj.append(np.zeros(J))
    return J, nc + J


def _flow_windows(inst: _Instance, cols: _Columns, base: np.ndarray, parts: _LPParts) -> tuple[int, int]:
    """Several SLO classes: each group's work flows into the bins before its deadline, each bin
    within its capacity. Returns the LP's rows and columns."""
    nc = len(cols.obj)
    cap = inst.cap
    G = len(inst.groups)
    gcls, gbin = inst.groups[:, 0], inst.groups[:, 1]
    span = inst.classes[gcls]
    # flow columns: for each group, one per bin in [bin, bin + span)
    fg = np.repeat(np.arange(G), span)
    ft = np.concatenate([np.arange(b, b + s) for b, s in zip(gbin, span, strict=True)]) if G else np.zeros(0, int)
    nf = len(fg)
    parts.rows_r.append(cols.group)
    parts.rows_c.append(np.arange(nc))
    parts.rows_v.append(-cols.work)
    parts.rows_r.append(fg)
    parts.rows_c.append(nc + np.arange(nf))
    parts.rows_v.append(np.ones(nf))
    parts.row_lo.append(base.astype(np.float64))
    parts.row_hi.append(np.full(G, np.inf))
    used_bins = np.unique(ft)
    bin_row = np.full(len(cap), -1, dtype=np.int64)
    bin_row[used_bins] = G + np.arange(len(used_bins))
    parts.rows_r.append(bin_row[ft])
    parts.rows_c.append(nc + np.arange(nf))
    parts.rows_v.append(np.ones(nf))
    parts.row_lo.append(np.full(len(used_bins), -np.inf))
    parts.row_hi.append(cap[used_bins])
    parts.col_lo.append(np.zeros(nf))
    parts.col_hi.append(np.full(nf, np.inf))
    parts.obj.append(np.zeros(nf))
    return G + len(used_bins), nc + nf


#: how :func:`_assemble` writes the windows, by name
_WINDOW_FORMS = {"all": _all_windows, "backlog": _backlog_windows, "flow": _flow_windows}


def _solve(lp: tuple, time_limit_s: float) -> tuple[float, np.ndarray, int, int]:
    from solver.backends import solve_milp

    c, A, rlo, rhi, clo, chi, _form = lp
    res = solve_milp(
        c,
        A,
        rlo,
        rhi,
        clo,
        chi,
        np.zeros(len(c), dtype=bool),
        sense="max",
        backend="highs",
        time_limit_s=time_limit_s,
    )
    if res.status != "optimal" or res.objective is None:
        raise ConfigError(f"clairvoyant bound: HiGHS did not solve the LP ({res.status}: {res.message})")
    return float(res.objective), res.x, A.shape[1], A.shape[0]


def _segment_columns(inst: _Instance, origin: bool, shift: float = 0.0) -> tuple[_Columns, np.ndarray, float]:
    """Columns for the hull segments of every request type (a column = a count of requests moved
    one hull vertex up: the step's work and quality), the groups' base work (the fastest path of
    every request when not ``origin``) and the base quality.

    With ``origin`` a request may go unserved: its hull starts at (0, 0) and every path scores
    ``shift`` more (a reward per request served in time); ``_Columns.typ`` then marks the first
    segments (1: the step that serves the request) and ``_Columns.upper``... stays the count."""
    G = len(inst.groups)
    base = np.zeros(G)
    base_q = 0.0
    group, work, obj, upper, first = [], [], [], [], []
    for c in range(len(inst.classes)):
        sel = inst.t_class == c
        if not sel.any():
            continue
        prompts = np.unique(inst.t_prompt[sel])
        h = _hulls(inst.work[c], inst.rel[prompts] + (shift if origin else 0.0), origin)
        key = np.searchsorted(prompts, inst.t_prompt[sel])
        tg, tn = inst.t_group[sel], inst.t_count[sel]
        cnt = h.count[key]
        if not origin:
            ok = cnt > 0  # a request with no feasible path cannot be served in time at all
            np.add.at(base, tg[ok], tn[ok] * h.work[key[ok], 0])
            base_q += float(np.sum(tn[ok] * h.qual[key[ok], 0]))
        for s in range(1, h.work.shape[1]):
            m = cnt > s
            if not m.any():
                continue
            k = key[m]
            group.append(tg[m])
            work.append(h.work[k, s] - h.work[k, s - 1])
            obj.append(h.qual[k, s] - h.qual[k, s - 1])
            upper.append(tn[m])
            first.append(np.full(int(m.sum()), 1 if (origin and s == 1) else 0))
    cat = np.concatenate
    cols = _Columns(
        group=cat(group) if group else np.zeros(0, np.int64),
        work=cat(work) if work else np.zeros(0),
        obj=cat(obj) if obj else np.zeros(0),
        upper=cat(upper) if upper else np.zeros(0),
        typ=cat(first) if first else np.zeros(0, np.int64),
    )
    return cols, base, base_q


def _quality_at_most_served(inst: _Instance, served_max: float, time_limit_s: float, windows: str) -> tuple[float, int]:
    """The best mean quality of a schedule serving ``served_max`` requests in time (beyond capacity).

    Lagrangian on the count: each request served in time scores ``mu`` more. When the optimum for
    ``mu`` serves ``served_max`` requests it is also the best schedule among those serving that
    many (any other scores at most as much for ``mu``, and the reward is the same), so its quality
    is exact; ``mu`` starts at the steepest quality per second of any hull step times the largest
    least work and grows until the optimum serves them all. No per-request row is needed."""
    finite = inst.work[np.isfinite(inst.work)]
    seg, _b, _q = _segment_columns(inst, origin=False)
    steep = float(np.max(seg.obj / np.maximum(seg.work, 1e-12))) if len(seg.obj) else 1.0
    mu = max(1.0, 2.0 * steep * float(finite.max()) if len(finite) else 1.0)
    for tries in range(1, 9):
        cols, base0, _ = _segment_columns(inst, origin=True, shift=mu)
        _obj, x, _c, _r = _solve(_assemble(inst, cols, base0, windows), time_limit_s)
        xc = x[: len(cols.obj)]
        served = float(np.sum(xc[cols.typ == 1]))
        if served >= served_max * (1 - 1e-6):
            quality = float(np.sum(xc * cols.obj) - mu * served)
            return quality / served, tries
        mu *= 4.0
    raise ConfigError("clairvoyant bound: the reward per request served did not reach the most served")


def _checked(
    workload: Any,
    profile: Profile,
    gpus: int,
    slo_s: float | None,
    tier_slo: Mapping[str, float] | None,
    levels: Sequence[ApproxLevel] | None,
    bin_s: float | None,
) -> tuple[float, tuple[ApproxLevel, ...], np.ndarray, float]:
    """:func:`clairvoyant_bound`'s inputs checked: the deployment SLO, the levels, each request's
    SLO and the time bin."""
    if not isinstance(gpus, int) or gpus < 1:
        raise ConfigError(f"gpus: must be a whole number >= 1, got {gpus!r}")
    slo = float(slo_s) if slo_s is not None else profile.default_slo_s()
    if not (math.isfinite(slo) and slo > 0):
        raise ConfigError(f"slo: must be a positive number of seconds, got {slo_s!r}")
    lv = tuple(levels) if levels is not None else tuple(profile.levels)
    missing = [x.id for x in lv if x.id not in workload.relative]
    if missing:
        raise ConfigError(f"profile {profile.name!r}: the workload has no quality for level(s) {', '.join(missing)}")
    if workload.n_requests == 0:
        raise ConfigError("trace: no requests to bound")
    req_slo = request_slos(workload, slo, tier_slo)
    if bin_s is None:
        bin_s = float(req_slo.min()) / BINS_PER_SLO
    if not (math.isfinite(bin_s) and bin_s > 0):
        raise ConfigError(f"bin: must be a positive number of seconds, got {bin_s!r}")
    return slo, lv, req_slo, bin_s


@dataclass(frozen=True)
class _MostServed:
    """The bound's first LP: the most requests served in time (each at its least work)."""

    served: float  # at most the requests that fit some path
    unservable: float  # requests that fit no path within their SLO
    form: str  # how the windows were written ("backlog" or "flow")
    columns: int
    rows: int


def _most_served(inst: _Instance, n: int, time_limit_s: float, windows: str) -> _MostServed:
    """Every request at its least work: the most of them served in time."""
    G = len(inst.groups)
    count_cols: list[list[np.ndarray]] = [[], [], []]  # group, work, upper
    unservable = 0.0
    for c in range(len(inst.classes)):
        wmin = float(np.min(inst.work[c]))
        sel = inst.t_class == c
        if not math.isfinite(wmin):
            unservable += float(inst.t_count[sel].sum())
            continue
        per_group = np.zeros(G)
        np.add.at(per_group, inst.t_group[sel], inst.t_count[sel])
        gs = np.nonzero(per_group)[0]
        count_cols[0].append(gs)
        count_cols[1].append(np.full(len(gs), wmin))
        count_cols[2].append(per_group[gs])
    columns = rows = 0
    if count_cols[0]:
        cc = _Columns(
            group=np.concatenate(count_cols[0]),
            work=np.concatenate(count_cols[1]),
            obj=np.ones(sum(len(x) for x in count_cols[0])),
            upper=np.concatenate(count_cols[2]),
        )
        lp = _assemble(inst, cc, np.zeros(G), windows)
        served_max, _x, columns, rows = _solve(lp, time_limit_s)
        form = lp[-1]
    else:
        served_max, form = 0.0, "backlog"
    served_max = min(served_max, float(n) - unservable)
    return _MostServed(served_max, unservable, form, columns, rows)


def clairvoyant_bound(
    workload: Any,
    profile: Profile,
    *,
    gpus: int,
    slo_s: float | None = None,
    tier_slo: Mapping[str, float] | None = None,
    faults: Sequence[Any] = (),
    bin_s: float | None = None,
    levels: Sequence[ApproxLevel] | None = None,
    time_limit_s: float = 600.0,
    windows: str = "auto",
) -> Bound:
    """The clairvoyant bound of ``workload`` on ``profile``'s levels (or ``levels``) with ``gpus``
    workers (see the module doc). ``slo_s``: the deployment SLO (default: the profile's); the
    requests' own SLOs follow the simulator's rule (:func:`request_slos`). ``faults``: the
    simulator's :class:`~argusdiff.simulator.faults.Fault` list (workers off lower the capacity,
    workers faster than profiled raise it; cache outages and slow workers are ignored). ``bin_s``:
    the time bin (default: the shortest SLO / 8). ``windows``: how every window is written
    (``auto``: the backlog recursion for one SLO class, else the flow; ``all``: one row per
    window, for small checks)."""
    slo, lv, req_slo, bin_s = _checked(workload, profile, gpus, slo_s, tier_slo, levels, bin_s)
    n = workload.n_requests
    t_start = time.perf_counter()
    inst = _instance(workload, lv, gpus, req_slo, faults, float(bin_s))
    # 1. the most requests served in time: every request at its least work
    most = _most_served(inst, n, time_limit_s, windows)
    served_max, unservable, columns, rows = most.served, most.unservable, most.columns, most.rows
    min_violation = max(0.0, 1.0 - served_max / n)

    # 2. the most served quality (late or dropped requests score 0)
    seg, base0, _ = _segment_columns(inst, origin=True)
    if len(seg.obj):
        served_q, _x, c2, r2 = _solve(_assemble(inst, seg, base0, windows), time_limit_s)
        columns, rows = max(columns, c2), max(rows, r2)
    else:
        served_q = 0.0

    # 3. the best mean quality at the fewest violations
    notes = list(inst.notes)
    full = unservable == 0 and served_max >= n * (1 - 1e-9)
    if served_max <= 0:
        quality = float("nan")
    elif full:
        seg, base, base_q = _segment_columns(inst, origin=False)
        extra_q, _x, c3, r3 = _solve(_assemble(inst, seg, base, windows), time_limit_s)
        quality = (base_q + extra_q) / n
        columns, rows = max(columns, c3), max(rows, r3)
    else:
        quality, tries = _quality_at_most_served(inst, served_max, time_limit_s, windows)
        notes.append(
            f"beyond capacity: quality at the fewest violations by a reward per request served in time "
            f"({tries} LP solve{'s' if tries > 1 else ''})"
        )
    feasible = np.isfinite(inst.work).any(axis=0)
    max_quality = float(inst.rel[:, feasible].max()) if feasible.any() else float("nan")
    if unservable:
        notes.append(f"{int(unservable)} requests fit no path within their SLO")
    return Bound(
        profile=profile.name,
        gpus=gpus,
        slo_s=slo,
        requests=n,
        min_violation=min_violation,
        quality=quality,
        served_quality=served_q / n,
        bin_s=float(bin_s),
        windows=most.form,
        columns=columns,
        rows=rows,
        solve_s=time.perf_counter() - t_start,
        unservable=int(unservable),
        max_quality=max_quality,
        notes=tuple(notes),
    )
