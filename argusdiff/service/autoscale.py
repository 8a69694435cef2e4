"""The autoscaling signal: how many workers the cluster should have, from the plan in force.

ARGUS plans a fixed cluster; what it cannot serve shows as ``saturated`` with ``shortfall_qpm``
(the predicted demand above every worker at the fastest level, ``solver.allocate``). This turns
that into a worker count an autoscaler (KEDA, an HPA on an external metric) can act on:

* **saturated** — ``up + ceil(shortfall_qpm / P_fast)``: a saturated plan already runs every
  worker at the fastest level, so each added worker adds at most that level's peak throughput
  ``P_fast`` (QPM at batch size 1, the profile's ``P_th``); fewer would leave demand unserved.
* **not saturated** — ``min(up, max(1, ceil(predicted_qpm / P_best)))``: never more workers than
  are up (more would only buy quality the plan already trades for throughput), and fewer only
  when the best level alone carries the whole predicted demand on fewer workers — a scale-in
  that costs no quality.

Every router exports the same value (followers compute it from the published plan), as
``argusdiff_desired_workers`` beside ``argusdiff_shortfall_qpm``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from argusdiff.domain import ApproxLevel, Plan

__all__ = ["AutoscaleMetrics", "desired_workers"]


def desired_workers(plan: Plan, levels: Mapping[str, ApproxLevel], workers_up: int) -> int:
    """The worker count the plan asks for (see the module doc); ``levels`` maps ids to levels."""
    lvs = [levels[lv] for lv in plan.levels if lv in levels]
    up = max(0, int(workers_up))
    if not lvs:
        return up
    if plan.saturated or plan.shortfall_qpm > 0:
        fast = max(lv.peak_qpm for lv in lvs)
        return up + max(1, math.ceil(plan.shortfall_qpm / fast - 1e-9)) if fast > 0 else up
    best = lvs[0].peak_qpm
    need = math.ceil(plan.predicted_qpm / best - 1e-9) if best > 0 else up
    return min(up, max(1, need)) if up else max(1, need)


class AutoscaleMetrics:
    """The signal's gauges (and the leader gauges) on a service's metric registry."""

    def __init__(self, metrics: Any, levels: Mapping[str, ApproxLevel]) -> None:
        from prometheus_client import Gauge

        r = metrics.registry
        self.levels = levels
        self.desired = Gauge(
            "argusdiff_desired_workers",
            "Workers the plan asks for: up + shortfall / fastest level's peak QPM when saturated, "
            "fewer when the best level alone carries the demand",
            registry=r,
        )
        self.shortfall = Gauge("argusdiff_shortfall_qpm", "Predicted demand the plan cannot serve (QPM)", registry=r)
        self.leader = Gauge("argusdiff_leader", "1 when this router holds the leader lease", registry=r)
        self.token = Gauge(
            "argusdiff_leader_token", "The fencing token this router leads with (0: follower)", registry=r
        )

    def observe(self, plan: Plan, workers_up: int) -> int:
        n = desired_workers(plan, self.levels, workers_up)
        self.desired.set(n)
        self.shortfall.set(plan.shortfall_qpm)
        return n
