"""DiffServe (MLSys '25): a light→heavy cascade with a discriminator.

Every query runs on the light model; the discriminator's confidence in the light image decides:
at or above the threshold t the light image is returned, below it the query is re-run on the heavy
model. Each control period the MILP (``solver.cascade.solve_cascade``) picks the workers and batch
sizes of each model and the largest t the cluster can afford for the predicted demand (EWMA ×
over-provisioning), given the current queues. ``diffserve-static`` solves once for the trace's
peak demand and keeps that plan (re-solved only when the set of up workers changes).

As in the DiffServe artifact, a query is dropped when its queue wait plus the profiled runtime
would exceed ``drop_factor`` (1.5) × SLO.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from argusdiff.domain import Assignment, ClusterStats, Plan, Profile, Request, Strategy
from argusdiff.policies.base import Policy, PolicyError, PolicyOptions, RouteView, select_worker

__all__ = ["DiffServe", "DiffServeStatic"]


def _bucket_rate(qpm: float) -> float:
    """Demand on a 4% grid (the MILP's answer changes little within it)."""
    if qpm <= 1.0:
        return round(max(qpm, 0.0), 1)
    return round(1.04 ** round(math.log(qpm) / math.log(1.04)), 2)


def _bucket_queue(q: int) -> int:
    """Queue length rounded down to 0, 1, 2, 4, 8, ... 128."""
    q = min(max(q, 0), 128)
    return 0 if q == 0 else 1 << (q.bit_length() - 1)


class DiffServe(Policy):
    name = "diffserve"
    strategies = frozenset({Strategy.CASCADE})
    cascade = True

    def __init__(
        self,
        profile: Profile,
        *,
        rng: np.random.Generator,
        classifier: Any = None,
        config: PolicyOptions | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(profile, rng=rng, classifier=classifier, config=config)
        from argusdiff.predictors import EwmaDemand

        if profile.cascade is None:
            raise PolicyError(f"policy {self.name!r} needs a profile with a [cascade] table, got {profile.name!r}")
        self.spec = profile.cascade
        self.light = profile.level(self.spec.light)
        self.heavy = profile.level(self.spec.heavy)
        self.demand = EwmaDemand(self.options.ewma_alpha)
        # with 1 s periods a period holds a handful of arrivals: measure the rate over a window
        self._window: deque[tuple[int, float]] = deque()
        self.window_s = 30.0
        self.move_interval_s = 10.0
        self._last_move = -1e18
        self._last_dir = 0
        self._last_feasible: tuple[int, Any] | None = None
        self._memo: dict[tuple, Any] = {}
        self._workers: dict[str, list[str]] = {}
        self._version_seen = -1
        self.last_solution: Any = None

    def demand_qpm(self, stats: ClusterStats) -> float:
        self._window.append((stats.arrivals, stats.period_s))
        span = sum(p for _, p in self._window)
        while len(self._window) > 1 and span - self._window[0][1] >= self.window_s:
            span -= self._window.popleft()[1]
        rate = sum(a for a, _ in self._window) * 60.0 / span if span > 0 else 0.0
        return float(self.demand.update(rate))

    def solve(self, stats: ClusterStats, demand: float):
        """The MILP for this period. Its answer is memoised on rounded inputs (demand to a 4%
        grid, queue lengths down to a power of two, capped at 128): a 1 s control loop sees the
        same rounded inputs again and again, and one solve costs 5-15 ms on this machine."""
        from solver.cascade import solve_cascade

        d = _bucket_rate(demand)
        ql = _bucket_queue(int(stats.level_queue.get(self.light.id, 0)))
        qh = _bucket_queue(int(stats.level_queue.get(self.heavy.id, 0)))
        key = (len(stats.workers), d, ql, qh)
        sol = self._memo.get(key)
        if sol is None:
            sol = solve_cascade(
                self.spec,
                self.light,
                self.heavy,
                len(stats.workers),
                d,
                self.slo_s,
                queue_light=ql,
                queue_heavy=qh,
                overprovision=self.options.overprovision,
                backend=self.options.backend,
            )
            if len(self._memo) < 100_000:
                self._memo[key] = sol
        return sol

    def _assign(self, stats: ClusterStats, x_light: int, x_heavy: int) -> dict[str, str | None]:
        """Keep workers on the model they run where possible (fewer loads)."""
        workers = list(stats.workers)
        out: dict[str, str | None] = {w: None for w in workers}
        need = {self.light.id: x_light, self.heavy.id: x_heavy}
        for w in workers:
            cur = stats.current.get(w)
            if cur in need and need[cur] > 0:
                out[w] = cur
                need[cur] -= 1
        for w in workers:
            if out[w] is None:
                for lv in (self.heavy.id, self.light.id):
                    if need[lv] > 0:
                        out[w] = lv
                        need[lv] -= 1
                        break
        return out

    def make_plan(self, stats: ClusterStats, demand: float) -> Plan:
        ids = self.profile.ids
        if not stats.workers:
            return Plan(
                version=self.next_version(),
                created_s=stats.now_s,
                strategy=Strategy.CASCADE,
                levels=ids,
                assignment={},
                share=tuple(1.0 / len(ids) for _ in ids),
                pasm=tuple(tuple(1.0 / len(ids) for _ in ids) for _ in ids),
                predicted_qpm=demand,
                expected_quality=0.0,
                saturated=True,
                shortfall_qpm=demand,
                policy=self.name,
                notes=("no worker is up",),
            )
        sol = self.solve(stats, demand)
        notes: list[str] = []
        if not getattr(sol, "feasible", True):
            prev = self._last_feasible
            if prev is not None and prev[0] == len(stats.workers) and self._carries(prev[1], demand):
                # the MILP found no split meeting the latency bound with the observed queues
                # (Little's law on a near-idle level can inflate the wait): keep the last feasible one
                notes.append("MILP infeasible with the observed queues: kept the last feasible split")
                sol = prev[1]
            else:
                notes.append("MILP infeasible: best effort")
        else:
            self._last_feasible = (len(stats.workers), sol)
        self.last_solution = sol
        x_light, x_heavy = int(sol.x_light), int(sol.x_heavy)
        if x_light < 1:  # every query starts on the light model
            x_light, x_heavy = 1, max(0, x_heavy - 1)
        if x_heavy < 1 and sol.threshold > 0 and x_light > 1:  # deferred queries need a heavy worker
            x_light, x_heavy = x_light - 1, 1
        x_light, x_heavy = self._limit_moves(stats, demand, x_light, x_heavy)
        assignment = self._assign(stats, x_light, x_heavy)
        t = float(sol.threshold)
        f = self.spec.f(t)
        share = [0.0] * len(ids)
        share[ids.index(self.light.id)] = 1.0 - f
        share[ids.index(self.heavy.id)] = f
        q_light = self.light.quality
        return Plan(
            version=self.next_version(),
            created_s=stats.now_s,
            strategy=Strategy.CASCADE,
            levels=ids,
            assignment=assignment,
            share=tuple(share),
            pasm=tuple(tuple(share) for _ in ids),
            predicted_qpm=demand,
            expected_quality=(1.0 - f) * q_light + f * self.heavy.quality,
            saturated=bool(getattr(sol, "saturated", False)),
            shortfall_qpm=float(getattr(sol, "shortfall_qpm", 0.0)),
            thresholds={self.light.id: t},
            batch_sizes={self.light.id: int(sol.b_light), self.heavy.id: int(sol.b_heavy)},
            policy=self.name,
            notes=tuple(notes),
        )

    def plan(self, stats: ClusterStats) -> Plan:
        return self.make_plan(stats, self.demand_qpm(stats))

    def _carries(self, sol: Any, demand: float) -> bool:
        """Whether a split serves ``demand`` (× over-provisioning) at its threshold."""
        d = demand * self.options.overprovision
        light = int(sol.x_light) * self.light.throughput_qpm(max(1, int(sol.b_light)))
        heavy = int(sol.x_heavy) * self.heavy.throughput_qpm(max(1, int(sol.b_heavy)))
        return light >= d and heavy >= d * self.spec.f(float(sol.threshold))

    def _limit_moves(self, stats: ClusterStats, demand: float, x_light: int, x_heavy: int) -> tuple[int, int]:
        """Hysteresis on the worker split: a model load takes seconds, so re-splitting back and forth
        on 1 s plans would keep workers loading. Moves in the same direction as the last one are
        taken at once; a reversal waits ``move_interval_s`` after the last move, unless the light
        workers cannot carry the demand."""
        cur_light = sum(1 for w in stats.workers if stats.current.get(w) == self.light.id)
        cur_heavy = sum(1 for w in stats.workers if stats.current.get(w) == self.heavy.id)
        if cur_light + cur_heavy != len(stats.workers) or cur_light == 0:
            return x_light, x_heavy  # first plan or workers changed: take the MILP's split
        if x_light == cur_light:
            return x_light, x_heavy
        direction = 1 if x_light > cur_light else -1
        b = max(self.light.batch_sizes)
        starved = cur_light * self.light.throughput_qpm(b) < demand * self.options.overprovision
        if direction == self._last_dir or starved or stats.now_s - self._last_move >= self.move_interval_s:
            self._last_move = stats.now_s
            self._last_dir = direction
            return x_light, x_heavy
        return cur_light, cur_heavy

    # ---- data path -----------------------------------------------------------------------

    def _workers_of(self, plan: Plan) -> dict[str, list[str]]:
        if self._version_seen != plan.version:
            self._workers = {self.light.id: [], self.heavy.id: []}
            for w, lv in plan.assignment.items():
                if lv in self._workers:
                    self._workers[lv].append(w)
            self._version_seen = plan.version
        return self._workers

    def _send(self, request: Request, plan: Plan, view: RouteView, level) -> Assignment:
        workers = self._workers_of(plan)[level.id]
        if not workers:
            return Assignment(level=level.id, worker=None, reason=f"no {level.id} worker: waits")
        b = plan.batch_sizes.get(level.id, 1)
        w = select_worker(workers, view, level.latency(b) / b)
        wait = max(0.0, view.busy_until.get(w, view.now_s) - view.now_s)
        # an idle worker starts this query alone; a busy one takes it in a batch of up to b
        runtime = level.latency(b) if wait > 0 else level.latency(1)
        slo = request.slo_s if request.slo_s is not None else self.slo_s
        if (view.now_s - request.arrival_s) + wait + runtime > self.options.drop_factor * slo:
            return Assignment(level=None, worker=w, dropped=True, reason="predicted to miss 1.5 x SLO")
        return Assignment(level=level.id, worker=w)

    def route(self, request: Request, plan: Plan, view: RouteView) -> Assignment:
        return self._send(request, plan, view, self.light)

    def route_heavy(self, request: Request, plan: Plan, view: RouteView) -> Assignment:
        """A deferred query; with no heavy worker in the current plan the light image is returned
        (``level=None`` without ``dropped``)."""
        if not self._workers_of(plan)[self.heavy.id]:
            return Assignment(level=None, reason="no heavy worker: light image returned")
        return self._send(request, plan, view, self.heavy)


class DiffServeStatic(DiffServe):
    name = "diffserve-static"

    def __init__(self, profile, *, rng, classifier=None, config=None) -> None:
        super().__init__(profile, rng=rng, classifier=classifier, config=config)
        self._plan: Plan | None = None
        self._workers_up: tuple[str, ...] = ()

    def plan(self, stats: ClusterStats) -> Plan:
        peak = self.options.peak_qpm
        if peak is None:
            raise PolicyError("policy 'diffserve-static' needs the trace's peak demand (option peak_qpm)")
        if self._plan is None or stats.workers != self._workers_up:
            idle = ClusterStats(
                now_s=stats.now_s, period_s=stats.period_s, arrivals=0, workers=stats.workers, current=stats.current
            )
            self._plan = self.make_plan(idle, peak)
            self._workers_up = stats.workers
        return self._plan
