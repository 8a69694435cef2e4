"""argus+: ARGUS plus three additions, each switchable for the ablation.

* ``admission`` — deadline-aware admission (after TetriServe's "definitely late" test): when the
  PASM's level on its best worker would finish after the request's deadline, the request moves to
  the nearest faster level (on AC any worker can run any K: they share the model) that still meets
  it; a request no level can finish in time is served best-effort at the fastest level on the
  worker that frees first instead of queueing behind others at its planned level.
* ``backlog`` — backlog-aware planning: the demand the allocation plans for is the predicted
  arrival rate plus the rate needed to drain the queued requests within one period.
* ``switch_aware`` — switch-cost-aware allocation: the allocation keeps the current worker→level
  mapping unless moving workers gains more than 2% expected quality (ARGUS re-solves from scratch:
  0.5% tolerance); this only matters where levels need different models (SM).
"""

from __future__ import annotations

from argusdiff.domain import Assignment, ClusterStats, Plan, Request, Strategy
from argusdiff.policies.argus import Argus
from argusdiff.policies.base import RouteView, select_worker

__all__ = ["ArgusPlus"]


class ArgusPlus(Argus):
    name = "argus+"

    def demand_qpm(self, stats: ClusterStats) -> float:
        predicted = float(self.demand.update(stats.arrival_qpm))
        if self.options.backlog and stats.period_s > 0:
            queued = sum(stats.queue_lengths.values())
            predicted += queued * 60.0 / stats.period_s
        return predicted

    def allocate(self, profile, stats: ClusterStats, demand: float, margin: float):
        from solver.allocate import allocate

        o = self.options
        return allocate(
            profile.levels,
            list(stats.workers),
            demand,
            current=self.current_in(profile, stats),
            formulation=o.formulation,
            backend=o.backend,
            switch_tolerance=max(o.switch_tolerance, 0.02) if o.switch_aware else o.switch_tolerance,
            margin=margin,
            time_limit_s=o.time_limit_s,
        )

    def route(self, request: Request, plan: Plan, view: RouteView) -> Assignment:
        a = super().route(request, plan, view)
        if not self.options.admission or a.level is None or a.worker is None:
            return a
        r = self.routing(plan)
        now = view.now_s
        deadline = request.arrival_s + (request.slo_s if request.slo_s is not None else self.slo_s)
        bu = view.busy_until
        j = r.index[a.level]
        if max(now, bu.get(a.worker, now)) + self._lat[j] <= deadline:
            return a
        ac = plan.strategy is Strategy.AC
        all_workers = [w for ws in r.workers for w in ws] if ac else None
        hit_ok = True
        if ac:
            from cache.policy import k_for_similarity

            sim = view.cache_similarity
            hit_ok = view.cache_healthy and sim is not None and k_for_similarity(sim) > 0
        n = len(plan.levels)
        for k in range(j + 1, n):
            if ac and not hit_ok:
                break  # K > 0 would run at K = 0 on a miss: no faster level exists for this prompt
            workers = all_workers if ac else r.workers[k]
            if not workers:
                continue
            w = select_worker(workers, view, self._lat[k])
            if w is not None and max(now, bu.get(w, now)) + self._lat[k] <= deadline:
                return Assignment(
                    level=plan.levels[k],
                    worker=w,
                    optimal_level=a.optimal_level,
                    reason="deadline: moved to a faster level",
                )
        # hopeless: best effort at the fastest level this prompt can use that has workers (on AC a
        # cache miss runs at K = 0 anyway), on the worker that frees first
        if ac:
            k = (n - 1) if hit_ok else 0
            workers = all_workers
        else:
            k = max((i for i in range(n) if r.workers[i]), default=j)
            workers = r.workers[k]
        if not workers:
            return a
        w = min(workers, key=lambda x: bu.get(x, now))
        return Assignment(
            level=plan.levels[k],
            worker=w,
            optimal_level=a.optimal_level,
            best_effort=True,
            reason="deadline cannot be met",
        )
