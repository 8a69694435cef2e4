"""argus+ over every path of a deployment profile: one plan for approximate caching, smaller
models and light→heavy cascades together, per SLO tier (:mod:`solver.unified`, docs/solver.md).

Control path, every period (:func:`unified_plan`): the shared demand predictor's estimate (plus
the backlog's drain rate) with the predictor's margin as burst headroom on every tier, the affinity
histogram H of the classifier's optimal levels, the tier mix of recent arrivals (Nitsum tiers:
interactive capacity is reserved first), the observed cache hit rate (an AC level's misses run at
K = 0), the workers' current and resident models (switch costs) go into
:func:`solver.paths.problem_from_profile`; :func:`solver.unified.plan_unified` picks integer
workers per model, each cascade's threshold on its profiled f(t) grid and routing shares from
each class to each path, jointly. The result is an ordinary :class:`~argusdiff.domain.Plan`: the
PASM over all tiers, one PASM per tier (``Plan.tier_pasm``), thresholds keyed by light level and
each light level's heavy level (``Plan.cascades``).

Data path (:class:`UnifiedRouting`): a level drawn from the request's tier's PASM row of its
predicted optimal level; the worker among those holding that level's model with the smallest
queue length × processing time (ARGUS §4.4; levels of one model share their workers); with
admission, a request that would finish after its deadline moves to the best level (for its class)
that meets it, else runs best-effort where it finishes first. A deferral (``route_heavy``) goes to
the pair's heavy level on a worker holding the heavy model, or keeps the light image when no such
worker is planned or the heavy run would miss the deadline.
"""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_right
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from argusdiff.deadline import deadline_s, earliest_finish, moved_by_deadline
from argusdiff.domain import (
    Assignment,
    ClusterStats,
    DeadlineVerdict,
    Outcome,
    Plan,
    Profile,
    Request,
    RouteReason,
    Strategy,
    Tier,
    Timeliness,
)
from argusdiff.latency import scaled_profile
from argusdiff.policies.base import RouteView, Routing, frozen_init, select_worker
from cache.policy import k_for_similarity
from solver.paths import TierSpec, class_quality_model, nitsum_tiers, problem_from_profile, ranked_deferral
from solver.unified import plan_unified, restrict

__all__ = ["STRATEGY_NAMES", "UnifiedOptions", "UnifiedRouting", "tier_mix", "unified_plan"]

#: names of the path kinds the ``paths`` option selects (ablations: argus+ without one of them)
STRATEGY_NAMES = {"ac": Strategy.AC, "sm": Strategy.SM, "cascade": Strategy.CASCADE}
TIER_DECAY = 0.5  # weight of the older tier mix when a period's arrivals are added
#: the unified plan's formulation (not Eq. 1's: the policy's ``formulation`` option does not apply
#: to it): the MILP; with per-class profiled f_c(t) tables the exact search's threshold intervals
#: prune little (docs/solver.md, "In argus+")
UNIFIED_FORMULATION = "milp"


def _first(tier: str, tiers: Mapping[str, float]) -> bool:
    """Whether ``tier`` is the interactive tier of a mix with lower tiers behind it (the tier whose
    capacity is reserved first; a mix of one tier reserves nothing)."""
    return tier == Tier.INTERACTIVE.value and len(tiers) > 1


def grid_points(n: int, points: int | None) -> tuple[int, ...]:
    """Indices of about ``points`` evenly spaced points of an n-point threshold grid, both ends kept
    (None or ``points`` >= n: every point)."""
    if points is None or points >= n:
        return tuple(range(n))
    step = max(1, math.ceil((n - 1) / max(1, points - 1)))
    idx = list(range(0, n, step))
    if idx[-1] != n - 1:
        idx.append(n - 1)
    return tuple(idx)


def _on_grid(spec, idx: tuple[int, ...]):
    if len(idx) == len(spec.thresholds):
        return spec
    return dataclasses.replace(
        spec,
        thresholds=tuple(spec.thresholds[i] for i in idx),
        deferral=tuple(spec.deferral[i] for i in idx),
        quality=None if spec.quality is None else tuple(spec.quality[i] for i in idx),
    )


#: the cascade specs and tables on the planned grid, per (profile, tables, points): they are the
#: same every period (keyed by identity; the objects are held so that an id is not reused)
_GRIDS: dict[tuple[int, int, int | None], tuple[Any, Any, list, Any]] = {}


