"""The simulated control path (mixed into :class:`~argusdiff.simulator.engine.Simulator`, whose
state it reads and changes): every ``period_s`` the :class:`~argusdiff.domain.ClusterStats` the
policy plans from (built from the period's :class:`~argusdiff.period.PeriodStats`, as the live
control loop builds it), and a plan applied to the workers.
"""

from __future__ import annotations

import numpy as np

from argusdiff.domain import ClusterStats, Plan, PlanTrigger
from argusdiff.errors import ConfigError
from argusdiff.period import PeriodStats, cluster_stats

__all__ = ["ControlPath"]


class ControlPath:
    """The control path: what the policy sees at a period's end, and a plan applied to the workers."""

    def _stats(
        self,
        t: float,
        period: float,
        arrivals: int,
        recent: np.ndarray,
        times: np.ndarray,
        reason: PlanTrigger = PlanTrigger.PERIOD,
        tiers: np.ndarray | None = None,
    ) -> ClusterStats:
        """What the policy sees at ``t``: ``recent`` the prompt indices and ``times`` the arrival
        times of the period ``[t - period, t)`` (binned for the demand predictor as the live control
        loop bins them: :func:`argusdiff.predictors.arrival_bins`)."""
        ups = tuple(w for k, w in enumerate(self.wids) if self.up[k])
        q = self.qd
        queue_lengths = {w: q[w] for w in ups}
        current = {w: self.wlevel[self.widx[w]] for w in ups}
        loading = {
            w: self.wlevel[self.widx[w]]
            for w in ups
            if self.load_end[self.widx[w]] > t and self.wlevel[self.widx[w]] is not None
        }
        resident = {w: tuple(m for m, r in self.resident[self.widx[w]].items() if r <= t) for w in ups}
        affinity: dict[str, int] = {}
        if len(recent):
            for ids, pred in self.wl.optimal.items():
                if not all(lv in self.levels for lv in ids):
                    continue
                counts = np.bincount(pred[recent], minlength=len(ids))
                for lv, c in zip(ids, counts, strict=True):
                    affinity[lv] = int(c)
        down = 0.0
        lo = t - period
        for s, e in self.cache_down:
            down += max(0.0, min(e, t) - max(s, lo))
        err = down / period
        if not self.cache_up(t):
            err = 1.0  # the probes at this tick fail
        cache_latency = self.cfg.cache_latency_s if self.cache_up(t) else self.cfg.cache_timeout_s
        level_queue: dict[str, int] = {}
        for w in ups:
            lv = self.wlevel[self.widx[w]]
            if lv is not None:
                level_queue[lv] = level_queue.get(lv, 0) + queue_lengths[w]
        if reason is PlanTrigger.PERIOD:
            tier_arrivals: dict[str, int] = {}
            if tiers is not None and len(tiers):
                counts = np.bincount(tiers, minlength=len(self.tier_names))
                tier_arrivals = {name: int(c) for name, c in zip(self.tier_names, counts, strict=True) if c}
            # the period's arrivals join what the accumulator counted as they were routed
            times_ = tuple(times.tolist())
            self.period.add(PeriodStats(int(arrivals), affinity, tier_arrivals=tier_arrivals, arrival_times=times_))
            seen = self.period.take(self._measured(t))
        elif reason is PlanTrigger.CHECK:
            # the period so far, shown, not taken: its arrivals are observed at the period's end
            seen = PeriodStats(int(arrivals), arrival_times=tuple(times.tolist()), latency_scale=self._measured(t))
        else:
            seen = PeriodStats(int(arrivals), latency_scale=self._measured(t))
        # binned for the demand predictor as the live control loop bins them
        return cluster_stats(
            seen,
            now_s=t,
            period_s=period,
            bin_s=self.bin_s,
            reason=reason,
            with_cache=self.needs_similarity,
            workers=ups,
            queue_lengths=queue_lengths,
            current=current,
            loading=loading,
            cache_latency_s=cache_latency if self.needs_similarity else None,
            cache_error_rate=err if self.needs_similarity else 0.0,
            level_queue=level_queue,
            resident=resident,
        )

    def _apply(self, plan: Plan, t: float, warm: bool) -> None:
        widx = self.widx
        # which workers pull each level's queue (workers.loop): its planned workers, and for an AC
        # level the plan gives no worker, the workers of a level of the same model and N
        pullers: dict[str, list[int]] = {}
        for wid, lv in plan.assignment.items():
            if lv is not None and wid in widx:
                pullers.setdefault(lv, []).append(widx[wid])
        for lv in list(pullers):
            for sib in plan.unserved_siblings(self.levels, lv):
                pullers.setdefault(sib, []).extend(pullers[lv])
        self.pullers = pullers
        for wid, lv in plan.assignment.items():
            w = widx.get(wid)
            if w is None:
                raise ConfigError(f"policy {self.policy.name!r} planned unknown worker {wid!r}")
            self.wlevel[w] = lv
            level = self.levels.get(lv) if lv is not None else None
            if lv is not None and level is None:
                raise ConfigError(f"policy {self.policy.name!r} planned unknown level {lv!r}")
            pre = []
            for p in plan.preload.get(wid, ()):
                plv = self.levels.get(p)
                if plv is None:
                    raise ConfigError(f"policy {self.policy.name!r} preloads unknown level {p!r}")
                pre.append(plv)
            self.pinned[w] = frozenset([level.model] if level is not None else []) | {x.model for x in pre}
            if level is None or not self.up[w]:
                continue
            self.model[w] = level.model
            self.view.worker_models[wid] = level.model
            self._need(w, level, t, warm=warm)
            for plv in pre:
                self._preload(w, plv, t, warm=warm)
        self.plans.append(
            {
                "t": t,
                "version": plan.version,
                "strategy": plan.strategy.value,
                "counts": dict(zip(plan.levels, plan.counts(), strict=True)),
                "predicted_qpm": plan.predicted_qpm,
                "workers": sum(1 for lv in plan.assignment.values() if lv is not None),
                "saturated": plan.saturated,
                "margin": plan.margin,
                "thresholds": dict(plan.thresholds),
                "latency_scale": dict(plan.latency_scale),
                "notes": list(plan.notes),
            }
        )
