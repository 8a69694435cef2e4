"""The unified plan's switch-cost pass (:mod:`solver.unified`): workers grouped by what they run and
hold, the cost of moving each group to each pool, the pass that keeps the value within a tolerance
and moves the fewest workers weighted by model load time, and the worker → pool assignment.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from solver.paths import UnifiedProblem
from solver.unified_model import (
    EPS,
    SEC,
    Model,
    Solution,
    best_pool,
    need,
    pool_loads,
    throughput_solution,
)
from solver.unified_search import (
    Search,
    SolveOptions,
    best_path_bound,
    dual_bound,
    milp_switch,
    plan_value,
    tolerance_floor,
    value_bound,
)


def worker_groups(problem: UnifiedProblem, pools: list[str], pidx: dict[str, int]) -> WorkerGroups:
    """Workers grouped by (current pool, resident models); the cost of moving one of each group to
    each pool: 0 to stay, else 1 plus the pool's load time unless its model is current or resident;
    0 everywhere for a worker with no model and none resident (it loads one whatever the plan)."""
    sig: dict[tuple, list[str]] = {}
    for w in problem.workers:
        cur = problem.current.get(w)
        res = frozenset(problem.resident.get(w, frozenset()))
        sig.setdefault((cur, res), []).append(w)
    keys = list(sig)
    models = [p.model for p in problem.pools]
    load_time = np.array([p.load_time_s for p in problem.pools])
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
    return WorkerGroups([sig[k] for k in keys], cost)


def transport(cost: np.ndarray, sizes: Sequence[int], n: np.ndarray) -> np.ndarray:
    """An assignment of worker groups to pools with the given counts: the cheapest moves first
    (exact when costs are 0/1-plus-load; a small LP answers the general case through the MILP path)."""
    H, M = cost.shape
    t = np.zeros((H, M), dtype=np.int64)
    supply = np.array(sizes, dtype=np.int64)
    want = n.astype(np.int64).copy()
    order = sorted((cost[h, mm], h, mm) for h in range(H) for mm in range(M))
    for _c, h, mm in order:
        k = min(supply[h], want[mm])
        if k > 0:
            t[h, mm] += k
            supply[h] -= k
            want[mm] -= k
    return t


def switch_cost(t: np.ndarray, cost: np.ndarray) -> tuple[float, int]:
    moved = int(sum(t[h, mm] for h in range(t.shape[0]) for mm in range(t.shape[1]) if cost[h, mm] > 0))
    return float((t * cost).sum()), moved


def keep_in_place(n: np.ndarray, cur: np.ndarray, loads: np.ndarray, W: int, fallback: int) -> np.ndarray:
    """The counts the loads need, plus spare workers left on the pools they run now (up to their
    current count), the rest placed by :func:`place_spare`: the start of the switch pass."""
    out = n.astype(np.int64).copy()
    spare = W - int(out.sum())
    for mm in np.argsort(-(cur - out)):
        if spare <= 0:
            break
        keep = int(min(spare, max(0, cur[mm] - out[mm])))
        out[mm] += keep
        spare -= keep
    return place_spare(out, loads, W, fallback)


def place_spare(n: np.ndarray, loads: np.ndarray, W: int, fallback: int) -> np.ndarray:
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


@dataclass(frozen=True)
class WorkerGroups:
    """Workers grouped by (current pool, resident models): the workers of each group, and the cost
    of moving one of each group to each pool (groups x pools)."""

    members: list[list[str]]
    cost: np.ndarray

    @property
    def sizes(self) -> list[int]:
        return [len(ws) for ws in self.members]


@dataclass(frozen=True)
class SwitchPass:
    """Pass 2's result: flows (Z x groups), worker counts per pool, the transport of worker groups to
    pools (None when it must be recomputed), pool loads, the search nodes spent and its backend."""

    flows: np.ndarray
    n: np.ndarray
    t: np.ndarray | None
    loads: np.ndarray
    nodes: int
    backend: str


@dataclass(frozen=True)
class Placement:
    """Where the workers go: counts per pool, each worker's pool, and what the moves cost."""

    flows: np.ndarray
    ks: list[int]
    n: np.ndarray
    assignment: dict[str, str | None]
    switch_cost: float
    moved: int


