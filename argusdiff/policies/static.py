"""Clipper-HA / Clipper-HT: static allocations (every worker at the best / fastest level).

The baselines of ARGUS §5 over the smaller-model ladder: Clipper-HA serves everything with the best
model (high accuracy), Clipper-HT with the fastest (high throughput). Requests go to the worker
with the shortest queue.
"""

from __future__ import annotations

from argusdiff.domain import Assignment, ClusterStats, Plan, Request, Strategy
from argusdiff.policies.base import Policy, RouteView, select_worker

__all__ = ["ClipperHA", "ClipperHT"]


class _Static(Policy):
    strategies = frozenset({Strategy.AC, Strategy.SM, Strategy.CASCADE})
    _fastest = False

    def _level(self) -> str:
        levels = self.profile.levels
        return levels[-1].id if self._fastest else levels[0].id

    def plan(self, stats: ClusterStats) -> Plan:
        return self.static_plan(stats, self._level(), note=f"{self.name}: static")

    def route(self, request: Request, plan: Plan, view: RouteView) -> Assignment:
        level = self._level()
        workers = list(plan.assignment)
        worker = select_worker(workers, view, self.profile.level(level).latency(1))
        return Assignment(level=level, worker=worker)


class ClipperHA(_Static, name="clipper-ha", family="sm"):
    summary = "static: every worker at the best level"
    cascade_baseline = True
    _fastest = False


class ClipperHT(_Static, name="clipper-ht", family="sm"):
    summary = "static: every worker at the fastest level"
    cascade_baseline = True
    _fastest = True
