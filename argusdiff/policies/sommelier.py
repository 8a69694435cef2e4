"""Sommelier-style per-GPU model choice (ARGUS §5 baseline): no cluster view.

A front end spreads requests uniformly over the workers. Each worker, every period, looks only at
its own load — the requests it was sent in the last period plus its own queue — and picks the best
level whose peak throughput covers that load (its own EWMA of it); it serves everything it gets at
that level, loading a model whenever its choice changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from argusdiff.domain import Assignment, ClusterStats, Plan, Profile, Request, Strategy
from argusdiff.policies.base import Policy, PolicyOptions, RouteView, uniform_pasm

__all__ = ["Sommelier"]


class Sommelier(Policy):
    name = "sommelier"
    strategies = frozenset({Strategy.SM, Strategy.AC})

    def __init__(
        self,
        profile: Profile,
        *,
        rng: np.random.Generator,
        classifier: Any = None,
        config: PolicyOptions | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(profile, rng=rng, classifier=classifier, config=config)
        self.sent: dict[str, int] = {}
        self.rate: dict[str, float] = {}
        self.choice: dict[str, str] = {}
        self._up: list[str] = []

    def _pick(self, qpm: float) -> str:
        for lv in self.profile.levels:  # best first
            if lv.peak_qpm >= qpm:
                return lv.id
        return self.profile.levels[-1].id

    def plan(self, stats: ClusterStats) -> Plan:
        a = self.options.ewma_alpha
        period = stats.period_s
        assignment: dict[str, str | None] = {}
        for w in stats.workers:
            own = self.sent.get(w, 0) * 60.0 / period
            backlog = stats.queue_lengths.get(w, 0) * 60.0 / period
            prev = self.rate.get(w)
            rate = own if prev is None else a * own + (1 - a) * prev
            self.rate[w] = rate
            level = self._pick(rate + backlog)
            self.choice[w] = level
            assignment[w] = level
        self.sent.clear()
        self._up = list(stats.workers)
        ids = self.profile.ids
        counts = [sum(1 for v in assignment.values() if v == lv) for lv in ids]
        total = sum(counts) or 1
        share = tuple(c / total for c in counts)
        return Plan(
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

    def route(self, request: Request, plan: Plan, view: RouteView) -> Assignment:
        workers = [w for w in plan.assignment if plan.assignment[w] is not None]
        if not workers:
            return Assignment(level=self.profile.best.id, worker=None, reason="no worker in the plan")
        w = workers[int(self.rng.integers(len(workers)))]
        self.sent[w] = self.sent.get(w, 0) + 1
        return Assignment(level=plan.assignment[w], worker=w)
