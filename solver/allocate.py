"""Allocation: how many workers run each approximation level, and what share of the load each
level serves (ARGUS §4.2, Eq. 1).

::

    maximize  sum_v Q_v * F(v)
    s.t.      F(v) = sum_w x[v,w] * y_w,   sum_w y_w = W_t,
              y_w <= sum_v P_th(v) * x[v,w],   sum_v x[v,w] <= 1,   x binary

Three formulations give the same optimal quality (a property test checks it):

* ``paper``: Eq. 1 as written, binary x per worker and level, continuous y per worker; the
  product x*y is linearised with z[v,w] = x[v,w]*y_w (z <= P_th(v) x, sum_v z = y).
* ``aggregated``: one integer count n_v per level and a continuous load l_v <= n_v * P_th(v);
  its size does not grow with the cluster.
* ``exact``: branch and bound on the aggregated counts with a closed-form LP bound
  (:mod:`solver.exact`); no model build, the fast path for the control loop.

On top of the optimum:

* **Saturation**: when the demand exceeds what every worker at the fastest level can serve, the
  plan is the maximum-throughput plan with ``saturated=True`` and ``shortfall_qpm``; solver
  failures never reach the caller: the exact path answers when a MILP backend fails, the
  aggregated MILP when the exact search hits its node limit, and if both fail the best plan the
  search found or else the maximum-throughput plan (always a valid plan, with a note).
* **Switch cost**: with the current assignment, among plans within ``switch_tolerance``
  (relative) of the best quality the one that moves the fewest workers, weighted by model load
  time (:func:`solver.model.switch_cost`), is chosen; ``moved_workers`` reports the moves.
* **Failures**: ``current`` may name workers that are gone; only the workers passed in are
  planned for, keeping as many of them as possible where they are.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from argusdiff.domain import ApproxLevel
from argusdiff.errors import ConfigError
from solver import DEFAULT_FORMULATION
from solver.backends import check_backend, solve_milp
from solver.exact import ExactSolver, NodeLimit
from solver.model import EPS, LevelData, greedy_loads, level_data, switch_cost

__all__ = ["FORMULATIONS", "Allocation", "allocate", "worker_ids"]

FORMULATIONS = ("paper", "aggregated", "exact")


@dataclass(frozen=True, slots=True)
class Allocation:
    """One solved allocation. Tuples are in the order of the levels passed to :func:`allocate`."""

    levels: tuple[str, ...]
    counts: tuple[int, ...]  # workers per level
    share: tuple[float, ...]  # F(v): share of the load each level serves (sums to 1)
    loads_qpm: tuple[float, ...]  # load each level serves (QPM)
    assignment: dict[str, str | None]  # worker id -> level id
    demand_qpm: float  # the demand asked for (before the margin)
    capacity_qpm: float  # sum of peak throughput of the assigned workers
    expected_quality: float  # load-weighted mean relative quality, sum_v F(v) * Q_v
    saturated: bool = False
    shortfall_qpm: float = 0.0
    moved_workers: int = 0
    switch_cost: float = 0.0  # 1 per moved worker + model load seconds
    solve_s: float = 0.0
    # the one that produced the counts: "exact", "highs", "gurobi", "exact+highs"/"exact+gurobi"
    # (switch-cost pass), or after solver failures "exact-incumbent" / "fallback" (see notes)
    backend: str = "exact"
    formulation: str = "exact"
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return {
            "levels": list(self.levels),
            "counts": list(self.counts),
            "share": list(self.share),
            "loads_qpm": list(self.loads_qpm),
            "assignment": dict(self.assignment),
            "demand_qpm": self.demand_qpm,
            "capacity_qpm": self.capacity_qpm,
            "expected_quality": self.expected_quality,
            "saturated": self.saturated,
            "shortfall_qpm": self.shortfall_qpm,
            "moved_workers": self.moved_workers,
            "switch_cost": self.switch_cost,
            "solve_s": self.solve_s,
            "backend": self.backend,
            "formulation": self.formulation,
            "notes": list(self.notes),
        }


def worker_ids(workers: int | Sequence[str]) -> list[str]:
    if isinstance(workers, bool | str | bytes):
        raise ConfigError(f"workers: expected a count or a list of worker ids, got {workers!r}")
    if isinstance(workers, numbers.Integral):
        if workers < 0:
            raise ConfigError(f"workers: must be >= 0, got {workers}")
        return [f"w{i}" for i in range(int(workers))]
    if not isinstance(workers, Iterable):
        raise ConfigError(f"workers: expected a count or a list of worker ids, got {workers!r}")
    ids = [str(w) for w in workers]
    if len(set(ids)) != len(ids):
        raise ConfigError("workers: duplicate worker ids")
    return ids


def _validate(
    levels: Sequence[ApproxLevel],
    demand_qpm: float,
    formulation: str,
    margin: float,
    switch_tolerance: float,
    time_limit_s: float,
) -> None:
    if not levels:
        raise ConfigError("levels: at least one approximation level is required")
    ids = [lv.id for lv in levels]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"levels: duplicate level ids in {ids}")
    for lv in levels:
        if not (lv.peak_qpm > 0 and math.isfinite(lv.peak_qpm)):
            raise ConfigError(f"level {lv.id!r}: peak throughput must be > 0 QPM, got {lv.peak_qpm}")
        if not (0.0 <= lv.quality <= 1.0):
            raise ConfigError(f"level {lv.id!r}: quality must be in [0, 1], got {lv.quality}")
    if not (math.isfinite(demand_qpm) and demand_qpm >= 0):
        raise ConfigError(f"demand_qpm: must be a finite number >= 0, got {demand_qpm}")
    if formulation not in FORMULATIONS:
        raise ConfigError(f"formulation: unknown value {formulation!r}; choose one of {', '.join(FORMULATIONS)}")
    if not (math.isfinite(margin) and margin >= 1.0):
        raise ConfigError(f"margin: must be >= 1, got {margin}")
    if not (0.0 <= switch_tolerance <= 1.0):
        raise ConfigError(f"switch_tolerance: must be in [0, 1], got {switch_tolerance}")
    if not time_limit_s > 0:
        raise ConfigError(f"time_limit_s: must be > 0, got {time_limit_s}")


# --- MILP formulations ---------------------------------------------------------------------------


def _milp_aggregated(
    data: LevelData,
    W: int,
    D: float,
    backend: str,
    time_limit_s: float,
    cur: Sequence[int] | None = None,
    threshold: float | None = None,
):
    """Aggregated MILP. With ``cur``/``threshold``: minimise switch cost s.t. value >= threshold.

    Columns: n_v (int), l_v (cont) [, d_v >= n_v - cur_v, e_m >= N_m - C_m].
    """
    L = len(data)
    q = np.array(data.quality)
    P = np.array(data.peak)
    models = sorted(set(data.model))
    sw = cur is not None
    n_cols = 2 * L + ((L + len(models)) if sw else 0)
    rows: list[np.ndarray] = []
    lo: list[float] = []
    hi: list[float] = []

    def row() -> np.ndarray:
        return np.zeros(n_cols)

    r = row()
    r[L : 2 * L] = 1.0
    rows.append(r), lo.append(D), hi.append(D)  # sum l = D
    r = row()
    r[:L] = 1.0
    # sum n <= W; in the switch-cost pass sum n = W: every worker gets a level in the final plan,
    # so a worker the MILP left unassigned would be placed afterwards at a cost it did not see
    rows.append(r), lo.append(float(W) if sw else -np.inf), hi.append(W)
    for v in range(L):
        r = row()
        r[L + v] = 1.0
        r[v] = -P[v]
        rows.append(r), lo.append(-np.inf), hi.append(0.0)  # l_v <= P_v n_v
    c = np.zeros(n_cols)
    integ = np.zeros(n_cols, dtype=bool)
    integ[:L] = True
    col_lo = np.zeros(n_cols)
    col_hi = np.full(n_cols, np.inf)
    col_hi[:L] = W
    if not sw:
        c[L : 2 * L] = q
        sense = "max"
    else:
        assert threshold is not None
        r = row()
        r[L : 2 * L] = q
        rows.append(r), lo.append(threshold), hi.append(np.inf)
        for v in range(L):
            r = row()
            r[2 * L + v] = 1.0
            r[v] = -1.0
            rows.append(r), lo.append(-float(cur[v])), hi.append(np.inf)  # d_v >= n_v - cur_v
        for k, m in enumerate(models):
            r = row()
            r[2 * L + L + k] = 1.0
            members = [v for v in range(L) if data.model[v] == m]
            for v in members:
                r[v] = -1.0
            rows.append(r), lo.append(-float(sum(cur[v] for v in members))), hi.append(np.inf)
            c[2 * L + L + k] = max(data.load_time[v] for v in members)
        c[2 * L : 3 * L] = 1.0
        # a tiny preference for quality among equal-cost plans
        c[L : 2 * L] = -1e-7 * q / max(D, 1.0)
        sense = "min"
    A = np.vstack(rows)
    res = solve_milp(
        c, A, np.array(lo), np.array(hi), col_lo, col_hi, integ, sense=sense, backend=backend, time_limit_s=time_limit_s
    )
    if not res.ok:
        return None, res
    counts = [round(x) for x in res.x[:L]]
    return counts, res


def _milp_paper(
    data: LevelData,
    W: int,
    D: float,
    backend: str,
    time_limit_s: float,
    cur_level: Sequence[int | None] | None = None,
    threshold: float | None = None,
):
    """ARGUS Eq. 1 with binary x[v,w], continuous y_w and z[v,w] = x[v,w] * y_w.

    Column layout: x (L*W, index v*W + w), y (W), z (L*W). With ``cur_level`` (each worker's
    current level index or None) and ``threshold``: minimise the switch cost of the assignment
    (1 per worker leaving its level + load time when the model changes) s.t. quality >= threshold.
    """
    from scipy import sparse

    L = len(data)
    q = np.array(data.quality)
    P = np.array(data.peak)
    nx = L * W
    n_cols = 2 * nx + W
    xi = lambda v, w: v * W + w  # noqa: E731
    yi = lambda w: nx + w  # noqa: E731
    zi = lambda v, w: nx + W + v * W + w  # noqa: E731
    r_idx: list[int] = []
    c_idx: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []
    row = 0

    def add(cols, coefs, lo_v, hi_v):
        nonlocal row
        r_idx.extend([row] * len(cols))
        c_idx.extend(cols)
        vals.extend(coefs)
        lo.append(lo_v)
        hi.append(hi_v)
        row += 1

    add([yi(w) for w in range(W)], [1.0] * W, D, D)  # sum_w y_w = W_t
    for w in range(W):
        add([yi(w)] + [xi(v, w) for v in range(L)], [1.0] + [-P[v] for v in range(L)], -np.inf, 0.0)
        add([xi(v, w) for v in range(L)], [1.0] * L, -np.inf, 1.0)
        add([zi(v, w) for v in range(L)] + [yi(w)], [1.0] * L + [-1.0], 0.0, 0.0)  # sum_v z = y
        for v in range(L):
            add([zi(v, w), xi(v, w)], [1.0, -P[v]], -np.inf, 0.0)  # z <= P x
    c = np.zeros(n_cols)
    if threshold is None:
        for v in range(L):
            for w in range(W):
                c[zi(v, w)] = q[v]
        sense = "max"
    else:
        assert cur_level is not None
        add(
            [zi(v, w) for v in range(L) for w in range(W)],
            [q[v] for v in range(L) for w in range(W)],
            threshold,
            np.inf,
        )
        for w in range(W):
            cv = cur_level[w]
            for v in range(L):
                if cv is None or v != cv:
                    extra = data.load_time[v] if cv is None or data.model[v] != data.model[cv] else 0.0
                    c[xi(v, w)] = 1.0 + extra
        sense = "min"
    A = sparse.csr_matrix((vals, (r_idx, c_idx)), shape=(row, n_cols))
    integ = np.zeros(n_cols, dtype=bool)
    integ[:nx] = True
    col_lo = np.zeros(n_cols)
    col_hi = np.full(n_cols, np.inf)
    col_hi[:nx] = 1.0
    res = solve_milp(
        c, A, np.array(lo), np.array(hi), col_lo, col_hi, integ, sense=sense, backend=backend, time_limit_s=time_limit_s
    )
    if not res.ok:
        return None, res
    x = res.x[:nx].reshape(L, W)
    per_worker: list[int | None] = []
    for w in range(W):
        col = x[:, w]
        v = int(np.argmax(col))
        per_worker.append(v if col[v] > 0.5 else None)
    return per_worker, res


# --- assignment ----------------------------------------------------------------------------------


def _assign(
    ids: Sequence[str],
    data: LevelData,
    level_ids: Sequence[str],
    counts: Sequence[int],
    current_idx: Mapping[str, int | None],
) -> dict[str, str | None]:
    """Worker ids for given counts: keep workers where they are, move same-model first."""
    L = len(data)
    out: dict[str, str | None] = {}
    need = list(counts)
    free: list[str] = []
    for w in ids:
        v = current_idx.get(w)
        if v is not None and need[v] > 0:
            out[w] = level_ids[v]
            need[v] -= 1
        else:
            free.append(w)
    # same model first
    by_model: dict[str, list[str]] = {}
    for w in free:
        cv = current_idx.get(w)
        if cv is not None:
            by_model.setdefault(data.model[cv], []).append(w)
    taken: set[str] = set()
    for v in range(L):
        pool = by_model.get(data.model[v], [])
        while need[v] > 0 and pool:
            w = pool.pop()
            out[w] = level_ids[v]
            taken.add(w)
            need[v] -= 1
    rest = [w for w in free if w not in taken]
    rest.reverse()
    for v in range(L):
        while need[v] > 0 and rest:
            out[rest.pop()] = level_ids[v]
            need[v] -= 1
    free = rest
    for w in free:  # only when counts sum to fewer than the workers (never for allocate's plans)
        out[w] = None
    return {w: out[w] for w in ids}


# --- entry point ---------------------------------------------------------------------------------


def allocate(
    levels: Sequence[ApproxLevel],
    workers: int | Sequence[str],
    demand_qpm: float,
    *,
    current: Mapping[str, str | None] | None = None,
    formulation: str = DEFAULT_FORMULATION,
    backend: str = "auto",
    switch_tolerance: float = 0.005,
    margin: float = 1.0,
    time_limit_s: float = 5.0,
    spare: str = "best",
) -> Allocation:
    """Solve ARGUS Eq. 1 for ``workers`` and ``demand_qpm`` (× ``margin``). See the module doc.

    ``spare``: where workers the load does not need go when moving them disrupts nothing —
    ``"best"`` (spare capacity lowers queueing at the best level) or ``"fastest"`` (a burst
    reserve at the fastest level, for policies that send requests there when a deadline is at risk)."""
    t0 = time.perf_counter()
    if spare not in ("best", "fastest"):
        raise ConfigError(f"spare: expected 'best' or 'fastest', got {spare!r}")
    _validate(levels, demand_qpm, formulation, margin, switch_tolerance, time_limit_s)
    check_backend(backend)
    ids = worker_ids(workers)
    W = len(ids)
    data = level_data(levels)
    level_ids = [lv.id for lv in levels]
    L = len(levels)
    index = {lid: i for i, lid in enumerate(level_ids)}
    current_idx: dict[str, int | None] = {}
    notes: list[str] = []
    if current:
        unknown = sorted({lv for lv in current.values() if lv is not None and lv not in index})
        if unknown:
            raise ConfigError(f"current: unknown level id(s) {', '.join(unknown)}; levels: {', '.join(level_ids)}")
        up = set(ids)
        gone = [w for w in current if w not in up]
        if gone:
            notes.append(f"{len(gone)} worker(s) of the current plan are gone; re-planned on {W}")
        current_idx = {w: (index[lv] if lv is not None else None) for w, lv in current.items() if w in up}
    cur_counts = [0] * L
    for v in current_idx.values():
        if v is not None:
            cur_counts[v] += 1

    # Saturation: the most any plan can serve is every worker at the fastest level.
    max_cap = W * max(data.peak)
    want = demand_qpm * margin
    saturated = demand_qpm > max_cap + EPS
    shortfall = max(0.0, demand_qpm - max_cap)
    if W == 0:
        notes.append("no workers: nothing can be served")
        counts, planned, used_backend, saturated = [0] * L, 0.0, "none", demand_qpm > 0
    elif want > max_cap + EPS:
        if not saturated:
            notes.append(f"margin {margin:g} cannot be met: planning for the maximum capacity {max_cap:.1f} QPM")
        else:
            notes.append(f"saturated: demand {demand_qpm:.1f} QPM exceeds the maximum capacity {max_cap:.1f} QPM")
        # maximum-throughput plan: every worker at the fastest level (best quality among ties)
        counts, planned, used_backend = _throughput_counts(data, W), min(want, max_cap), "exact"
    else:
        planned, saturated, shortfall = want, False, 0.0
        counts, used_backend = _solve(
            formulation, data, ids, W, want, cur_counts, current_idx, switch_tolerance, notes, backend, time_limit_s
        )
        if used_backend != "fallback":  # the maximum-throughput fallback stays as it is
            counts = _reclaim_idle(data, counts, want, cur_counts, spare)
    return _result(
        levels,
        ids,
        data,
        counts,
        current_idx,
        demand_qpm,
        planned,
        saturated,
        shortfall,
        cur_counts,
        t0,
        used_backend,
        formulation,
        notes,
    )


def _solve(
    formulation: str,
    data: LevelData,
    ids: Sequence[str],
    W: int,
    D: float,
    cur_counts: Sequence[int],
    current_idx: Mapping[str, int | None],
    switch_tolerance: float,
    notes: list[str],
    backend: str,
    time_limit_s: float,
) -> tuple[list[int], str]:
    """(counts, backend) of the formulation for ``W`` workers and load ``D`` (not saturated).

    The MILP formulations solve for the best quality, then (with a current plan) for the least
    switch cost within ``switch_tolerance`` of it; when a MILP fails the exact search answers."""
    if formulation == "exact" or D <= EPS:
        return _solve_exact(data, W, D, cur_counts, current_idx, switch_tolerance, notes, backend, time_limit_s)
    L = len(data)
    if formulation == "aggregated":
        got, res = _milp_aggregated(data, W, D, backend, time_limit_s)
        counts = got
    else:  # paper: per-worker levels
        got, res = _milp_paper(data, W, D, backend, time_limit_s)
        counts = None if got is None else [sum(1 for v in got if v == i) for i in range(L)]
    if counts is not None and current_idx and (formulation == "paper" or switch_tolerance >= 0):
        best = _fill(data, counts, W) if formulation == "aggregated" else counts
        _, best_val = greedy_loads(data, best, D)
        thr = best_val - switch_tolerance * abs(best_val)
        if formulation == "aggregated":
            got2, res2 = _milp_aggregated(data, W, D, backend, time_limit_s, cur=cur_counts, threshold=thr)
            counts2 = got2
        else:
            cur_level = [current_idx.get(w) for w in ids]
            got2, res2 = _milp_paper(data, W, D, backend, time_limit_s, cur_level=cur_level, threshold=thr)
            counts2 = None if got2 is None else [sum(1 for v in got2 if v == i) for i in range(L)]
        if counts2 is not None:
            counts, res = counts2, res2
    if counts is None:
        notes.append(f"{res.backend} returned {res.status} ({res.message}); answered by the exact solver")
        return _solve_exact(data, W, D, cur_counts, current_idx, switch_tolerance, notes, backend, time_limit_s)
    if res.status == "time_limit":
        notes.append(f"{res.backend} hit the {time_limit_s:g} s time limit; best plan found")
    if not current_idx:
        return _canonical(data, counts, W, D), res.backend
    if formulation == "aggregated":
        return _fill_switch(data, counts, W, cur_counts), res.backend
    return _fill(data, counts, W), res.backend


def _best_level(data: LevelData) -> int:
    """The best-quality level (the faster among ties)."""
    return max(range(len(data)), key=lambda v: (data.quality[v], data.peak[v]))


def _fastest_level(data: LevelData) -> int:
    """The highest-throughput level (the better among ties)."""
    return max(range(len(data)), key=lambda v: (data.peak[v], data.quality[v]))


def _needed(data: LevelData, v: int, count: int, load: float) -> int:
    """Workers of level ``v`` (of the ``count`` it has) its ``load`` needs."""
    return min(count, math.ceil(load / data.peak[v] - 1e-9)) if load > EPS else 0


def _canonical(data: LevelData, counts: Sequence[int], W: int, D: float) -> list[int]:
    """Among the plans a MILP may return with the same loads, the one the exact search returns:
    workers a level does not need for its greedy load (and unassigned ones) go to the best-quality
    level. The value never drops (the same loads stay feasible, the best level gains capacity)."""
    loads, _ = greedy_loads(data, counts, D)
    out = [_needed(data, v, c, ld) for v, (c, ld) in enumerate(zip(counts, loads, strict=True))]
    return _fill(data, out, W)


def _reclaim_idle(
    data: LevelData, counts: Sequence[int], D: float, cur_counts: Sequence[int], spare: str = "best"
) -> list[int]:
    """Workers a level does not need for its greedy load go to the ``spare`` target level (the
    best level, or the fastest as a burst reserve) when moving them disrupts nothing: their level
    runs the target level's model (e.g. approximate-caching levels of one SD-XL: no load), or they
    were not running that level before this plan (idle or new workers must load a model anyway).
    Without this the switch-cost pass parks spare workers where moving is cheapest — on a level the
    plan routes no load to — while the levels that carry the load queue up. The value never drops
    (the same loads stay feasible); workers that keep running what they ran stay, as switch-cost
    awareness wants."""
    loads, _ = greedy_loads(data, counts, D)
    target = _fastest_level(data) if spare == "fastest" else _best_level(data)
    out = list(counts)
    for v, (c, ld) in enumerate(zip(counts, loads, strict=True)):
        if v == target:
            continue
        surplus = c - _needed(data, v, c, ld)
        if data.model[v] != data.model[target]:
            surplus = min(surplus, max(0, c - cur_counts[v]))
        out[target] += surplus
        out[v] -= surplus
    return out


def _fill(data: LevelData, counts: Sequence[int], W: int) -> list[int]:
    """Give workers a MILP left unassigned to the best-quality level (spare capacity at no cost)."""
    out = list(counts)
    spare = W - sum(out)
    if spare > 0:
        out[_best_level(data)] += spare
    return out


# Node budget of the exact search; far above what any tested instance needs (a module constant
# so tests can force the fallback path).
EXACT_NODE_LIMIT = 2_000_000


def _throughput_counts(data: LevelData, W: int) -> list[int]:
    """Every worker at the fastest level (best quality among ties): feasible whenever the demand
    is within the maximum capacity, which :func:`allocate` checks before solving."""
    counts = [0] * len(data)
    counts[_fastest_level(data)] = W
    return counts


def _solve_exact(
    data: LevelData,
    W: int,
    D: float,
    cur_counts: Sequence[int],
    current_idx,
    tol: float,
    notes: list[str],
    backend: str = "auto",
    time_limit_s: float = 5.0,
) -> tuple[list[int], str]:
    """The optimal counts by the exact search. Never raises on a solver failure: if the search
    hits its node limit the aggregated MILP answers; if that fails too, the best plan the search
    found so far, else the maximum-throughput plan (each fallback is noted)."""
    solver = ExactSolver(data, W, D, node_limit=EXACT_NODE_LIMIT)
    try:
        got = solver.solve()
    except NodeLimit:
        notes.append(f"exact search hit its node limit ({EXACT_NODE_LIMIT}); answered by the aggregated MILP")
        counts, res = _milp_aggregated(data, W, D, backend, max(time_limit_s, 30.0))
        if counts is not None:
            return _fill(data, counts, W), res.backend
        if solver.best is not None:
            notes.append(
                f"{res.backend} returned {res.status} ({res.message}); "
                "using the best plan the exact search found before its node limit"
            )
            return list(solver.best), "exact-incumbent"
        notes.append(f"{res.backend} returned {res.status} ({res.message}); using the maximum-throughput plan")
        return _throughput_counts(data, W), "fallback"
    if got is None:  # pragma: no cover - feasibility was checked before; numerical safety net
        notes.append("exact search found no plan; using the maximum-throughput plan")
        return _throughput_counts(data, W), "fallback"
    counts, value = got
    if current_idx and switch_cost(data, counts, cur_counts)[0] > 0:
        # switch-cost pass: the aggregated MILP, minimum switch cost s.t. value >= threshold
        thr = value - tol * abs(value)
        sw, res = _milp_aggregated(data, W, D, backend, time_limit_s, cur=cur_counts, threshold=thr)
        if sw is not None:
            sw = _fill_switch(data, sw, W, cur_counts)
            _, sw_value = greedy_loads(data, sw, D)
            if sw_value >= thr - 1e-7 * max(1.0, abs(thr)) and (
                switch_cost(data, sw, cur_counts) <= switch_cost(data, counts, cur_counts)
            ):
                return sw, f"exact+{res.backend}"
        else:
            notes.append(f"switch-cost pass: {res.backend} returned {res.status}; kept the optimal plan")
    return counts, "exact"


def _fill_switch(data: LevelData, counts: Sequence[int], W: int, cur_counts: Sequence[int]) -> list[int]:
    """Unassigned workers of a switch-cost solution stay where they are when there is room."""
    out = list(counts)
    spare = W - sum(out)
    for v in range(len(out)):
        if spare <= 0:
            break
        keep = min(spare, max(0, cur_counts[v] - out[v]))
        out[v] += keep
        spare -= keep
    if spare > 0:
        return _fill(data, out, W)
    return out


def _result(
    levels,
    ids,
    data: LevelData,
    counts,
    current_idx,
    demand_qpm,
    served_demand,
    saturated,
    shortfall,
    cur_counts,
    t0,
    backend,
    formulation,
    notes,
) -> Allocation:
    level_ids = [lv.id for lv in levels]
    loads, value = greedy_loads(data, counts, served_demand)
    total = sum(loads)
    if total > EPS:
        share = tuple(x / total for x in loads)
        expected = value / total
    else:
        # no load: the share goes to the best level that has workers (or the best level)
        best = max(range(len(data)), key=lambda v: (counts[v] > 0, data.quality[v]))
        share = tuple(1.0 if v == best else 0.0 for v in range(len(data)))
        expected = data.quality[best]
    assignment = _assign(ids, data, level_ids, counts, current_idx)
    cost, moved = switch_cost(data, counts, cur_counts) if current_idx else (0.0, 0)
    if current_idx:
        moved = sum(
            1
            for w in ids
            if assignment[w] is not None and (current_idx.get(w) is None or level_ids[current_idx[w]] != assignment[w])
        )
    return Allocation(
        levels=tuple(level_ids),
        counts=tuple(int(c) for c in counts),
        share=share,
        loads_qpm=tuple(loads),
        assignment=assignment,
        demand_qpm=float(demand_qpm),
        capacity_qpm=float(sum(c * p for c, p in zip(counts, data.peak, strict=False))),
        expected_quality=float(expected),
        saturated=bool(saturated),
        shortfall_qpm=float(shortfall),
        moved_workers=int(moved),
        switch_cost=float(cost),
        solve_s=time.perf_counter() - t0,
        backend=backend,
        formulation=formulation,
        notes=tuple(notes),
    )