def _cascade_grid(profile: Profile, cascade_tables: Any, points: int | None) -> tuple[list, Any]:
    """The profile's cascade specs on about ``points`` points of their threshold grids, and their
    f_c(t) tables there (``cascade_tables`` when given, else :func:`ranked_deferral`'s)."""
    key = (id(profile), id(cascade_tables), points)
    got = _GRIDS.get(key)
    if got is not None and got[0] is profile and got[1] is cascade_tables:
        return got[2], got[3]
    keep = {c.light: grid_points(len(c.thresholds), points) for c in profile.cascade_specs}
    specs = [_on_grid(c, keep[c.light]) for c in profile.cascade_specs]
    tables = cascade_tables if cascade_tables is not None else (ranked_deferral(profile, specs) if specs else None)
    if cascade_tables is not None:
        tables = {
            light: tuple(tuple(tuple(row[i] for i in keep[light]) for row in t) for t in pair)
            for light, pair in tables.items()
            if light in keep
        }
    if len(_GRIDS) >= 16:
        _GRIDS.clear()
    _GRIDS[key] = (profile, cascade_tables, specs, tables)
    return specs, tables


def tier_mix(previous: Mapping[str, float], arrivals: Mapping[str, int]) -> dict[str, float]:
    """The tier mix (shares) after a period: the older mix decayed by :data:`TIER_DECAY` plus the
    period's arrivals per tier."""
    total = sum(arrivals.values())
    if total <= 0:
        return dict(previous)
    new = {t: c / total for t, c in arrivals.items() if c > 0}
    if not previous:
        return new
    # tiers in sorted order: a set's order of strings follows PYTHONHASHSEED, and the sum below (the
    # shares the planner reads) would change in its last bit with it
    out = {t: TIER_DECAY * previous.get(t, 0.0) + (1 - TIER_DECAY) * new.get(t, 0.0) for t in sorted({*previous, *new})}
    s = sum(out.values())
    return {t: v / s for t, v in out.items() if v > 1e-6}


class UnifiedOptions(Protocol):
    """The options :func:`unified_plan` reads: argus+'s
    (:class:`~argusdiff.policies.argus_plus.ArgusPlusOptions`, which documents them), the path
    kinds, the tiers, the offline quality model, the threshold grid, whether the plan uses
    measured latencies, and the solver's knobs."""

    @property
    def paths(self) -> tuple[str, ...] | None: ...
    @property
    def tiers(self) -> bool: ...
    @property
    def tier_weights(self) -> Mapping[str, float] | None: ...
    @property
    def first_tier_headroom(self) -> float: ...
    @property
    def class_quality(self) -> Any: ...
    @property
    def cascade_tables(self) -> Any: ...
    @property
    def threshold_points(self) -> int | None: ...
    @property
    def measured(self) -> bool: ...
    @property
    def backend(self) -> str: ...
    @property
    def switch_aware(self) -> bool: ...
    @property
    def switch_tolerance(self) -> float: ...
    @property
    def time_limit_s(self) -> float: ...


