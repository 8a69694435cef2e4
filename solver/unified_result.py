"""The unified plan's result (:mod:`solver.unified`): :class:`UnifiedPlan`, assembled from a solved
model's flows, thresholds and worker counts, with each pool's workers split over its levels.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from argusdiff.domain import Plan, Strategy
from solver.paths import UnifiedProblem
from solver.unified_model import EPS, Compiled, Group


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


@dataclass(frozen=True)
class Outcome:
    """What a solve settled, for :func:`assemble`: the flows of each planned demand class z =
    (tier index, class index) on each group's chosen variant, the worker counts and assignment,
    and how the solve went."""

    Z: Sequence[tuple[int, int]]
    flows: np.ndarray  # Z x groups
    ks: Sequence[int]  # chosen variant per group
    counts: np.ndarray  # workers per pool
    assignment: Mapping[str, str | None]  # worker -> pool
    shortfall_by_tier: np.ndarray  # tier -> demand left unplanned (QPM)
    saturated: bool
    backend: str
    formulation: str
    nodes: int
    notes: tuple[str, ...]
    switch_cost: float = 0.0
    moved: int = 0


@dataclass
class _Totals:
    """Per-minute sums over the planned flows."""

    routing: dict[tuple[str, str], dict[str, float]]
    objective: float
    quality: float  # flow-weighted quality
    total: float
    good: dict[str, float]  # tier -> flow in SLO
    pool_load: np.ndarray
    level_load: dict[str, float]


def _totals(problem: UnifiedProblem, compiled: Compiled, out: Outcome) -> _Totals:
    tiers = [t.name for t in problem.tiers]
    classes = problem.classes
    acc = _Totals({}, 0.0, 0.0, 0.0, dict.fromkeys(tiers, 0.0), np.zeros(len(compiled.pools)), {})
    for z, (t, c) in enumerate(out.Z):
        r = acc.routing.setdefault((tiers[t], classes[c]), {})
        for g, grp in enumerate(compiled.groups):
            x = float(out.flows[z, g])
            if x <= 1e-12:
                continue
            k = out.ks[g]
            r[grp.path.id] = r.get(grp.path.id, 0.0) + x
            acc.objective += x * float(grp.val[t, c, k])
            acc.quality += x * float(grp.qual[c, k])
            acc.good[tiers[t]] += x * float(grp.good[t, c, k])
            acc.total += x
            for pool, u in grp.use:
                acc.pool_load[compiled.pidx[pool]] += x * float(u[c, k])
            for lv, u in grp.level_use:
                acc.level_load[lv] = acc.level_load.get(lv, 0.0) + x * float(u[c, k])
    return acc


def _cascades(groups: Sequence[Group], out: Outcome) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    """(threshold, deferred share) per cascade path and the batch size per level."""
    Z, flows = out.Z, out.flows
    thresholds: dict[str, float] = {}
    deferral: dict[str, float] = {}
    batch: dict[str, int] = {}
    for g, grp in enumerate(groups):
        p = grp.path
        k = out.ks[g] if g < len(out.ks) else 0
        if p.is_cascade:
            thresholds[p.id] = float(p.thresholds[grp.variants[k]])
            served = sum(float(flows[z, g]) for z in range(len(Z)))
            defer = sum(float(flows[z, g]) * float(grp.defer[Z[z][1], k]) for z in range(len(Z)))
            deferral[p.id] = defer / served if served > EPS else float(grp.defer[:, k].mean())
        for st in (p.stage, p.miss, p.heavy):
            if st is not None:
                batch[st.level] = max(batch.get(st.level, 1), st.batch)
    return thresholds, deferral, batch


def assemble(problem: UnifiedProblem, compiled: Compiled, out: Outcome, t0: float) -> UnifiedPlan:
    """The :class:`UnifiedPlan` of a solve's outcome (``t0``: when the solve began)."""
    groups, pools = compiled.groups, compiled.pools
    tiers = [t.name for t in problem.tiers]
    path_ids = [g.path.id for g in groups]
    acc = _totals(problem, compiled, out)
    planned_tier = dict.fromkeys(tiers, 0.0)
    for z, (t, _c) in enumerate(out.Z):
        planned_tier[tiers[t]] += float(out.flows[z].sum())
    goodput = {tname: (acc.good[tname] / planned_tier[tname] if planned_tier[tname] > EPS else 1.0) for tname in tiers}
    thresholds, deferral, batch = _cascades(groups, out)
    n = out.counts
    counts = {pools[mm]: int(n[mm]) for mm in range(len(pools))} if len(n) else dict.fromkeys(pools, 0)
    short_tier = out.shortfall_by_tier
    return UnifiedPlan(
        levels=problem.plan_levels(),
        classes=problem.classes,
        tiers=tuple(tiers),
        paths=tuple(path_ids),
        path_strategy={g.path.id: g.path.strategy for g in groups},
        counts=counts,
        assignment=dict(out.assignment),
        level_assignment=split_levels(problem, out.assignment, acc.level_load, path_ids),
        routing=acc.routing,
        thresholds=thresholds,
        deferral=deferral,
        batch_sizes=batch,
        loads={pools[mm]: float(acc.pool_load[mm]) for mm in range(len(pools))},
        level_loads=acc.level_load,
        demand_qpm=float(problem.demand_qpm),
        planned_qpm=planned_tier,
        shortfall_qpm=float(np.sum(short_tier)),
        shortfall_by_tier={tiers[t]: float(short_tier[t]) for t in range(len(tiers))},
        saturated=bool(out.saturated),
        objective=float(acc.objective),
        expected_quality=float(acc.quality / acc.total) if acc.total > EPS else 0.0,
        goodput=goodput,
        switch_cost=float(out.switch_cost),
        moved_workers=int(out.moved),
        solve_s=time.perf_counter() - t0,
        backend=out.backend,
        formulation=out.formulation,
        nodes=int(out.nodes),
        headroom=float(max((t.headroom for t in problem.tiers), default=1.0)),
        notes=tuple(out.notes),
    )


def split_levels(
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
