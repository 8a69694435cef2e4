"""Sommelier-style per-GPU model choice (ARGUS §5 baseline): no cluster view.

A front end spreads requests uniformly over the workers. Each worker, every period, looks only at
its own load — the requests it was sent (its own demand predictor, the same reading the other
policies use, over its own arrivals) plus its own queue — and picks the best level whose peak
throughput covers that load × the predictor's margin; it serves everything it gets at that level,
loading a model whenever its choice changes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from argusdiff.domain import Assignment, ClusterStats, Delivery, Plan, PlanTrigger, Request, RouteReason, Strategy
from argusdiff.policies.base import Policy, RouteView, Routing, frozen_init, uniform_pasm
from argusdiff.policies.state import import_mapping

__all__ = ["Sommelier", "SommelierRouting"]


class Sommelier(Policy, name="sommelier", family="sm"):
    summary = "per-GPU level choice from that GPU's own load, no cluster view"
    # each request is served on the worker the front end sent it to (that worker picked its level)
    delivery = Delivery.PER_WORKER
    strategies = frozenset({Strategy.SM, Strategy.AC})
    source_predictor = "sommelier-artifact"

    def setup(self) -> None:
        # (worker, send time) of the current period: the data path appends, the control path drains
        # (a deque: both ends are thread-safe, so plan() may run in another thread without a lock)
        self.sent: deque[tuple[str, float]] = deque()
        self.worker_demand: dict[str, Any] = {}  # worker -> its own DemandPredictor
        self.rate: dict[str, float] = {}
        self.choice: dict[str, str] = {}

    def export_state(self) -> dict[str, Any]:
        return {"rate": dict(self.rate), "choice": dict(self.choice)}

    def import_state(self, data: Mapping[str, Any]) -> list[str]:
        parts = {"rate": self.rate, "choice": self.choice}
        return [name for name, mine in parts.items() if import_mapping(mine, data.get(name))]

    def _pick(self, qpm: float) -> str:
        for lv in self.profile.levels:  # best first
            if lv.peak_qpm >= qpm:
                return lv.id
        return self.profile.levels[-1].id

    def plan(self, stats: ClusterStats) -> Plan:
        period = stats.period_s
        assignment: dict[str, str | None] = {}
        nb = max(1, round(period))
        start = stats.now_s - period
        margin = self.predictor_spec.margin
        sent: dict[str, list[float]] = {}
        if stats.reason is PlanTrigger.PERIOD:
            while True:
                try:
                    w, t = self.sent.popleft()
                except IndexError:
                    break
                sent.setdefault(w, []).append(t)
        for w in stats.workers:
            pred = self.worker_demand.get(w)
            if pred is None:
                pred = self.worker_demand[w] = self.new_demand_predictor()
            if stats.reason is PlanTrigger.PERIOD:
                times = sent.get(w, [])
                bins = [0] * nb
                for t in times:
                    bins[min(nb - 1, max(0, int((t - start) * nb / period)))] += 1
                pred.observe(len(times), period, bins, period / nb)
            rate = pred.estimate
            self.rate[w] = rate
            backlog = stats.queue_lengths.get(w, 0) * 60.0 / period
            level = self._pick(rate * margin + backlog)
            self.choice[w] = level
            assignment[w] = level
        ids = self.profile.ids
        counts = [sum(1 for v in assignment.values() if v == lv) for lv in ids]
        total = sum(counts) or 1
        share = tuple(c / total for c in counts)
        plan = Plan(
            version=self.next_version(),
            created_s=stats.now_s,
            strategy=Strategy.SM if Strategy.SM in self.profile.strategies else Strategy.AC,
            levels=ids,
            assignment=assignment,
            share=share,
            pasm=uniform_pasm(share if sum(share) > 0 else [1.0] * len(ids)),
            predicted_qpm=sum(self.rate.values()),
            expected_quality=sum(s * q for s, q in zip(share, self.profile.qualities(), strict=True)),
            policy=self.name,
        )
        return self.routed(plan)

    def make_routing(self, plan: Plan) -> SommelierRouting:
        return SommelierRouting(plan, self.profile.best.id)

    def route(self, request: Request, plan: Plan, view: RouteView) -> Assignment:
        """The plan's routing picks the worker; the send goes into the log ``plan()`` drains."""
        a = super().route(request, plan, view)
        if a.worker is not None:
            self.sent.append((a.worker, view.now_s))
        return a


class SommelierRouting(Routing):
    """Sommelier's front end for one plan (immutable): a uniformly random worker among those the
    plan gives a level (one draw from ``rng``), served at the level that worker chose; none:
    the request waits at the profile's best level."""

    __slots__ = ("best", "level_of", "workers")

    def __init__(self, plan: Plan, best: str) -> None:
        workers = tuple(w for w, lv in plan.assignment.items() if lv is not None)
        frozen_init(self, workers=workers, level_of={w: plan.assignment[w] for w in workers}, best=best)

    def route(self, request: Request, view: RouteView, rng: np.random.Generator) -> Assignment:
        workers = self.workers
        if not workers:
            return Assignment(level=self.best, worker=None, reason="no worker in the plan", cause=RouteReason.NO_WORKER)
        w = workers[int(rng.integers(len(workers)))]
        return Assignment(level=self.level_of[w], worker=w)
