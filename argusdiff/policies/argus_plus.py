"""argus+: ARGUS plus four additions, each switchable for the ablation.

* ``admission`` — deadline-aware routing (after TetriServe's "definitely late" test) on the one
  deadline model (:mod:`argusdiff.deadline`): when the PASM's level, on the first of its serving
  workers to free, would finish after the request's deadline (``arrival + deadline_factor × SLO``,
  the factor admission judges by), the request moves to the nearest faster level that still meets
  it; a request no level can finish in time is served best-effort at the fastest level on the
  worker that frees first. The assignment carries the verdict (:class:`~argusdiff.domain.DeadlineVerdict`),
  which admission takes as its test.
* ``backlog`` — backlog-aware planning: the demand the allocation plans for is the predicted
  arrival rate plus the rate needed to drain, within one period, the requests waiting behind the
  one each worker has in service.
* ``measured`` — latencies learned online (:mod:`argusdiff.latency`): the plan sizes capacity with
  each level's measured batch time (the profile as the prior) and publishes it with the plan
  (``Plan.latency_scale``), which the routing and admission then judge deadlines with.
* ``checks`` — re-planning inside the control period: every closed bin of the demand predictor
  (``Policy.check_s``: the default ``peak`` reading's 10 s) the control path shows the policy the
  period so far (:attr:`~argusdiff.domain.PlanTrigger.CHECK`); when the predictor, had the period
  ended now, would read a demand outside ``replan_band`` of the one the current plan was made for
  (plus one request per bin: the count's own noise), argus+ re-plans at once on that reading (a
  burst's first bin, not its next minute); else it keeps its plan. The predictor still observes
  each period once, at its end, so a period's plan reads what a check's plan read.
* ``switch_aware`` — switch-cost-aware allocation: the allocation keeps the current worker→level
  mapping unless moving workers gains more than 2% expected quality (ARGUS re-solves from scratch:
  0.5% tolerance); this only matters where levels need different models (SM).

On a deployment profile that lists light→heavy pairs next to its other levels (``[[cascades]]``,
e.g. ``unified-a100``), argus+ plans every path in one unified plan (:mod:`argusdiff.policies.unified`,
:mod:`solver.unified`): AC levels, smaller models and cascades, their thresholds and the workers
per model chosen jointly, per SLO tier (``tiers``), and routes deferrals with ``route_heavy``. The
``paths`` option restricts the path kinds (the ablation rows). Other profiles keep the ladder
planning above.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from argusdiff.deadline import deadline_s, earliest_finish, moved_by_deadline
from argusdiff.domain import (
    Assignment,
    ClusterStats,
    DeadlineVerdict,
    Plan,
    PlanTrigger,
    Request,
    RouteReason,
    Strategy,
    Timeliness,
)
from argusdiff.latency import scaled_profile
from argusdiff.policies.argus import Argus, ArgusOptions, ArgusRouting
from argusdiff.policies.base import PolicyError, RouteView, frozen_init, require, select_worker
from argusdiff.policies.mixed import is_mixed, miss_fallback, needs_cache
from argusdiff.policies.state import import_mapping
from argusdiff.policies.unified import STRATEGY_NAMES, UnifiedRouting, tier_mix, unified_plan
from cache.policy import k_for_similarity
from solver.allocate import allocate
from solver.paths import DEFAULT_TIER_DEADLINE

__all__ = ["ArgusPlus", "ArgusPlusOptions", "LadderRouting", "MixedLadderRouting"]


@dataclass(frozen=True, kw_only=True)
class ArgusPlusOptions(ArgusOptions):
    """ARGUS's options plus argus+'s parts (each an ablation switch: ``admission``,
    ``switch_aware``, ``backlog``) and, on a deployment profile with several kinds of path
    (:mod:`solver.unified`), the unified plan's: the path kinds it may plan (``paths``: "ac", "sm",
    "cascade"; None: every path the profile lists), whether it plans and routes per SLO tier
    (``tiers``), the tiers' weights in the objective and deadline multipliers (None: the
    simulator's defaults, ``solver.paths.DEFAULT_TIER_DEADLINE``), the quality model profiled
    offline (``class_quality``: per class, i.e. optimal level, the relative quality at each level;
    ``cascade_tables``: per cascade light level its f_c(t) and the kept light images' quality per
    class and threshold; None: ``solver.paths.class_quality_model`` and
    ``solver.paths.ranked_deferral``), the interactive tier's burst headroom over the predictor's
    margin when lower tiers share the cluster (``first_tier_headroom``) and the threshold grid
    (``threshold_points`` points of each f(t) grid; None: all).
    """

    admission: bool = True
    switch_aware: bool = True
    backlog: bool = False
    paths: tuple[str, ...] | None = None
    tiers: bool = True
    tier_weights: Mapping[str, float] | None = None
    tier_slo: Mapping[str, float] | None = None
    class_quality: Any = None
    cascade_tables: Any = None
    first_tier_headroom: float = 2.0
    threshold_points: int | None = 21
    measured: bool = True
    pooled: bool = True
    checks: bool = True
    replan_band: float = 0.25

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.paths is not None:
            bad = sorted(set(self.paths) - set(STRATEGY_NAMES))
            if bad or not self.paths:
                raise PolicyError(f"option paths: choose among ac, sm, cascade, got {list(self.paths)}")
        require("first_tier_headroom", self.first_tier_headroom, lambda v: v > 0, "> 0")
        require("replan_band", self.replan_band, lambda v: v > 0, "> 0")
        if self.threshold_points is not None:
            ok = lambda v: isinstance(v, int) and v >= 2  # noqa: E731
            require("threshold_points", self.threshold_points, ok, "an integer >= 2 (or None: every point)")


class ArgusPlus(Argus, name="argus+", family="ac"):
    summary = "ARGUS + deadline-aware admission, switch-cost- and backlog-aware planning"
    options_type = ArgusPlusOptions
    options: ArgusPlusOptions
    uses_cache_similarity = True  # AC and mixed plans: is a fast AC level a hit for this prompt?
    plans_unified = True
    plans_mixed = True
    # each part switched off in turn (docs/policies.md, "argus+")
    ablations = MappingProxyType(
        {
            "-admission": {"admission": False},
            "+backlog": {"backlog": True},
            "-switch": {"switch_aware": False},
            "-pooled": {"pooled": False},
            "-measured": {"measured": False},
            "-checks": {"checks": False},
        }
    )
    # the unified plan with one kind of path (or the tiers) taken away
    path_ablations = MappingProxyType(
        {
            "-cascades": {"paths": ("ac", "sm")},
            "-AC": {"paths": ("sm", "cascade")},
            "-SM": {"paths": ("ac", "cascade")},
            # the system without tier awareness: the plan, and the simulated queues and admission
            # (``sim``: SimConfig fields of the run; the service always pulls by tier)
            "-tiers": {"tiers": False, "sim": {"tier_priority": False}},
            # the plan made once a period only (no look inside it)
            "-checks": {"checks": False},
        }
    )
    _planned: dict[str, str | None] = {}  # noqa: RUF012 - replaced per plan, never mutated

    def setup(self) -> None:
        super().setup()
        profile = self.profile
        self.unified = self.plans_paths(profile)
        self.cascade = self.unified and bool(profile.cascade_specs)  # the simulator hands deferrals back
        self._tiers: dict[str, float] = {}
        self._hit_rate = 1.0
        bin_s = self.predictor_spec.bin_s
        # the predictor's reading can change only when one of its bins closes: look then
        self.check_s = bin_s if self.options.checks and bin_s < self.options.period_s else None
        self._last_plan: Plan | None = None
        self._demand_now: float | None = None  # the demand (QPM, no margin) the last plan was made for
        self._probe = 0.0

    state_scalars = (*Argus.state_scalars, "_hit_rate")

    def export_state(self) -> dict[str, Any]:
        return {**super().export_state(), "_tiers": dict(self._tiers)}

    def import_state(self, data: Mapping[str, Any]) -> list[str]:
        taken = super().import_state(data)
        return [*taken, "_tiers"] if import_mapping(self._tiers, data.get("_tiers")) else taken

    def plans_paths(self, profile) -> bool:
        return self.plans_unified and bool(profile.cascades)

    def plan(self, stats: ClusterStats) -> Plan:
        if stats.reason is PlanTrigger.CHECK and self._last_plan is not None and not self._moved(stats):
            return self._last_plan
        plan = self.routed(self._plan(stats))
        self._last_plan = plan
        return plan

    def _moved(self, stats: ClusterStats) -> bool:
        """Whether demand left the current plan's band (``checks``): the predictor's reading had
        the period ended now (kept for the re-plan) against the demand the plan was made for."""
        self._probe = probe = float(self.demand.peek(stats))
        base = self._demand_now or 0.0
        return abs(probe - base) > self.options.replan_band * base + 60.0 / self.predictor_spec.bin_s

    def _plan(self, stats: ClusterStats) -> Plan:
        if not self.unified:
            plan = self.ladder_plan(stats)
            scale = self._scale(stats)
            if scale:
                plan = dataclasses.replace(plan, latency_scale=scale)
            return self._pool(plan)

        profile = self.profile
        affinity = self.shares_for(profile, stats)
        demand = self.demand_qpm(stats)
        if stats.reason is PlanTrigger.PERIOD:
            self._tiers = tier_mix(self._tiers, stats.tier_arrivals)
            if stats.cache_hit_rate is not None:
                self._hit_rate = float(stats.cache_hit_rate)
        hit_rate = 0.0 if self.cache_degraded(stats) else self._hit_rate
        if not stats.workers:
            return self.no_worker_plan(stats, profile.ids, Strategy.SM, demand)
        return unified_plan(
            self.options,
            profile,
            stats,
            policy=self.name,
            margin=self.predictor_spec.margin,
            slo_s=self.slo_s,
            demand=demand,
            affinity=affinity,
            tiers=self._tiers,
            tier_deadline=self.options.tier_slo or DEFAULT_TIER_DEADLINE,
            hit_rate=hit_rate,
            version=self.next_version(),
            current_thresholds=self._last_plan.thresholds if self._last_plan is not None else None,
        )

    def demand_qpm(self, stats: ClusterStats) -> float:
        """ARGUS's estimate at a period's end; a check's re-plan plans for the check's reading, and
        a re-plan between periods (a model loaded, a worker joined) for the latest of the two."""
        if stats.reason is PlanTrigger.CHECK:
            self._demand_now = predicted = self._probe
        elif stats.reason is PlanTrigger.PERIOD or self._demand_now is None:
            self._demand_now = predicted = super().demand_qpm(stats)
        else:
            predicted = self._demand_now
        if self.options.backlog and self.options.period_s > 0:
            # the requests waiting behind the one each worker has in service
            queued = sum(max(0, q - 1) for q in stats.queue_lengths.values())
            predicted += queued * 60.0 / self.options.period_s
        return predicted

    def _pooled_plan(self, plan: Plan) -> bool:
        """Whether ``plan`` is an AC-ladder plan this policy publishes pooled (``pooled``)."""
        return (
            self.options.pooled
            and plan.strategy is Strategy.AC
            and plan.levels == self.primary.ids
            and not is_mixed(self.primary)
        )

    def _pool(self, plan: Plan) -> Plan:
        """Work-conserving AC (``pooled``): every AC worker holds SD-XL and K is a per-request
        choice, so the plan publishes every worker at the ladder's K = 0 level (the other K levels
        are its siblings, whose queues every worker pulls: ``Plan.unserved_siblings``, in the
        simulator and the service alike) and keeps the allocation's F and PASM for routing. An idle
        worker then takes queued work of any K instead of idling while another K's queue waits.
        The allocation itself is kept (``_planned``) so that the next one moves from it."""
        if not self._pooled_plan(plan):
            self._planned = {}
            return plan
        self._planned = dict(plan.assignment)
        base = {lv: self.primary.ac_base(lv).id for lv in plan.levels}
        pooled = {w: (base[lv] if lv is not None else None) for w, lv in plan.assignment.items()}
        return dataclasses.replace(plan, assignment=pooled, notes=(*plan.notes, "AC workers pooled (work-conserving)"))

    def planned_current(self, profile, stats: ClusterStats) -> dict[str, str | None]:
        if self._planned and profile is self.primary and not self.switching:
            return {w: self._planned.get(w) for w in stats.workers}
        return super().planned_current(profile, stats)

    def make_routing(self, plan: Plan) -> UnifiedRouting | LadderRouting:
        """The plan's immutable routing object, one per mode: :class:`UnifiedRouting` (a unified
        plan), :class:`MixedLadderRouting` (a merged AC+SM ladder: cache misses at AC levels) or
        :class:`LadderRouting` (an AC or smaller-model ladder; a pooled AC plan has every worker at
        every level); built from the plan, the profile and the options, never from mutable state."""
        o = self.options
        if self.unified:
            return UnifiedRouting(plan, self.profile, tiers=o.tiers, admission=o.admission, slo_s=self.slo_s)
        prof = self.profile_of(plan)
        workers = None
        if self._pooled_plan(plan):
            # every level of a pooled plan is served by every worker of the pool
            pool = tuple(w for w, lv in plan.assignment.items() if lv is not None)
            workers = tuple(pool for _ in plan.levels)
        kw = {"prompt_aware": self.uses_classifier, "admission": o.admission, "slo_s": self.slo_s, "workers": workers}
        if is_mixed(prof):
            return MixedLadderRouting(plan, prof, miss_profile=self.primary, **kw)
        return LadderRouting(plan, prof, **kw)

    def _will_pool(self, profile) -> bool:
        return (
            self.options.pooled
            and profile.ids == self.primary.ids
            and profile.strategies == {Strategy.AC}
            and not is_mixed(self.primary)
        )

    def _scale(self, stats: ClusterStats) -> dict[str, float]:
        """The measured latencies this plan is made with (``measured``; else the profile's)."""
        return dict(stats.latency_scale) if self.options.measured else {}

    def allocate(self, profile, stats: ClusterStats, demand: float, margin: float):
        o = self.options
        profile = scaled_profile(profile, self._scale(stats))
        levels = profile.levels
        cache_free = None
        if is_mixed(profile) and self.cache_degraded(stats):
            # mixed ladder with a degraded cache: plan only the levels that need no cache hit (the
            # in-ladder counterpart of ARGUS's AC -> SM switch); the others get no worker and no load
            cache_free = [i for i, lv in enumerate(levels) if not needs_cache(lv)]
            levels = tuple(levels[i] for i in cache_free)
        ids = {lv.id for lv in levels}
        current = {w: (lv if lv in ids else None) for w, lv in self.planned_current(profile, stats).items()}
        alloc = allocate(
            levels,
            list(stats.workers),
            demand,
            current=current,
            formulation=o.formulation,
            backend=o.backend,
            switch_tolerance=max(o.switch_tolerance, 0.02) if o.switch_aware else o.switch_tolerance,
            margin=margin,
            time_limit_s=o.time_limit_s,
            # spare workers form a burst reserve at the fastest level, where deadline-aware
            # routing sends requests that would miss their deadline elsewhere
            # (a pooled plan has none: every worker takes every K, spare capacity goes to the best)
            spare="fastest" if o.admission and not self._will_pool(profile) else "best",
        )
        if cache_free is None:
            return alloc
        n = len(profile.levels)

        def expand(values, zero):
            out = [zero] * n
            for k, i in enumerate(cache_free):
                out[i] = values[k]
            return tuple(out)

        return dataclasses.replace(
            alloc,
            levels=profile.ids,
            counts=expand(alloc.counts, 0),
            share=expand(alloc.share, 0.0),
            loads_qpm=expand(alloc.loads_qpm, 0.0),
        )


class LadderRouting(ArgusRouting):
    """argus+ on an AC or smaller-model ladder, for one plan (immutable): ARGUS's draw and worker
    (:class:`~argusdiff.policies.argus.ArgusRouting`), then, with ``admission``, deadline-aware
    routing: the drawn level when the shared finish estimate (:mod:`argusdiff.deadline`) meets the
    request's deadline, else the nearest faster level that does, else best effort at the fastest
    level this prompt can use; with the verdict. On an AC ladder a request queued at a level
    without workers is served by every worker of the ladder's model (the sibling pull,
    ``Plan.unserved_siblings``), and a cache miss has no faster level than K = 0."""

    #: a ladder has no cascade: a deferral keeps the light image (``Routing.route_heavy``)
    no_heavy_reason = "no heavy level for this light level: light image returned"
    __slots__ = ("ac_ladder", "admission", "serving", "slo_s")

    def __init__(
        self,
        plan: Plan,
        profile,
        *,
        prompt_aware: bool,
        admission: bool,
        slo_s: float,
        workers: tuple[tuple[str, ...], ...] | None = None,
    ) -> None:
        super().__init__(plan, profile, prompt_aware=prompt_aware, workers=workers)
        ac_ladder = self.ac and not isinstance(self, MixedLadderRouting)
        # the workers that take a request queued at each level: its own, else (an AC level without
        # workers) every worker of the ladder's model, which pulls its queue
        serving = tuple(ws if ws or not ac_ladder else self.everyone for ws in self.workers)
        frozen_init(self, ac_ladder=ac_ladder, admission=admission, slo_s=slo_s, serving=serving)

    def hit_ok(self, view: RouteView) -> bool:
        """Whether an AC level runs at its K for this prompt (a healthy cache and a hit)."""
        if not self.ac_ladder:
            return True
        sim = view.cache_similarity
        return view.cache_healthy and sim is not None and k_for_similarity(sim) > 0

    def route(self, request: Request, view: RouteView, rng) -> Assignment:
        a = super().route(request, view, rng)
        if a.level is None or a.worker is None:
            return a
        slo = request.slo_s if request.slo_s is not None else self.slo_s
        deadline = deadline_s(request.arrival_s, slo, view.deadline_factor)
        hit_ok = self.hit_ok(view)
        a = self.on_miss(view, a, hit_ok, deadline)
        if not self.admission:
            return a
        return self.by_deadline(view, a, hit_ok, deadline)

    def on_miss(self, view: RouteView, a: Assignment, hit_ok: bool, deadline: float) -> Assignment:
        """A cache miss at the drawn level (:class:`MixedLadderRouting`); here: ``a``."""
        return a

    def usable(self, k: int, hit_ok: bool) -> bool:
        """Whether level ``k`` runs at its profiled speed for this prompt."""
        return True

    def fastest(self, j: int, hit_ok: bool) -> int:
        """The fastest level with workers this prompt can use (late everywhere: best effort)."""
        if self.ac_ladder:
            return (len(self.levels) - 1) if hit_ok else 0  # a cache miss runs at K = 0 anyway
        return max((i for i in range(len(self.levels)) if self.workers[i]), default=j)

    def by_deadline(self, view: RouteView, a: Assignment, hit_ok: bool, deadline: float) -> Assignment:
        now = view.now_s
        bu = view.busy_until
        lat = self.lat
        j = self.index[a.level]
        w, finish = earliest_finish(self.serving[j], bu, now, lat[j])
        if finish <= deadline:
            return dataclasses.replace(a, worker=w, verdict=DeadlineVerdict(Timeliness.ON_TIME, finish, deadline))
        n = len(self.levels)
        for k in range(j + 1, n):
            if self.ac_ladder and not hit_ok:
                break  # K > 0 would run at K = 0 on a miss: no faster level exists for this prompt
            if not self.usable(k, hit_ok):
                continue
            workers = self.serving[k]
            if not workers:
                continue
            wk, fk = earliest_finish(workers, bu, now, lat[k])
            if fk <= deadline:
                return moved_by_deadline(
                    Timeliness.ESCALATED, self.levels[k], wk, a.optimal_level, fk, deadline, to="a faster level"
                )
        # late on every level: best effort at the fastest level this prompt can use that has
        # workers, on the worker that frees first
        k = self.fastest(j, hit_ok)
        workers = self.serving[k]
        if not workers:
            return dataclasses.replace(a, verdict=DeadlineVerdict(Timeliness.LATE, finish, deadline))
        wk, fk = earliest_finish(workers, bu, now, lat[k])
        return moved_by_deadline(Timeliness.LATE, self.levels[k], wk, a.optimal_level, fk, deadline)


class MixedLadderRouting(LadderRouting):
    """argus+ on a merged AC+SM ladder (:func:`argusdiff.policies.mixed.merged_ladder`), for one
    plan (immutable): :class:`LadderRouting`, plus the cache-miss handling of its AC levels. A
    miss at an AC level stays there (at K = 0 on SD-XL) if that still meets the deadline, else goes
    to the best smaller model no slower than the AC level (``miss_fallback``); on a miss the
    deadline moves and best effort skip the AC levels (which would run at K = 0), and best effort
    takes the fastest usable level (a mixed ladder is not ordered by speed)."""

    __slots__ = ("flags", "k0", "miss")

    def __init__(self, plan: Plan, profile, *, miss_profile, **kw: Any) -> None:
        super().__init__(plan, profile, **kw)
        flags = tuple(needs_cache(profile.level(lv)) for lv in plan.levels)
        with_workers = [bool(ws) for ws in self.workers]
        frozen_init(
            self,
            flags=flags,
            # per level needing a hit: its K = 0 time, and the level a miss there goes to
            k0=tuple(profile.ac_base(lv).latency(1) if f else None for lv, f in zip(plan.levels, flags, strict=True)),
            miss=tuple(
                miss_fallback(miss_profile, lv, with_workers) if f else None
                for lv, f in zip(plan.levels, flags, strict=True)
            ),
        )

    def hit_ok(self, view: RouteView) -> bool:
        sim = view.cache_similarity
        return view.cache_healthy and sim is not None and k_for_similarity(sim) > 0

    def on_miss(self, view: RouteView, a: Assignment, hit_ok: bool, deadline: float) -> Assignment:
        i = self.index[a.level]
        if hit_ok or not self.flags[i]:
            return a
        now = view.now_s
        if max(now, view.busy_until.get(a.worker, now)) + self.k0[i] <= deadline:
            return a
        k = self.miss[i]
        if k is None:
            return a
        return Assignment(
            level=self.levels[k],
            worker=select_worker(self.workers[k], view, self.lat[k]),
            optimal_level=a.optimal_level,
            reason="cache miss: smaller model",
            cause=RouteReason.CACHE_MISS,
        )

    def usable(self, k: int, hit_ok: bool) -> bool:
        return hit_ok or not self.flags[k]  # an AC level would run at K = 0 on a miss

    def fastest(self, j: int, hit_ok: bool) -> int:
        usable = [i for i in range(len(self.levels)) if self.workers[i] and (hit_ok or not self.flags[i])]
        return min(usable, key=lambda i: (self.lat[i], -i), default=j)
