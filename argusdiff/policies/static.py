"""Clipper-HA / Clipper-HT: static allocations (every worker at the best / fastest level).

The baselines of ARGUS §5 over the smaller-model ladder: Clipper-HA serves everything with the best
model (high accuracy), Clipper-HT with the fastest (high throughput). Requests go to the worker
with the shortest queue.
"""

from __future__ import annotations

import numpy as np

from argusdiff.domain import Assignment, ClusterStats, Plan, Request, Strategy
from argusdiff.policies.base import Policy, RouteView, Routing, frozen_init, select_worker

__all__ = ["ClipperHA", "ClipperHT", "StaticRouting"]


class _Static(Policy):
    strategies = frozenset({Strategy.AC, Strategy.SM, Strategy.CASCADE})
    _fastest = False

    def _level(self) -> str:
        levels = self.profile.levels
        return levels[-1].id if self._fastest else levels[0].id

    def plan(self, stats: ClusterStats) -> Plan:
        return self.routed(self.static_plan(stats, self._level(), note=f"{self.name}: static"))

    def make_routing(self, plan: Plan) -> StaticRouting:
        level = self._level()
        return StaticRouting(plan, level, self.profile.level(level).latency(1))


class ClipperHA(_Static, name="clipper-ha", family="sm"):
    summary = "static: every worker at the best level"
    cascade_baseline = True
    _fastest = False


class ClipperHT(_Static, name="clipper-ht", family="sm"):
    summary = "static: every worker at the fastest level"
    cascade_baseline = True
    _fastest = True


class StaticRouting(Routing):
    """A static allocation's data path for one plan (immutable): its one level, on the plan's
    worker with the shortest queue (× ``latency_s``, the level's processing time)."""

    __slots__ = ("latency_s", "level", "workers")

    def __init__(self, plan: Plan, level: str, latency_s: float) -> None:
        frozen_init(self, workers=tuple(plan.assignment), level=level, latency_s=latency_s)

    def route(self, request: Request, view: RouteView, rng: np.random.Generator) -> Assignment:
        return Assignment(level=self.level, worker=select_worker(self.workers, view, self.latency_s))
