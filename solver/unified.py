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
* The LP's objective adds tie-breaks to v (:meth:`solver.unified_model.Model.cost`), the first of them
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
current pool and resident set to pools) with the thresholds of the first pass. When every worker
runs a pool, the plan that moves none (the current counts) is tried first as an LP: when it reaches
the tolerance it is the pass's optimum and no MILP is solved.

The running plan kept (``current_thresholds`` with every worker running a pool): when its LP
reaches ``switch_tolerance`` below the value MILP's LP relaxation (an upper bound of every plan's
value), it is the answer and neither pass runs (:func:`solver.unified_switch.keep_current`).

The modules, by concern: :mod:`solver.unified_model` (paths compiled to arrays, the LP/MILP
matrices), :mod:`solver.unified_demand` (the demand planned in overload), :mod:`solver.unified_search`
(the branch and bound and the MILP), :mod:`solver.unified_switch` (the switch-cost pass and where
the workers go) and :mod:`solver.unified_result` (:class:`UnifiedPlan`, assembled); this module
runs them in order.

Every failure path returns a valid plan: a search that hits its node limit is answered by the
MILP, a failed MILP by the search's incumbent, and without either by the maximum-throughput plan
(each noted).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from argusdiff.domain import Strategy
from argusdiff.errors import ConfigError
from solver.backends import check_backend
from solver.paths import UnifiedProblem
from solver.unified_demand import PlannedDemand, planned_demand
from solver.unified_model import Compiled, Model, base_demand, cheapest, compile_paths, throughput_solution
from solver.unified_result import Outcome, UnifiedPlan, assemble
from solver.unified_search import DEFAULT_GAP, EXACT_NODE_LIMIT, SolveOptions, solve_value
from solver.unified_switch import keep_current, place_workers, switch_pass, worker_groups

__all__ = ["DEFAULT_GAP", "FORMULATIONS", "UnifiedPlan", "plan_unified", "restrict"]

FORMULATIONS = ("exact", "milp")
NOMINAL_QPM = 1.0  # demand planned for when none is predicted (routes each class to its best path)
NEGLIGIBLE_QPM = 1e-3  # below this (one request in ~17 hours) no demand is predicted


def _second_pass(problem, m, sol, wg, opts, notes, used_backend):
    """The switch-cost pass, when there is a placement to keep. A cold start (no worker runs or holds
    a model) has none: every placement moves nothing, so the pass would return any plan within the
    tolerance, and the value pass's plan is the one to take."""
    if problem.current and used_backend != "fallback" and wg.cost.any():
        return switch_pass(problem, m, sol, wg, opts, notes)
    return None


def _solve_passes(problem, m, wg, var, opts, notes):
    """The value pass (the maximum-throughput plan when every solver fails), then the switch-cost
    pass: (solution, switch pass or None, backend, search nodes)."""
    first = solve_value(m, opts, notes)
    sol, used_backend, nodes = first.solution, first.backend, first.nodes
    if sol is None:  # the maximum-throughput plan: every class on its cheapest option
        sol = throughput_solution(m, var)
        used_backend = "fallback"
        if not any(n.startswith("exact search") or "maximum-throughput" in n for n in notes):
            notes.append("no plan found by the solver; using the maximum-throughput plan")
    pass2 = _second_pass(problem, m, sol, wg, opts, notes, used_backend)
    if pass2 is not None:
        nodes += pass2.nodes
        if pass2.backend and pass2.backend != used_backend:
            used_backend = f"{used_backend}+{pass2.backend}"
    return sol, pass2, used_backend, nodes


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
    _check_options(formulation, backend, switch_tolerance, time_limit_s, gap)
    problem.validate()
    opts = SolveOptions(
        formulation=formulation,
        backend=backend,
        switch_tolerance=switch_tolerance,
        time_limit_s=time_limit_s,
        node_limit=EXACT_NODE_LIMIT if node_limit is None else int(node_limit),
        gap=gap,
    )
    notes: list[str] = []
    comp = compile_paths(problem)
    W = len(problem.workers)
    up = set(problem.workers)
    gone = [w for w in problem.current if w not in up]
    if gone:
        notes.append(f"{len(gone)} worker(s) of the current plan are gone; re-planned on {W}")
    nominal = problem.demand_qpm < NEGLIGIBLE_QPM
    prob_eff = replace(problem, demand_qpm=NOMINAL_QPM) if nominal else problem
    var, unit = cheapest(comp.groups, comp.pidx, base_demand(prob_eff).sum(axis=0))
    pd = planned_demand(prob_eff, comp.groups, comp.pidx, var, unit, W, notes, backend, time_limit_s)
    short_tier = pd.shortfall_by_tier
    saturated = float(short_tier.sum()) > 1e-9
    if nominal:
        saturated = False
        short_tier = np.zeros_like(short_tier)
        notes = [n for n in notes if not n.startswith("saturated")]
        notes.append(f"no demand predicted: routed as for a nominal {NOMINAL_QPM:g} QPM")
    # classes with a negligible share of the demand are not planned (their PASM rows follow the mix)
    floor = 1e-6 * max(1.0, float(pd.planned.sum()))
    shape = pd.planned.shape
    Z = [(t, c) for t in range(shape[0]) for c in range(shape[1]) if pd.planned[t, c] > floor]
    d = np.array([pd.planned[t, c] for t, c in Z])
    if W == 0 or not Z:
        why = "no workers: nothing can be served" if W == 0 else "no demand can be planned on these workers"
        G, M = len(comp.groups), len(comp.pools)
        empty = Outcome(
            Z=[],
            flows=np.zeros((0, G)),
            ks=[0] * G,
            counts=np.zeros(M, dtype=np.int64),
            assignment={},
            shortfall_by_tier=short_tier,
            saturated=problem.demand_qpm >= NEGLIGIBLE_QPM,
            backend="none",
            formulation=formulation,
            nodes=0,
            notes=(*notes, why),
        )
        return assemble(problem, comp, empty, t0)
    m, lp_members = _model(prob_eff, comp, Z, d, W, pd)
    wg = worker_groups(problem, comp.pools, comp.pidx)
    kept = keep_current(problem, m, wg, opts) if problem.current and wg.cost.any() else None
    if kept is not None:
        (sol, pass2), used_backend, nodes = kept, "kept", 0
        notes.append(f"running plan kept: within {100 * opts.switch_tolerance:g}% of the best plan's bound")
    else:
        sol, pass2, used_backend, nodes = _solve_passes(problem, m, wg, var, opts, notes)
    placed = place_workers(problem, m, wg, sol, pass2, var, notes)
    out = Outcome(
        Z=Z,
        flows=split_back(placed.flows, lp_members, d, len(Z)),
        ks=placed.ks,
        counts=placed.n,
        assignment=placed.assignment,
        shortfall_by_tier=short_tier,
        saturated=saturated,
        backend=used_backend,
        formulation=formulation,
        nodes=nodes,
        notes=tuple(notes),
        switch_cost=placed.switch_cost,
        moved=placed.moved,
    )
    return assemble(problem, comp, out, t0)