def unified_plan(
    options: UnifiedOptions,
    profile: Profile,
    stats: ClusterStats,
    *,
    policy: str,
    margin: float,
    slo_s: float,
    demand: float,
    affinity: tuple[float, ...],
    tiers: Mapping[str, float],
    tier_deadline: Mapping[str, float],
    hit_rate: float,
    version: int,
    current_thresholds: Mapping[str, float] | None = None,
) -> Plan:
    """The unified plan of ``profile`` (a profile with several kinds of path) for ``stats``, made
    with ``options`` for the policy named ``policy``: ``margin`` is the predictor's burst headroom
    on every tier, ``slo_s`` the SLO of untiered requests, ``demand`` the demand to plan for (QPM,
    before the margin), ``affinity`` the shares of H, ``tiers`` the tier mix, ``tier_deadline`` the
    tiers' deadline multipliers, ``hit_rate`` the cache hit rate an AC path plans with,
    ``current_thresholds`` the running plan's cascade thresholds (``Plan.thresholds``: with the
    workers' current models, a plan the planner may keep, :func:`solver.unified.plan_unified`)."""

    o = options
    margin = float(margin)
    specs, tables = _cascade_grid(profile, o.cascade_tables, o.threshold_points)
    ids = set(profile.ids)
    current = {w: (lv if lv in ids else None) for w, lv in stats.current.items() if w in set(stats.workers)}
    models = {lv.model for lv in profile.levels}
    resident = {w: tuple(m for m in ms if m in models) for w, ms in stats.resident.items()}
    slo = float(slo_s)
    if o.tiers and tiers:
        tier_specs = nitsum_tiers(
            slo,
            tiers,
            deadline_factor=dict(tier_deadline),
            weight=dict(o.tier_weights or {}),
            headroom={t: margin * (o.first_tier_headroom if _first(t, tiers) else 1.0) for t in tiers},
        )
    else:
        tier_specs = (TierSpec(Tier.STANDARD.value, 1.0, slo, 1.0, margin),)
    scale = dict(stats.latency_scale) if o.measured else {}
    problem = problem_from_profile(
        scaled_profile(profile, scale),
        list(stats.workers),
        demand,
        cascades=specs,
        affinity=affinity,
        current=current,
        resident=resident,
        current_thresholds=current_thresholds,
        tiers=tier_specs,
        hit_rate=hit_rate,
        class_quality=o.class_quality,
        cascade_tables=tables,
        cache_latency_s=float(stats.cache_latency_s or 0.0),
    )
    if o.paths is not None:
        problem = restrict(problem, {STRATEGY_NAMES[s] for s in o.paths})
    up = plan_unified(
        problem,
        formulation=UNIFIED_FORMULATION,
        backend=o.backend,
        switch_tolerance=max(o.switch_tolerance, 0.02) if o.switch_aware else o.switch_tolerance,
        time_limit_s=o.time_limit_s,
    )
    plan = up.to_plan(version=version, created_s=stats.now_s, policy=policy)
    reserved = reserve_workers(problem, up) if len(up.tiers) > 1 else {}
    routed = {p for p in problem.paths if p.is_cascade}
    cascades = {p.id: p.heavy.level for p in routed if p.heavy is not None}
    tier_pasm = {t: up.pasm(t) for t in up.tiers} if len(up.tiers) > 1 else {}
    # a model's workers serve every level of it: publish them at the model's cache-miss level (AC:
    # K = 0; other models: their one level), so the AC levels of one model are siblings without
    # workers of their own and every worker of the model pulls their queues (Plan.unserved_siblings)
    base = {lv: profile.ac_base(lv).id for lv in set(plan.assignment.values()) if lv is not None}
    pooled = {w: (base[lv] if lv is not None else None) for w, lv in plan.assignment.items()}
    plan = dataclasses.replace(
        plan,
        assignment=pooled,
        predicted_qpm=float(demand),
        margin=margin,
        tier_pasm=tier_pasm,
        cascades=cascades,
        reserved=reserved,
        latency_scale=scale,
        notes=(*plan.notes, f"unified plan over {len(problem.paths)} paths, {up.solve_s * 1000:.1f} ms"),
    )
    plan.validate()
    return plan


def tier_pool_loads(problem, up) -> dict[str, dict[str, float]]:
    """Worker-seconds per minute each tier's planned flows put on each pool (model)."""
    paths = {p.id: p for p in problem.paths}
    cls = {c: i for i, c in enumerate(problem.classes)}
    out: dict[str, dict[str, float]] = {}
    for (tier, c), flows in up.routing.items():
        loads = out.setdefault(tier, {})
        ci = cls[c]
        for pid, x in flows.items():
            p = paths[pid]
            use: list[tuple[str, float]] = []
            if p.miss is not None:
                use += [
                    (p.stage.pool, p.hit_rate * p.stage.service_s),
                    (p.miss.pool, (1 - p.hit_rate) * p.miss.service_s),
                ]
            else:
                use.append((p.stage.pool, p.stage.service_s))
            if p.heavy is not None:
                k = p.thresholds.index(up.thresholds[pid]) if up.thresholds.get(pid) in p.thresholds else 0
                row = p.deferral[ci] if len(p.deferral) > 1 else p.deferral[0]
                use.append((p.heavy.pool, row[k] * p.heavy.service_s))
            for pool, u in use:
                loads[pool] = loads.get(pool, 0.0) + x * u
    return out


def reserve_workers(problem, up) -> dict[str, str]:
    """Workers reserved for the first (highest-priority) tier: in each pool, as many as that tier's
    planned load (headroom included) needs, leaving at least one worker to the other tiers where
    they have load on that pool."""
    first = up.tiers[0]
    loads = tier_pool_loads(problem, up)
    mine = loads.get(first, {})
    others = {pool for t, ls in loads.items() if t != first for pool, v in ls.items() if v > 1e-9}
    by_pool: dict[str, list[str]] = {}
    for w in sorted(problem.workers):
        pool = up.assignment.get(w)
        if pool is not None:
            by_pool.setdefault(pool, []).append(w)
    out: dict[str, str] = {}
    for pool, ws in by_pool.items():
        need = math.ceil(mine.get(pool, 0.0) / 60.0 - 1e-9)
        if pool in others:
            need = min(need, len(ws) - 1)
        for w in ws[: max(0, need)]:
            out[w] = first
    return out


