"""ARGUS (Middleware '25) and PAC, its prompt-agnostic ablation.

Control path, every period: predict demand (EWMA), solve the allocation ILP (Eq. 1) over the
active strategy's levels, and turn the affinity histogram H (the classifier's optimal levels of
recent prompts) and the allocation's load shares F into the PASM with ODA (Algorithm 1).
Data path, per request: the prompt's predicted optimal level v, a level v' drawn from PASM row v,
and the worker at v' with the smallest queue length × processing time (§4.4).

AC↔SM switch (§4.6): the default strategy is approximate caching. When cache retrieval degrades
(median latency above a limit or failed lookups above a rate), requests are served at K = 0 at
once on the SD-XL model already loaded (no downtime), the plan moves to the smaller-model ladder
with a 1.5× capacity margin while models load, and background probes move the plan back to AC
after the cache has been healthy for ``probe_periods`` periods.

PAC is ARGUS without the classifier and ODA: every PASM row equals F, so a prompt goes to a level
drawn from the allocation's shares regardless of what it needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from argusdiff.domain import Assignment, ClusterStats, Plan, Profile, Request, Strategy
from argusdiff.policies.base import (
    PlanRouting,
    Policy,
    PolicyError,
    PolicyOptions,
    RouteView,
    select_worker,
    uniform_pasm,
)

__all__ = ["Argus", "Pac"]


class Argus(Policy):
    name = "argus"
    uses_classifier = True
    prompt_aware = True

    def __init__(
        self,
        profile: Profile,
        *,
        rng: np.random.Generator,
        classifier: Any = None,
        config: PolicyOptions | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(profile, rng=rng, classifier=classifier, config=config)
        from argusdiff.predictors import AffinityHistogram, EwmaDemand

        if Strategy.CASCADE in profile.strategies:
            raise PolicyError(f"policy {self.name!r} needs an AC or SM profile, got cascade profile {profile.name!r}")
        fallback = self.options.fallback
        if fallback is not None and Strategy.CASCADE in fallback.strategies:
            raise PolicyError(f"policy {self.name!r}: the fallback profile must be an SM profile")
        self.primary = profile
        self.fallback = fallback if profile.strategies == {Strategy.AC} else None
        self.active = profile
        self.demand = EwmaDemand(self.options.ewma_alpha)
        self.histograms = {profile.name: AffinityHistogram(profile.ids, self.options.affinity_window)}
        if self.fallback is not None:
            self.histograms[self.fallback.name] = AffinityHistogram(self.fallback.ids, self.options.affinity_window)
        self.healthy_periods = 0
        self.switches_to_sm = 0
        self.switches_to_ac = 0
        self._routing: PlanRouting | None = None
        self._lat: list[float] = []

    # ---- control path --------------------------------------------------------------------

    def cache_degraded(self, stats: ClusterStats) -> bool:
        o = self.options
        if stats.cache_error_rate > o.cache_error_limit:
            return True
        return stats.cache_latency_s is not None and stats.cache_latency_s > o.cache_latency_limit_s

    def _update_mode(self, stats: ClusterStats) -> list[str]:
        notes: list[str] = []
        if self.fallback is None:
            return notes
        degraded = self.cache_degraded(stats)
        if self.active is self.primary and degraded:
            self.active = self.fallback
            self.healthy_periods = 0
            self.switches_to_sm += 1
            notes.append("cache degraded: AC -> SM")
        elif self.active is self.fallback:
            self.healthy_periods = 0 if degraded else self.healthy_periods + 1
            if self.healthy_periods >= self.options.probe_periods:
                self.active = self.primary
                self.switches_to_ac += 1
                notes.append("cache healthy again (probes): SM -> AC")
        return notes

    def demand_qpm(self, stats: ClusterStats) -> float:
        return float(self.demand.update(stats.arrival_qpm))

    def margin(self, stats: ClusterStats, switched: bool) -> float:
        if self.active is not self.primary and (switched or stats.loading):
            return self.options.switch_margin
        return self.options.margin

    def shares_for(self, profile: Profile, stats: ClusterStats) -> tuple[float, ...]:
        hist = self.histograms[profile.name]
        for lv in profile.ids:
            for _ in range(int(stats.affinity.get(lv, 0))):
                hist.add(lv)
        return tuple(hist.shares())

    def pasm(self, affinity: tuple[float, ...], share: tuple[float, ...]) -> tuple[tuple[float, ...], ...]:
        from solver.oda import oda

        return tuple(tuple(row) for row in oda(affinity, share))

    def allocate(self, profile: Profile, stats: ClusterStats, demand: float, margin: float):
        from solver.allocate import allocate

        o = self.options
        current = self.current_in(profile, stats)
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
        notes = self._update_mode(stats)
        # keep every histogram current (the fallback's too, so a switch starts informed)
        shares = {name: self.shares_for(p, stats) for name, p in self._profiles().items()}
        profile = self.active
        demand = self.demand_qpm(stats)
        margin = self.margin(stats, bool(notes))
        if not stats.workers:
            n = len(profile.ids)
            return Plan(
                version=self.next_version(),
                created_s=stats.now_s,
                strategy=self._strategy(profile),
                levels=profile.ids,
                assignment={},
                share=tuple(1.0 / n for _ in range(n)),
                pasm=uniform_pasm([1.0] * n),
                predicted_qpm=demand,
                expected_quality=0.0,
                saturated=True,
                shortfall_qpm=demand,
                policy=self.name,
                notes=("no worker is up", *notes),
            )
        alloc = self.allocate(profile, stats, demand, margin)
        pasm = self.pasm(shares[profile.name], tuple(alloc.share))
        return Plan(
            version=self.next_version(),
            created_s=stats.now_s,
            strategy=self._strategy(profile),
            levels=profile.ids,
            assignment=dict(alloc.assignment),
            share=tuple(alloc.share),
            pasm=pasm,
            predicted_qpm=demand,
            expected_quality=float(alloc.expected_quality),
            saturated=bool(alloc.saturated),
            shortfall_qpm=float(alloc.shortfall_qpm),
            moved_workers=int(alloc.moved_workers),
            margin=margin,
            policy=self.name,
            notes=tuple(notes),
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

    def routing(self, plan: Plan) -> PlanRouting:
        r = self._routing
        if r is None or r.version != plan.version or r.levels != plan.levels:
            r = self._routing = PlanRouting(plan)
            prof = self.primary if plan.levels == self.primary.ids else (self.fallback or self.primary)
            self._lat = [prof.level(lv).latency(1) for lv in plan.levels]
        return r

    def predicted_row(self, request: Request, plan: Plan, view: RouteView, r: PlanRouting) -> int:
        opt = view.optimal_level
        if opt is not None and opt in r.index:
            return r.index[opt]
        return 0  # unknown prompt: treat it as needing the best level

    def route(self, request: Request, plan: Plan, view: RouteView) -> Assignment:
        r = self.routing(plan)
        row = self.predicted_row(request, plan, view, r)
        j = r.sample(row, self.rng.random())
        if not r.workers[j]:
            # no worker is planned (e.g. every worker is down): the request waits for one
            return Assignment(level=plan.levels[j], worker=None, reason="no worker in the plan")
        level = plan.levels[j]
        if plan.strategy is Strategy.AC and j > 0 and not view.cache_healthy:
            # §4.6: serve at K = 0 at once on the loaded model until the plan switches to SM
            # every AC level shares the model, so any planned worker can run K = 0
            level = plan.levels[0]
            worker = select_worker([w for ws in r.workers for w in ws], view, self._lat[0])
            return Assignment(level=level, worker=worker, optimal_level=view.optimal_level, reason="cache degraded")
        worker = select_worker(r.workers[j], view, self._lat[j])
        return Assignment(level=level, worker=worker, optimal_level=view.optimal_level)


class Pac(Argus):
    """ARGUS without the classifier and ODA (ARGUS §5's PAC baseline)."""

    name = "pac"
    uses_classifier = False
    prompt_aware = False

    def pasm(self, affinity: tuple[float, ...], share: tuple[float, ...]) -> tuple[tuple[float, ...], ...]:
        return uniform_pasm(share)

    def predicted_row(self, request: Request, plan: Plan, view: RouteView, r: PlanRouting) -> int:
        return 0
