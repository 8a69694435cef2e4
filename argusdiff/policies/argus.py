"""ARGUS (Middleware '25) and PAC, its prompt-agnostic ablation.

Control path, every period: predict demand W_t (the policy's demand predictor,
:mod:`argusdiff.predictors`; ARGUS §4.2 says only "using the past workload"), solve the allocation
ILP (Eq. 1) over the active strategy's levels, and turn the affinity histogram H (the classifier's
optimal levels of recent prompts) and the allocation's load shares F into the PASM with ODA
(Algorithm 1). Data path, per request: the prompt's predicted optimal level v, a level v' drawn
from PASM row v, and the worker at v' with the smallest queue length × processing time (§4.4).

AC↔SM switch (§4.6): the default strategy is approximate caching. When cache retrieval degrades
(median latency above a limit or failed lookups above a rate):

1. requests are served at K = 0 at once on the SD-XL model every worker has loaded (no downtime);
2. the allocation is solved over the smaller-model ladder with a 1.5× capacity margin; each
   worker whose planned model is not loaded keeps serving SD-XL at K = 0 (the ladder's level of
   the same model) and loads its small model *alongside* (``Plan.preload``: two models fit in an
   A100's 80 GB);
3. as each model finishes loading the policy re-solves (``replans_on_load``) and moves that
   worker to its small model; SD-XL is no longer kept once every worker has switched.

Background probes move the plan back to AC after the cache has been healthy for
``probe_periods`` periods: SD-XL is loaded on every worker alongside the small models first, and
the plan switches once it is ready everywhere (§4.6: "all large models ... are loaded almost in
parallel", a full transition). A worker whose background load is not reported within its load
time plus one period is moved anyway (its load then happens in the foreground).

PAC is ARGUS without the classifier and ODA: every PASM row equals F, so a prompt goes to a level
drawn from the allocation's shares regardless of what it needs. It keeps the AC↔SM switch (ARGUS
§5.1: "it still uses the logic to determine the best approximation strategy between AC and SM").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from argusdiff.domain import Assignment, ClusterStats, Plan, PlanTrigger, Profile, Request, RouteReason, Strategy
from argusdiff.policies.base import (
    CommonOptions,
    PlanRouting,
    Policy,
    PolicyError,
    RouteView,
    frozen_init,
    require,
    select_worker,
    uniform_pasm,
)
from argusdiff.policies.state import export_histograms, export_scalars, import_histograms, import_scalars
from argusdiff.predictors import AffinityHistogram
from solver import DEFAULT_FORMULATION
from solver.allocate import allocate
from solver.oda import oda

__all__ = ["Argus", "ArgusOptions", "ArgusRouting", "Pac", "capacity_share"]


@dataclass(frozen=True, kw_only=True)
class ArgusOptions(CommonOptions):
    """Options of ARGUS and PAC (and Proteus, which plans as PAC does).

    ``affinity_window``: classified prompts in the affinity histogram H; the solver knobs
    (``formulation``, ``backend``, ``switch_tolerance``, ``time_limit_s``) go to
    :func:`solver.allocate.allocate`; ``fallback``: the smaller-model profile ARGUS switches to when
    the cache degrades (§4.6), ``cache_latency_limit_s`` / ``cache_error_limit`` say when it is
    degraded, ``switch_margin`` is the capacity margin while switching and ``probe_periods`` the
    healthy periods seen by background probes before switching back.
    """

    affinity_window: int = 1000
    formulation: str = DEFAULT_FORMULATION
    backend: str = "auto"
    switch_tolerance: float = 0.005
    time_limit_s: float = 5.0
    fallback: Profile | None = None  # ARGUS §4.6: SM levels to switch to when the cache degrades
    cache_latency_limit_s: float = 0.5  # median retrieval latency above this counts as degraded
    cache_error_limit: float = 0.05  # share of failed lookups above this counts as degraded
    switch_margin: float = 1.5  # ARGUS §4.6: capacity margin while switching AC -> SM
    probe_periods: int = 1  # healthy periods seen by background probes before switching back

    def __post_init__(self) -> None:
        super().__post_init__()
        require("affinity_window", self.affinity_window, lambda v: isinstance(v, int) and v >= 1, "an integer >= 1")
        require("switch_tolerance", self.switch_tolerance, lambda v: 0.0 <= v <= 1.0, "in [0, 1]")
        require("time_limit_s", self.time_limit_s, lambda v: v > 0, "> 0")
        require("cache_latency_limit_s", self.cache_latency_limit_s, lambda v: v >= 0, ">= 0")
        require("cache_error_limit", self.cache_error_limit, lambda v: 0.0 <= v <= 1.0, "in [0, 1]")
        require("switch_margin", self.switch_margin, lambda v: v >= 1.0, ">= 1")
        require("probe_periods", self.probe_periods, lambda v: isinstance(v, int) and v >= 0, "an integer >= 0")
        if self.fallback is not None and not isinstance(self.fallback, Profile):
            raise PolicyError(f"policy option fallback: must be a Profile, got {type(self.fallback).__name__}")


def capacity_share(profile: Profile, assignment: Mapping[str, str | None]) -> tuple[float, ...]:
    """F(v) for an assignment not from the solver: each level's share of the assigned capacity."""
    cap = [0.0] * len(profile.levels)
    index = {lv: i for i, lv in enumerate(profile.ids)}
    for lv in assignment.values():
        if lv in index:
            cap[index[lv]] += profile.levels[index[lv]].peak_qpm
    total = sum(cap)
    if total <= 0:
        return tuple(1.0 / len(cap) for _ in cap)
    return tuple(c / total for c in cap)


