"""NIRVANA (NSDI '24) as ARGUS §5 runs it: approximate caching on every worker.

Every worker runs the one AC model. Each request's K comes from the similarity of its best cached
prompt (``cache.policy.k_for_similarity``; defaults from a public NIRVANA reimplementation:
> 0.95 → 25, > 0.9 → 20, > 0.85 → 15, > 0.75 → 10, > 0.65 → 5, else a miss at K = 0) — whatever
the load — and the load is spread uniformly over the workers.
"""

from __future__ import annotations

import numpy as np

from argusdiff.domain import Assignment, ClusterStats, Delivery, Plan, Profile, Request, RouteReason, Strategy
from argusdiff.policies.base import Policy, PolicyError, RouteView, Routing, frozen_init
from cache.policy import NIRVANA_THRESHOLDS, CachePolicy, k_for_similarity

__all__ = ["Nirvana", "NirvanaRouting", "level_for_k"]


def level_for_k(profile: Profile, k: int) -> str:
    """The level of ``profile`` skipping the most steps within ``k`` (K of the thresholds' N = 50;
    a level of another N is compared at the same fraction of its trajectory, as the cache judges
    it); none: the profile's best level."""
    by_k = {lv.skip: lv.id for lv in profile.levels}
    scale = CachePolicy().scaled_k
    steps = {lv.skip: lv.steps for lv in profile.levels}
    usable = [s for s in sorted(by_k) if scale(s, steps[s]) <= k]
    return by_k[max(usable)] if usable else profile.levels[0].id


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

    def level_for_k(self, k: int) -> str:
        """The level a prompt whose cached neighbour allows ``k`` runs at (:func:`level_for_k`)."""
        return level_for_k(self.profile, k)

    def plan(self, stats: ClusterStats) -> Plan:
        return self.routed(self.static_plan(stats, self.profile.levels[0].id, note="nirvana: AC on every worker"))

    def make_routing(self, plan: Plan) -> NirvanaRouting:
        return NirvanaRouting(plan, self.profile)


class NirvanaRouting(Routing):
    """NIRVANA's data path for one plan (immutable): the level of the K the prompt's best cached
    neighbour allows (a miss, or an unhealthy cache: K = 0), on a uniformly random worker of the
    plan (one draw from ``rng``). ``by_k``: the level of each K the cache's thresholds give."""

    __slots__ = ("by_k", "profile", "workers")

    def __init__(self, plan: Plan, profile: Profile) -> None:
        ks = {0, *(int(k) for _, k in NIRVANA_THRESHOLDS)}
        frozen_init(
            self, workers=tuple(plan.assignment), profile=profile, by_k={k: level_for_k(profile, k) for k in ks}
        )

    def level(self, k: int) -> str:
        got = self.by_k.get(k)
        return got if got is not None else level_for_k(self.profile, k)

    def route(self, request: Request, view: RouteView, rng: np.random.Generator) -> Assignment:
        sim = view.cache_similarity
        k = k_for_similarity(sim) if (sim is not None and view.cache_healthy) else 0
        workers = self.workers
        if not workers:
            return Assignment(
                level=self.level(k), worker=None, reason="no worker in the plan", cause=RouteReason.NO_WORKER
            )
        w = workers[int(rng.integers(len(workers)))]
        return Assignment(level=self.level(k), worker=w)