def current_counts(problem: UnifiedProblem, m: Model) -> np.ndarray:
    """Workers per pool in the running plan."""
    cur = np.zeros(len(m.pools), dtype=np.int64)
    for w in problem.workers:
        pool = problem.current.get(w)
        if pool is not None:
            cur[m.pidx[pool]] += 1
    return cur


def current_ks(problem: UnifiedProblem, m: Model) -> list[int] | None:
    """Each group's variant in the running plan: its cascade's current threshold among the group's
    surviving variants (a direct path has one). None when a cascade has no current threshold, or
    one that is not among them."""
    ks = []
    for grp in m.groups:
        if grp.V == 1:
            ks.append(0)
            continue
        t = problem.current_thresholds.get(grp.path.id)
        grid = [grp.path.thresholds[v] for v in grp.variants]
        if t is None or t not in grid:
            return None
        ks.append(grid.index(t))
    return ks


def keep_current(
    problem: UnifiedProblem, m: Model, wg: WorkerGroups, opts: SolveOptions
) -> tuple[Solution, SwitchPass] | None:
    """The running plan (its worker counts and thresholds, the flows re-planned for this demand),
    kept without the value MILP when it is provably good enough: every worker runs a pool, and its
    value is within ``switch_tolerance`` of an upper bound of every plan's value. The value MILP's
    plan is worth at most that bound, so the switch pass would accept these counts too (they move
    no worker); the two differ only in the thresholds, each within the tolerance. The bound is first
    the value of every request on its best path (:func:`solver.unified_search.best_path_bound`, no
    LP: capacity to spare is the common case), then
    the least of a grid of the work's Lagrangian bounds (:func:`solver.unified_search.dual_bound`,
    no LP either), then the value MILP's LP relaxation (:func:`solver.unified_search.value_bound`),
    the tightest; each bound is never below the next, so taking them in turn keeps the same plans.
    None when the test fails (the value MILP and the switch pass run as usual)."""
    cur = current_counts(problem, m)
    ks = current_ks(problem, m) if int(cur.sum()) == m.W else None
    if ks is None:
        return None
    # the running plan's LP: counts and thresholds fixed, its flows of the most value
    got = Search(m, mode="switch", fixed=ks, cost=wg.cost, sizes=wg.sizes, threshold=-math.inf).evaluate(cur, ks)
    if got is None or got.t is None:
        return None
    value = plan_value(m, got.x, ks)

    def within(bound: float) -> bool:
        return value >= tolerance_floor(bound, opts.switch_tolerance)

    if not within(best_path_bound(m)) and not within(dual_bound(m)):
        bound = value_bound(m)
        if bound is None or not within(bound):
            return None
    loads = pool_loads(m, got.x, ks)
    if (got.n < need(loads)).any() or (got.t.sum(axis=0) != got.n).any():  # pragma: no cover
        return None
    return got, SwitchPass(got.x, got.n, got.t, loads, 0, "")