class Argus(Policy, name="argus", family="ac"):
    summary = "classifier -> PASM (ODA) -> worker selector; AC, to SM when the cache degrades"
    options_type = ArgusOptions
    options: ArgusOptions
    uses_classifier = True
    replans_on_load = True  # §4.6: re-solve as soon as a small model finishes loading
    uses_fallback = True
    source_predictor = "argus-paper"

    def setup(self) -> None:
        profile = self.profile
        if Strategy.CASCADE in profile.strategies and not self.cascade_as_ladder and not self.plans_paths(profile):
            raise PolicyError(f"policy {self.name!r} needs an AC or SM profile, got cascade profile {profile.name!r}")
        fallback = self.options.fallback
        if fallback is not None and Strategy.CASCADE in fallback.strategies:
            raise PolicyError(f"policy {self.name!r}: the fallback profile must be an SM profile")
        self.primary = profile
        self.fallback = fallback if profile.strategies == {Strategy.AC} else None
        self.active = profile
        self.demand = self.new_demand_predictor()
        self.histograms = {profile.name: AffinityHistogram(profile.ids, self.options.affinity_window)}
        if self.fallback is not None:
            self.histograms[self.fallback.name] = AffinityHistogram(self.fallback.ids, self.options.affinity_window)
        self.healthy_periods = 0
        self.switches_to_sm = 0
        self.switches_to_ac = 0
        # §4.6 transitions in progress: worker -> target level of the new strategy, and when its
        # background load was asked for
        self.switching = False  # AC -> SM: workers move to small models as each finishes loading
        self.returning = False  # SM -> AC: SD-XL loads on every worker before the plan switches
        self.targets: dict[str, str] = {}
        self.requested: dict[str, float] = {}

    def known_profiles(self) -> tuple[Profile, ...]:
        return tuple(p for p in (self.profile, self.options.fallback) if p is not None)

    #: plain numeric state a successor continues (the AC<->SM switch's counters)
    state_scalars: tuple[str, ...] = ("healthy_periods", "switches_to_sm", "switches_to_ac")

    def export_state(self) -> dict[str, Any]:
        return {
            **super().export_state(),
            "histograms": export_histograms(self.histograms),
            "active": self.active.name,
            "scalars": export_scalars(self, self.state_scalars),
        }

    def import_state(self, data: Mapping[str, Any]) -> list[str]:
        taken = super().import_state(data)
        taken += import_histograms(self.histograms, data.get("histograms"))
        for prof in (self.primary, self.fallback):
            if prof is not None and prof.name == data.get("active"):
                self.active = prof
                taken.append("active")
                break
        return taken + import_scalars(self, self.state_scalars, data.get("scalars"))

    cascade_as_ladder = False  # Proteus runs a cascade profile's two models as a two-level ladder

    def plans_paths(self, profile: Profile) -> bool:
        """Whether this policy plans ``profile``'s paths in one unified plan (argus+ on a deployment
        profile with ``[[cascades]]``); ARGUS itself runs one ladder."""
        return False

    # ---- control path --------------------------------------------------------------------

    def cache_degraded(self, stats: ClusterStats) -> bool:
        o = self.options
        if stats.cache_error_rate > o.cache_error_limit:
            return True
        return stats.cache_latency_s is not None and stats.cache_latency_s > o.cache_latency_limit_s

    def _update_mode(self, stats: ClusterStats) -> list[str]:
        notes: list[str] = []
        if self.fallback is None or stats.reason is not PlanTrigger.PERIOD:
            return notes
        degraded = self.cache_degraded(stats)
        if self.active is self.primary and degraded:
            self.active = self.fallback
            self.healthy_periods = 0
            self.switches_to_sm += 1
            self.switching, self.returning = True, False
            self.targets, self.requested = {}, {}
            notes.append("cache degraded: AC -> SM (K = 0 on SD-XL while the small models load)")
        elif self.active is self.fallback:
            self.healthy_periods = 0 if degraded else self.healthy_periods + 1
            if degraded:
                self.returning = False
            elif self.healthy_periods >= self.options.probe_periods and not self.returning:
                self.returning = True
                self.requested = {}
                notes.append("cache healthy again (probes): loading SD-XL for SM -> AC")
        return notes

    def demand_qpm(self, stats: ClusterStats) -> float:
        """The demand estimate (QPM, before the predictor's margin); a period's arrivals are
        observed once, re-plans on a model load reuse the estimate."""
        if stats.reason is PlanTrigger.PERIOD:
            self.demand.observe_stats(stats)
        return float(self.demand.estimate)

    def margin(self, stats: ClusterStats, switched: bool) -> float:
        m = self.predictor_spec.margin
        if self.active is not self.primary and (switched or self.switching):
            return m * self.options.switch_margin  # §4.6: "during the switch"
        return m

    def _overdue(self, w: str, level_id: str, stats: ClusterStats, profile: Profile) -> bool:
        """Whether ``w`` asked for ``level_id``'s model longer ago than its load time plus a period
        (a worker that cannot load in the background: move it anyway)."""
        since = self.requested.setdefault(f"{w}:{level_id}", stats.now_s)
        return stats.now_s - since > profile.level(level_id).load_time_s + self.options.period_s

    def _transition(self, stats: ClusterStats, alloc) -> tuple[dict[str, str | None], dict[str, tuple[str, ...]]]:
        """AC -> SM (§4.6): a worker takes its planned small model once it is loaded; until then
        it serves the ladder's level of the model it has (SD-XL at K = 0) and loads alongside."""
        prof = self.active
        assignment: dict[str, str | None] = {}
        preload: dict[str, tuple[str, ...]] = {}
        by_model: dict[str, str] = {}
        for lv in prof.levels:
            by_model.setdefault(lv.model, lv.id)
        now_in = self.current_in(prof, stats)
        done = True
        for w in stats.workers:
            target = alloc.assignment.get(w)
            if target is None:
                assignment[w] = now_in.get(w)
                continue
            self.targets[w] = target
            model = prof.level(target).model
            resident = set(stats.resident.get(w, ()))
            here = now_in.get(w)
            if model in resident or here == target or here is None or self._overdue(w, target, stats, prof):
                assignment[w] = target
            else:
                assignment[w] = here
                preload[w] = (target,)
                done = False
        if done:
            self.switching = False
            self.targets = {}
        return assignment, preload

    def _returning_ready(self, stats: ClusterStats) -> tuple[bool, dict[str, tuple[str, ...]]]:
        """SM -> AC: whether the AC model is loaded on every worker; else what to load."""
        base = self.primary.levels[0]
        preload: dict[str, tuple[str, ...]] = {}
        for w in stats.workers:
            if base.model in stats.resident.get(w, ()) or self._overdue(w, base.id, stats, self.primary):
                continue
            preload[w] = (base.id,)
        return not preload, preload

    def shares_for(self, profile: Profile, stats: ClusterStats) -> tuple[float, ...]:
        hist = self.histograms[profile.name]
        hist.add_counts({lv: int(stats.affinity.get(lv, 0)) for lv in profile.ids})
        return tuple(hist.shares())

    def pasm(self, affinity: tuple[float, ...], share: tuple[float, ...]) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(row) for row in oda(affinity, share))

    def allocate(self, profile: Profile, stats: ClusterStats, demand: float, margin: float):
        o = self.options
        current = self.planned_current(profile, stats)
        return allocate(
            profile.levels,
            list(stats.workers),
            demand,
            current=current,
            formulation=o.formulation,
            backend=o.backend,
            switch_tolerance=o.switch_tolerance,
            margin=margin,
            time_limit_s=o.time_limit_s,
        )

    def planned_current(self, profile: Profile, stats: ClusterStats) -> dict[str, str | None]:
        """The mapping the allocation should move as few workers from as possible: each worker's
        current level in ``profile`` or, during an AC -> SM switch, the small model it is loading."""
        current = self.current_in(profile, stats)
        if self.switching and profile is self.fallback:
            current = {w: self.targets.get(w, lv) for w, lv in current.items()}
        return current

    def current_in(self, profile: Profile, stats: ClusterStats) -> dict[str, str | None]:
        """Each up worker's current level, expressed in ``profile``'s levels: a level of the other
        strategy maps to the level of ``profile`` that runs the same model (no load), else None."""
        ids = set(profile.ids)
        by_model: dict[str, str] = {}
        for lv in profile.levels:  # best first: the best level of a model wins
            by_model.setdefault(lv.model, lv.id)
        models = {lv.id: lv.model for p in self._profiles().values() for lv in p.levels}
        out: dict[str, str | None] = {}
        for w in stats.workers:
            cur = stats.current.get(w)
            if cur is None or cur in ids:
                out[w] = cur
            else:
                out[w] = by_model.get(models.get(cur, ""))
        return out

    def plan(self, stats: ClusterStats) -> Plan:
        return self.routed(self.ladder_plan(stats))

    def ladder_plan(self, stats: ClusterStats) -> Plan:
        """The plan of the active ladder (the AC profile, or its smaller-model fallback), without
        its routing object."""
        notes = self._update_mode(stats)
        # keep every histogram current (the fallback's too, so a switch starts informed)
        shares = {name: self.shares_for(p, stats) for name, p in self._profiles().items()}
        demand = self.demand_qpm(stats)
        preload: dict[str, tuple[str, ...]] = {}
        if self.returning and self.active is self.fallback:
            ready, preload = self._returning_ready(stats)
            if ready:
                self.active = self.primary
                self.returning = False
                self.requested = {}
                self.switches_to_ac += 1
                notes.append("SD-XL loaded on every worker: SM -> AC")
        profile = self.active
        margin = self.margin(stats, False)
        if not stats.workers:
            return self.no_worker_plan(stats, profile.ids, self._strategy(profile), demand, notes)
        alloc = self.allocate(profile, stats, demand, margin)
        assignment = dict(alloc.assignment)
        share = tuple(alloc.share)
        quality = float(alloc.expected_quality)
        if self.switching and profile is self.fallback:
            assignment, preload = self._transition(stats, alloc)
            if assignment != alloc.assignment:
                share = capacity_share(profile, assignment)
                quality = sum(f * lv.quality for f, lv in zip(share, profile.levels, strict=True))
                notes.append(f"switching: {len(preload)} worker(s) serve K = 0 while their small model loads")
        pasm = self.pasm(shares[profile.name], share)
        return Plan(
            version=self.next_version(),
            created_s=stats.now_s,
            strategy=self._strategy(profile),
            levels=profile.ids,
            assignment=assignment,
            share=share,
            pasm=pasm,
            predicted_qpm=demand,
            expected_quality=quality,
            saturated=bool(alloc.saturated),
            shortfall_qpm=float(alloc.shortfall_qpm),
            moved_workers=int(alloc.moved_workers),
            margin=margin,
            policy=self.name,
            notes=tuple(notes),
            preload=preload,
        )

    def _profiles(self) -> dict[str, Profile]:
        out = {self.primary.name: self.primary}
        if self.fallback is not None:
            out[self.fallback.name] = self.fallback
        return out

    @staticmethod
    def _strategy(profile: Profile) -> Strategy:
        return Strategy.AC if profile.strategies == {Strategy.AC} else Strategy.SM

    # ---- data path -----------------------------------------------------------------------

    def make_routing(self, plan: Plan) -> ArgusRouting:
        """The immutable routing of ``plan``: from the plan, its profile (the primary's or the
        fallback's levels) and whether the policy routes by the prompt's predicted optimal level."""
        return ArgusRouting(plan, self.profile_of(plan), prompt_aware=self.uses_classifier)

    def profile_of(self, plan: Plan) -> Profile:
        """The profile whose levels ``plan`` runs: the primary's, else the fallback's."""
        return self.primary if plan.levels == self.primary.ids else (self.fallback or self.primary)