class UnifiedRouting(Routing):
    """The unified data path for one plan (see the module doc), immutable: cumulative PASM rows per
    tier, the workers that hold each level's model (per tier: not those reserved for another),
    each level's latency and the class-quality order of the levels, and the options the routing
    needs (``tiers``: route by the request's tier; ``admission``: argus+'s deadline-aware routing;
    ``slo_s``: the SLO of a request without one). Built once per plan from the plan and the
    profile; never reads the policy."""

    __slots__ = (
        "admission",
        "cascades",
        "cum",
        "index",
        "k0",
        "lat",
        "levels",
        "needs_hit",
        "pool",
        "quality",
        "reserved",
        "slo_s",
        "tier_cum",
        "tier_pool",
        "tiers",
        "unreserved",
    )

    def __init__(self, plan: Plan, profile: Profile, *, tiers: bool, admission: bool, slo_s: float) -> None:
        index = {lv: i for i, lv in enumerate(plan.levels)}
        lvls = [profile.level(lv) for lv in plan.levels]
        by_model: dict[str, list[str]] = {}
        for w, lv in plan.assignment.items():
            if lv is not None and lv in index:
                by_model.setdefault(profile.level(lv).model, []).append(w)
        pool = tuple(tuple(by_model.get(lv.model, ())) for lv in lvls)
        # per tier: the workers its requests may use (not those reserved for another tier); a tier
        # the plan does not name may use the workers reserved for none
        reserved = dict(plan.reserved)
        tier_pool = {
            t: tuple(tuple(w for w in ws if reserved.get(w, t) == t) for ws in pool)
            for t in sorted({*reserved.values(), *plan.tier_pasm})
        }
        disc = {c.light: c.discriminator_latency_s for c in profile.cascade_specs}
        scale = plan.latency_scale  # the measured latencies the plan was made with (argusdiff.latency)
        # per class: quality of each plan level (the planner's model); ties go to the faster level
        full = class_quality_model(profile.levels)
        pos = {lv: i for i, lv in enumerate(profile.ids)}
        frozen_init(
            self,
            levels=plan.levels,
            index=index,
            cascades=plan.cascades,
            pool=pool,
            reserved=reserved,
            tier_pool=tier_pool,
            unreserved=tuple(tuple(w for w in ws if w not in reserved) for ws in pool),
            lat=tuple(lv.latency(1) * scale.get(lv.id, 1.0) + disc.get(lv.id, 0.0) for lv in lvls),
            needs_hit=tuple(lv.strategy is Strategy.AC and lv.skip > 0 for lv in lvls),
            k0=tuple(profile.ac_base(lv.id).latency(1) * scale.get(profile.ac_base(lv.id).id, 1.0) for lv in lvls),
            # cumulative PASM rows as Python floats: a draw bisects them (numpy's cumsum, then
            # bisect_right finds what searchsorted(side="right") finds, without its per-call overhead)
            cum=tuple(tuple(np.cumsum(row).tolist()) for row in plan.pasm),
            tier_cum={t: tuple(tuple(np.cumsum(row).tolist()) for row in rows) for t, rows in plan.tier_pasm.items()},
            quality=tuple(
                tuple(full[pos[c]][pos[lv]] for lv in plan.levels) if c in pos else (1.0,) * len(plan.levels)
                for c in plan.levels
            ),
            tiers=tiers,
            admission=admission,
            slo_s=slo_s,
        )

    def pools(self, tier: str | None) -> tuple[tuple[str, ...], ...]:
        """Workers per level that a request of ``tier`` may use (None: tier-unaware, every worker)."""
        if tier is None or not self.reserved:
            return self.pool
        return self.tier_pool.get(tier, self.unreserved)

    def draw(self, row: int, tier: str | None, u: float) -> int:
        cum = self.tier_cum.get(tier, self.cum)[row] if tier is not None else self.cum[row]
        j = bisect_right(cum, u * cum[-1]) if cum[-1] > 0 else row
        j = min(j, len(self.levels) - 1)
        pool = self.pools(tier)
        if pool[j]:
            return j
        served = [k for k in range(len(self.levels)) if pool[k]]
        if not served:
            return j
        q = self.quality[row]
        return min(served, key=lambda k: (-q[k], self.lat[k]))

    def latency(self, k: int, hit_ok: bool) -> float:
        return self.lat[k] if hit_ok or not self.needs_hit[k] else self.k0[k]

    def route(self, request: Request, view: RouteView, rng: np.random.Generator) -> Assignment:
        """One request (see the module doc): the path drawn from the plan (one uniform from
        ``rng``); with ``admission`` (argus+'s deadline-aware routing) judged by the shared finish
        estimate (:mod:`argusdiff.deadline`: the first free worker of the path's pool) against the
        request's deadline, moved to the best path on time when it is late, and its verdict returned."""
        row = self.index.get(view.optimal_level, 0) if view.optimal_level is not None else 0
        tier = str(request.tier) if self.tiers else None
        j = self.draw(row, tier, rng.random())
        pool = self.pools(tier)
        if not pool[j]:
            return Assignment(
                level=self.levels[j], worker=None, reason="no worker in the plan", cause=RouteReason.NO_WORKER
            )
        hit_ok = True
        if any(self.needs_hit):
            sim = view.cache_similarity
            hit_ok = view.cache_healthy and sim is not None and k_for_similarity(sim) > 0
        now = view.now_s
        bu = view.busy_until
        lat_j = self.latency(j, hit_ok)
        if not self.admission:
            w = select_worker(pool[j], view, lat_j)
            return Assignment(level=self.levels[j], worker=w, optimal_level=view.optimal_level)
        slo = request.slo_s if (self.tiers and request.slo_s is not None) else self.slo_s
        deadline = deadline_s(request.arrival_s, slo, view.deadline_factor)
        w, finish_j = earliest_finish(pool[j], bu, now, lat_j)
        if finish_j <= deadline:
            return Assignment(
                level=self.levels[j],
                worker=w,
                optimal_level=view.optimal_level,
                verdict=DeadlineVerdict(Timeliness.ON_TIME, finish_j, deadline),
            )
        q = self.quality[row]
        best: tuple | None = None
        first: tuple | None = None
        for k in range(len(self.levels)):
            if not pool[k] or k == j:
                continue
            wk, finish = earliest_finish(pool[k], bu, now, self.latency(k, hit_ok))
            if finish <= deadline:
                key = (-q[k], finish)
                if best is None or key < best[0]:
                    best = (key, k, wk, finish)
            if first is None or finish < first[0]:
                first = (finish, k, wk)
        if best is not None:
            _, k, wk, finish = best
            return moved_by_deadline(Timeliness.ESCALATED, self.levels[k], wk, view.optimal_level, finish, deadline)
        # late on every path: best effort on the path that finishes first (its own on a tie)
        finish, k, wk = (finish_j, j, w) if first is None or finish_j <= first[0] else first
        return moved_by_deadline(Timeliness.LATE, self.levels[k], wk, view.optimal_level, finish, deadline)

    def route_heavy(self, request: Request, view: RouteView) -> Assignment:
        """A deferral: the pair's heavy level, or ``level=None`` (the light image is returned)."""
        light = view.deferred_from
        if light is None and len(self.cascades) == 1:
            light = next(iter(self.cascades))
        heavy = self.cascades.get(light) if light is not None else None
        if heavy is None or heavy not in self.index:
            return Assignment(
                level=None,
                reason="no heavy level for this light level: light image returned",
                outcome=Outcome.KEPT,
                cause=RouteReason.NO_HEAVY,
            )
        k = self.index[heavy]
        pool = self.pools(str(request.tier) if self.tiers else None)[k]
        if not pool:
            return Assignment(
                level=None,
                reason="no heavy worker: light image returned",
                outcome=Outcome.KEPT,
                cause=RouteReason.NO_HEAVY,
            )
        if not self.admission:
            return Assignment(level=heavy, worker=select_worker(pool, view, self.lat[k]))
        slo = request.slo_s if (self.tiers and request.slo_s is not None) else self.slo_s
        deadline = deadline_s(request.arrival_s, slo, view.deadline_factor)
        w, finish = earliest_finish(pool, view.busy_until, view.now_s, self.lat[k])
        if finish > deadline:
            return Assignment(
                level=None,
                reason="the heavy run would miss the deadline: light image returned",
                outcome=Outcome.KEPT,
                cause=RouteReason.HEAVY_LATE,
            )
        return Assignment(level=heavy, worker=w, verdict=DeadlineVerdict(Timeliness.ON_TIME, finish, deadline))