def _check_options(formulation: str, backend: str, switch_tolerance: float, time_limit_s: float, gap: float) -> None:
    if formulation not in FORMULATIONS:
        raise ConfigError(f"formulation: unknown value {formulation!r}; choose one of {', '.join(FORMULATIONS)}")
    check_backend(backend)
    if not (0.0 <= switch_tolerance <= 1.0):
        raise ConfigError(f"switch_tolerance: must be in [0, 1], got {switch_tolerance}")
    if not time_limit_s > 0:
        raise ConfigError(f"time_limit_s: must be > 0, got {time_limit_s}")
    if not (math.isfinite(gap) and 0.0 <= gap < 1.0):
        raise ConfigError(f"gap: must be in [0, 1), got {gap}")


def _model(
    problem: UnifiedProblem, comp: Compiled, Z: list[tuple[int, int]], d: np.ndarray, W: int, pd: PlannedDemand
) -> tuple[Model, list[list[int]]]:
    """The LP model of the planned demand classes, and the members of each LP class. Tiers with the
    same deadline and weight give identical columns: one LP class for each such group of (tier,
    class), its flows split back in proportion to the demand (:func:`split_back`); not in
    overload, where each tier has its own served-volume rows."""
    if pd.part_lo is None:
        key: dict[tuple, int] = {}
        Zm: list[tuple[int, int]] = []
        lp_members: list[list[int]] = []
        for i, (t, c) in enumerate(Z):
            tier = problem.tiers[t]
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
    m = Model(problem, comp.groups, comp.pools, comp.pidx, Zm, dm, W)
    if pd.part_lo is not None:
        base = base_demand(problem)
        m.raw = np.array([base[t, c] for t, c in Z])
        m.head = d - m.raw
        m.part_lo = pd.part_lo
    m.fallback = np.array([sum(pd.served[Z[i]] for i in ms) for ms in lp_members])
    return m, lp_members


def split_back(flows: np.ndarray, members: list[list[int]], d: np.ndarray, n: int) -> np.ndarray:
    """Flows of merged LP classes back onto their (tier, class) members, in proportion to demand."""
    owner = np.zeros(n, dtype=np.int64)
    for zm, ms in enumerate(members):
        owner[ms] = zm
    total = np.bincount(owner, weights=d, minlength=len(members))
    ratio = np.divide(d, total[owner], out=np.zeros(n), where=total[owner] > 0)
    return flows[owner] * ratio[:, None]


def restrict(problem: UnifiedProblem, strategies: Iterable[Strategy]) -> UnifiedProblem:
    """The same problem with only the paths of ``strategies`` (e.g. {AC}: ARGUS's AC ladder alone;
    {CASCADE}: cascades alone, as DiffServe runs them). Raises ConfigError when none is left."""
    keep = frozenset(strategies)
    paths = tuple(p for p in problem.paths if p.strategy in keep)
    if not paths:
        raise ConfigError(f"restrict: the problem has no path of {sorted(s.value for s in keep)}")
    return replace(problem, paths=paths, levels=problem.plan_levels())