class ArgusRouting(PlanRouting):
    """ARGUS's (and PAC's) data path for one plan (§4.4), immutable: the prompt's predicted optimal
    level v (PAC: row 0, prompt-agnostic), a level v' drawn from PASM row v, and the worker at v'
    with the smallest queue length × processing time; an AC level above K = 0 while the cache is
    degraded runs at K = 0 on any planned worker (§4.6). ``lat``: each level's processing time,
    the profile's scaled by the plan's measured latencies (``Plan.latency_scale``)."""

    __slots__ = ("ac", "everyone", "lat", "prompt_aware")

    def __init__(
        self,
        plan: Plan,
        profile: Profile,
        *,
        prompt_aware: bool,
        workers: tuple[tuple[str, ...], ...] | None = None,
    ) -> None:
        super().__init__(plan, workers)
        scale = plan.latency_scale  # measured latencies the plan was made with (argus+; else empty)
        frozen_init(
            self,
            lat=tuple(profile.level(lv).latency(1) * scale.get(lv, 1.0) for lv in plan.levels),
            prompt_aware=prompt_aware,
            ac=plan.strategy is Strategy.AC,
            everyone=tuple(w for ws in self.workers for w in ws),
        )

    def row(self, view: RouteView) -> int:
        """The PASM row of the request: its predicted optimal level's (unknown, or PAC: row 0,
        the best level)."""
        if not self.prompt_aware:
            return 0
        opt = view.optimal_level
        if opt is not None and opt in self.index:
            return self.index[opt]
        return 0  # unknown prompt: treat it as needing the best level

    def route(self, request: Request, view: RouteView, rng: np.random.Generator) -> Assignment:
        """One request's assignment; draws one uniform from ``rng``."""
        j = self.sample(self.row(view), rng.random())
        if not self.workers[j]:
            # no worker is planned (e.g. every worker is down): the request waits for one
            return Assignment(
                level=self.levels[j], worker=None, reason="no worker in the plan", cause=RouteReason.NO_WORKER
            )
        if self.ac and j > 0 and not view.cache_healthy:
            # §4.6: serve at K = 0 at once on the loaded model until the plan switches to SM
            # every AC level shares the model, so any planned worker can run K = 0
            return Assignment(
                level=self.levels[0],
                worker=select_worker(self.everyone, view, self.lat[0]),
                optimal_level=view.optimal_level,
                reason="cache degraded",
                cause=RouteReason.CACHE_DEGRADED,
            )
        return Assignment(
            level=self.levels[j],
            worker=select_worker(self.workers[j], view, self.lat[j]),
            optimal_level=view.optimal_level,
        )


class Pac(Argus, name="pac", family="ac"):
    """ARGUS without the classifier and ODA (ARGUS §5's PAC baseline)."""

    summary = "ARGUS without classifier and ODA: prompt-agnostic routing to the allocated levels"
    uses_classifier = False  # the AC -> SM switch (uses_fallback) is kept: ARGUS §5.1

    def pasm(self, affinity: tuple[float, ...], share: tuple[float, ...]) -> tuple[tuple[float, ...], ...]:
        return uniform_pasm(share)
