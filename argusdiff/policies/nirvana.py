"""NIRVANA (NSDI '24) as ARGUS §5 runs it: approximate caching on every worker.

Every worker runs the one AC model. Each request's K comes from the similarity of its best cached
prompt (``cache.policy.k_for_similarity``; defaults from a public NIRVANA reimplementation:
> 0.95 → 25, > 0.9 → 20, > 0.85 → 15, > 0.75 → 10, > 0.65 → 5, else a miss at K = 0) — whatever
the load — and the load is spread uniformly over the workers.
"""

from __future__ import annotations

from argusdiff.domain import Assignment, ClusterStats, Delivery, Plan, Request, RouteReason, Strategy
from argusdiff.policies.base import Policy, PolicyError, RouteView
from cache.policy import CachePolicy, k_for_similarity

__all__ = ["Nirvana"]


class Nirvana(Policy, name="nirvana", family="ac"):
    summary = "approximate caching on every worker, K from cache similarity, uniform load"
    # NIRVANA spreads the load uniformly over the workers: each request waits on the one drawn
    delivery = Delivery.PER_WORKER
    strategies = frozenset({Strategy.AC})
    uses_cache_similarity = True
    source_predictor = "argus-paper"

    def setup(self) -> None:
        profile = self.profile
        if profile.strategies != {Strategy.AC}:
            raise PolicyError(f"policy 'nirvana' needs an AC profile, got {profile.name!r}")
        self.by_k = {lv.skip: lv.id for lv in profile.levels}
        self.ks = sorted(self.by_k)
        self._k_cache: dict[int, str] = {}

    def level_for_k(self, k: int) -> str:
        """The level skipping the most steps within ``k`` (K of the thresholds' N = 50; a level of
        another N is compared at the same fraction of its trajectory, as the cache judges it)."""
        got = self._k_cache.get(k)
        if got is None:
            scale = CachePolicy().scaled_k
            steps = {lv.skip: lv.steps for lv in self.profile.levels}
            usable = [s for s in self.ks if scale(s, steps[s]) <= k]
            got = self.by_k[max(usable)] if usable else self.profile.levels[0].id
            self._k_cache[k] = got
        return got

    def plan(self, stats: ClusterStats) -> Plan:
        return self.static_plan(stats, self.profile.levels[0].id, note="nirvana: AC on every worker")

    def route(self, request: Request, plan: Plan, view: RouteView) -> Assignment:
        sim = view.cache_similarity
        k = k_for_similarity(sim) if (sim is not None and view.cache_healthy) else 0
        workers = list(plan.assignment)
        if not workers:
            return Assignment(
                level=self.level_for_k(k), worker=None, reason="no worker in the plan", cause=RouteReason.NO_WORKER
            )
        w = workers[int(self.rng.integers(len(workers)))]
        return Assignment(level=self.level_for_k(k), worker=w)
