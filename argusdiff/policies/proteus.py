"""Proteus (ASPLOS '24) as ARGUS §5 runs it: prompt-agnostic accuracy scaling over smaller models.

The allocation ILP picks how many workers run each model for the predicted demand (it pays model
loads when the mix changes); requests are routed at random — a level drawn from the allocation's
load shares and a uniformly random worker of that level, without looking at queues or prompts
(the Proteus artifact's ``canary_routing`` spreads each model's load over its devices the same
way). On a cascade profile (DiffServe §4.1's Proteus baseline) the light and heavy models are a
two-level ladder: no discriminator, random routing between them. docs/baselines.md lists the
knobs, their sources and the departures from the Proteus artifact.
"""

from __future__ import annotations

import numpy as np

from argusdiff.domain import Assignment, Delivery, Plan, Request, RouteReason, Strategy
from argusdiff.policies.argus import ArgusRouting, Pac
from argusdiff.policies.base import RouteView

__all__ = ["Proteus", "ProteusRouting"]


class Proteus(Pac, name="proteus", family="sm"):
    summary = "prompt-agnostic accuracy scaling over smaller models (ILP), random routing"
    # the artifact's canary_routing: a device drawn by weight, the request waits in its queue
    delivery = Delivery.PER_WORKER
    cascade_baseline = True
    source_predictor = "proteus-artifact"
    strategies = frozenset({Strategy.SM, Strategy.CASCADE})
    cascade_as_ladder = True

    def make_routing(self, plan: Plan) -> ProteusRouting:
        return ProteusRouting(plan, self.profile_of(plan), prompt_aware=False)


class ProteusRouting(ArgusRouting):
    """Proteus's data path for one plan (immutable): a level drawn from the allocation's load
    shares (PASM row 0) and a uniformly random worker of that level (two draws from ``rng``)."""

    __slots__ = ()

    def route(self, request: Request, view: RouteView, rng: np.random.Generator) -> Assignment:
        j = self.sample(0, rng.random())
        workers = self.workers[j]
        if not workers:
            return Assignment(
                level=self.levels[j], worker=None, reason="no worker in the plan", cause=RouteReason.NO_WORKER
            )
        worker = workers[int(rng.integers(len(workers)))] if len(workers) > 1 else workers[0]
        return Assignment(level=self.levels[j], worker=worker)