def switch_pass(
    problem: UnifiedProblem, m: Model, first: Solution, wg: WorkerGroups, opts: SolveOptions, notes: list[str]
) -> SwitchPass:
    """Pass 2 (with a current assignment): among plans within ``switch_tolerance`` of the first
    pass's value, with its thresholds, the one that moves the fewest workers weighted by load time."""
    ks, flows = first.k, first.x
    loads = pool_loads(m, flows, ks)
    n = need(loads)
    value = plan_value(m, flows, ks)
    cur_counts = current_counts(problem, m)
    thr = tolerance_floor(value, opts.switch_tolerance)
    start = keep_in_place(n, cur_counts, loads, m.W, best_pool(m))
    nodes = 0
    switch = dict(mode="switch", fixed=ks, cost=wg.cost, sizes=wg.sizes, threshold=thr)
    if opts.formulation == "exact":
        s2 = Search(m, **switch, node_limit=opts.node_limit, gap=opts.gap, time_limit_s=opts.time_limit_s)
        got, st2 = s2.run(incumbent=s2.evaluate(start, ks))
        got = s2.evaluate(got.n, ks) or got if got is not None else None
        nodes = s2.nodes
        backend = "exact"
        if st2 in ("node_limit", "time_limit"):
            notes.append(f"switch-cost search stopped at its {st2.replace('_', ' ')}; using its best plan")
    else:
        got, backend = None, ""
        if int(cur_counts.sum()) == m.W:
            # every worker runs a pool: the one plan that moves none keeps the current counts; when
            # it reaches the threshold it is the MILP's optimum (a move costs >= 1, the faint value
            # term < 1e-7), and the MILP's answer would be polished by this very LP
            got = Search(m, **switch).evaluate(cur_counts, ks)
        if got is None:
            got, backend = milp_switch(m, ks, wg.cost, wg.sizes, thr, opts.backend, opts.time_limit_s)
            if got is not None:
                got = Search(m, **switch).evaluate(got.n, ks) or got
    if got is None:
        notes.append("switch-cost pass found no plan; kept the best-value plan")
        return SwitchPass(flows, start, None, loads, nodes, backend)
    t = got.t
    loads = pool_loads(m, got.x, ks)
    if (got.n < need(loads)).any() or t is None or (t.sum(axis=0) != got.n).any():  # pragma: no cover
        return SwitchPass(got.x, np.maximum(got.n, need(loads)), None, loads, nodes, backend)
    return SwitchPass(got.x, t.sum(axis=0), t, loads, nodes, backend)


def drop_slivers(
    m: Model, flows: np.ndarray, ks: Sequence[int], n: np.ndarray, loads: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Flows that put load on a pool left without workers, where that load is within the LP's
    tolerance (``need`` counts no worker for it; e.g. 4e-6 worker-seconds a minute from a saturated
    plan's served-volume rows, which keep a 1e-7 slack): dropped, so no request is routed to a
    level nobody serves. A larger load there would be a planning error, left to the caller."""
    sliver = (n == 0) & (loads > 0) & (need(loads) == 0)
    if not sliver.any():
        return flows, loads
    out = flows.copy()
    for g in range(len(m.groups)):
        on_sliver = (m.use[:, g, :, ks[g]][:, sliver] > 0).any(axis=1)
        out[on_sliver, g] = 0.0
    return out, pool_loads(m, out, ks)


def place_workers(
    problem: UnifiedProblem,
    m: Model,
    wg: WorkerGroups,
    sol: Solution,
    pass2: SwitchPass | None,
    fallback_ks: Sequence[int],
    notes: list[str],
) -> Placement:
    """Spare workers placed where utilisation is highest, and each worker's pool: the workers that
    stay first in each group, so the ones kept are the same each period."""
    ks = list(sol.k)
    if pass2 is not None:
        flows, n, t, loads = pass2.flows, pass2.n, pass2.t, pass2.loads
    else:
        flows, t = sol.x, None
        loads = pool_loads(m, flows, ks)
        n = need(loads)  # the LP may leave slack on a pool; spare workers are placed below
    W, best = m.W, best_pool(m)
    n = place_spare(n, loads, W, best)
    flows, loads = drop_slivers(m, flows, ks, n, loads)
    if int(n.sum()) > W:  # pragma: no cover - numerical safety net
        notes.append("plan needed more workers than exist after rounding; using the maximum-throughput plan")
        fb = throughput_solution(m, fallback_ks)
        flows, ks = fb.x, fb.k
        loads = pool_loads(m, flows, ks)
        n = place_spare(need(loads), loads, W, best)
        t = None
    if t is None or (t.sum(axis=0) != n).any():
        t = transport(wg.cost, wg.sizes, n)
    assignment: dict[str, str | None] = {}
    for h, ws in enumerate(wg.members):
        pos = 0
        for mm in sorted(range(len(m.pools)), key=lambda mm, h=h: wg.cost[h, mm]):
            for _ in range(int(t[h, mm])):
                assignment[ws[pos]] = m.pools[mm]
                pos += 1
        for w in ws[pos:]:
            assignment[w] = None
    sw_cost, moved = switch_cost(t, wg.cost) if problem.current else (0.0, 0)
    return Placement(flows, ks, n, assignment, sw_cost, moved)
