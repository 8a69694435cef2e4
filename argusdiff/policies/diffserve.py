"""DiffServe (MLSys '25): a light→heavy cascade with a discriminator.

Every query runs on the light model; the discriminator's confidence in the light image decides:
at or above the threshold t the light image is returned, below it the query is re-run on the heavy
model. As the artifact's controller (``src/controller/controller.py``, ``eventLoop``) runs it:
demand is refreshed every control period (1 s) and the MILP (``solver.cascade.solve_cascade``)
re-solved every ``allocation_period_s`` (5 s, ``clockCounter % 5 == 0``) — or at once when the
set of up workers changes — picking the workers and batch sizes of each model and the largest t
the cluster can afford for the predicted demand (× the predictor's margin, DiffServe's λ), given
the current queues. Every worker keeps both models loaded (the artifact's ``loadFromStorage``
loads the light and the heavy model on first use): plans list both in ``preload``, so moving a
worker between the two is a swap between resident models and costs no load.

``diffserve-static`` is provisioned once for an anticipated peak demand given in advance
(option ``peak_qpm``; the replay passes the trace's highest 1-minute rate) and keeps that plan
(re-solved only when the set of up workers changes).

As in the DiffServe artifact, a query is dropped when its queue wait plus the profiled runtime
would exceed ``drop_factor`` (1.5) × SLO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from argusdiff.domain import (
    ApproxLevel,
    Assignment,
    ClusterStats,
    Outcome,
    Plan,
    PlanTrigger,
    Refusal,
    Request,
    RouteReason,
    Strategy,
)
from argusdiff.policies.base import (
    CommonOptions,
    Policy,
    PolicyError,
    RouteView,
    Routing,
    frozen_init,
    require,
    select_worker,
)
from solver.cascade import solve_cascade

__all__ = [
    "ALLOCATION_PERIOD_S",
    "DiffServe",
    "DiffServeOptions",
    "DiffServeRouting",
    "DiffServeStatic",
    "DiffServeStaticOptions",
]

#: DiffServe artifact, src/controller/controller.py: ``allocateResources()`` runs when
#: ``clockCounter % 5 == 0`` in a 1 s event loop
ALLOCATION_PERIOD_S = 5.0


def _bucket_rate(qpm: float) -> float:
    """Demand on a 4% grid (the MILP's answer changes little within it)."""
    if qpm <= 1.0:
        return round(max(qpm, 0.0), 1)
    return round(1.04 ** round(math.log(qpm) / math.log(1.04)), 2)


def _bucket_queue(q: int) -> int:
    """Queue length rounded down to 0, 1, 2, 4, 8, ... 128."""
    q = min(max(q, 0), 128)
    return 0 if q == 0 else 1 << (q.bit_length() - 1)


@dataclass(frozen=True, kw_only=True)
class DiffServeOptions(CommonOptions):
    """``backend``: the cascade MILP's backend; ``drop_factor``: a query is dropped when its queue
    wait plus runtime would exceed this × SLO (the DiffServe artifact: 1.5); ``allocation_period_s``:
    how often the MILP is re-solved (None: :data:`ALLOCATION_PERIOD_S`, the artifact's 5 s);
    ``memo``: solve on rounded inputs and reuse the answers (demand on a 4% grid, queue lengths down
    to a power of two; ours, for speed: docs/baselines.md) — False solves every allocation on the
    exact demand and queues, as the artifact does."""

    backend: str = "auto"
    drop_factor: float = 1.5
    allocation_period_s: float | None = None
    memo: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        require("drop_factor", self.drop_factor, lambda v: v > 0, "> 0")
        if self.allocation_period_s is not None:
            period = self.allocation_period_s
            require("allocation_period_s", period, lambda v: v >= 0, ">= 0 (or None: the artifact's 5 s)")


@dataclass(frozen=True, kw_only=True)
class DiffServeStaticOptions(DiffServeOptions):
    """``peak_qpm``: the anticipated peak demand the cascade is provisioned for, given in advance."""

    peak_qpm: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.peak_qpm is not None:
            require("peak_qpm", self.peak_qpm, lambda v: v > 0, "> 0 (QPM)")


class DiffServe(Policy, name="diffserve", family="cascade"):
    summary = "light->heavy cascade, discriminator threshold from the MILP each period"
    options_type = DiffServeOptions
    options: DiffServeOptions
    strategies = frozenset({Strategy.CASCADE})
    cascade = True
    source_predictor = "diffserve-artifact"

    def setup(self) -> None:
        profile = self.profile
        if profile.cascade is None:
            raise PolicyError(f"policy {self.name!r} needs a profile with a [cascade] table, got {profile.name!r}")
        self.spec = profile.cascade
        self.light = profile.level(self.spec.light)
        self.heavy = profile.level(self.spec.heavy)
        self.demand = self.new_demand_predictor()
        period = self.options.allocation_period_s
        self.allocation_period_s = ALLOCATION_PERIOD_S if period is None else float(period)
        self._plan: Plan | None = None
        self._workers_up: tuple[str, ...] = ()
        self._last_alloc = -math.inf
        self._last_feasible: tuple[int, Any] | None = None
        self._memo: dict[tuple, Any] = {}

    def demand_qpm(self, stats: ClusterStats) -> float:
        """The demand estimate (QPM, before the margin), refreshed with each period's arrivals."""
        if stats.reason is PlanTrigger.PERIOD:
            self.demand.observe_stats(stats)
        return float(self.demand.estimate)

    def solve(self, stats: ClusterStats, demand: float):
        """The MILP for this period. Its answer is memoised on rounded inputs (demand to a 4%
        grid, queue lengths down to a power of two, capped at 128): a 1 s control loop sees the
        same rounded inputs again and again, and one solve costs 5-15 ms on this machine."""

        ql_raw = max(0, int(stats.level_queue.get(self.light.id, 0)))
        qh_raw = max(0, int(stats.level_queue.get(self.heavy.id, 0)))
        if self.options.memo:
            d, ql, qh = _bucket_rate(demand), _bucket_queue(ql_raw), _bucket_queue(qh_raw)
        else:
            d, ql, qh = max(float(demand), 0.0), ql_raw, qh_raw
        key = (len(stats.workers), d, ql, qh)
        sol = self._memo.get(key) if self.options.memo else None
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
                overprovision=self.predictor_spec.margin,
                backend=self.options.backend,
            )
            if self.options.memo and len(self._memo) < 100_000:
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
            return self.no_worker_plan(stats, ids, Strategy.CASCADE, demand)
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
        x_light, x_heavy = int(sol.x_light), int(sol.x_heavy)
        if x_light < 1:  # every query starts on the light model
            x_light, x_heavy = 1, max(0, x_heavy - 1)
        if x_heavy < 1 and sol.threshold > 0 and x_light > 1:  # deferred queries need a heavy worker
            x_light, x_heavy = x_light - 1, 1
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
            preload=self._both_models(stats),
        )

    def _both_models(self, stats: ClusterStats) -> dict[str, tuple[str, ...]]:
        """Every worker keeps the light and the heavy model loaded (artifact: ``loadFromStorage``)."""
        both = (self.light.id, self.heavy.id)
        return {w: both for w in stats.workers}

    def plan(self, stats: ClusterStats) -> Plan:
        demand = self.demand_qpm(stats)
        due = (
            self._plan is None
            or stats.workers != self._workers_up
            or stats.now_s - self._last_alloc >= self.allocation_period_s - 1e-9
        )
        if due:
            self._plan = self.routed(self.make_plan(stats, demand))
            self._workers_up = stats.workers
            self._last_alloc = stats.now_s
        return self._plan

    def _carries(self, sol: Any, demand: float) -> bool:
        """Whether a split serves ``demand`` (× the margin) at its threshold."""
        d = demand * self.predictor_spec.margin
        light = int(sol.x_light) * self.light.throughput_qpm(max(1, int(sol.b_light)))
        heavy = int(sol.x_heavy) * self.heavy.throughput_qpm(max(1, int(sol.b_heavy)))
        return light >= d and heavy >= d * self.spec.f(float(sol.threshold))

    # ---- data path -----------------------------------------------------------------------

    def make_routing(self, plan: Plan) -> DiffServeRouting:
        return DiffServeRouting(plan, self.light, self.heavy, drop_factor=self.options.drop_factor, slo_s=self.slo_s)


class DiffServeStatic(DiffServe, name="diffserve-static", family="cascade"):
    summary = "light->heavy cascade provisioned once for the peak"
    options_type = DiffServeStaticOptions
    options: DiffServeStaticOptions
    needs_peak = True
    source_predictor = None  # provisioned for a peak given in advance: it predicts nothing

    def plan(self, stats: ClusterStats) -> Plan:
        peak = self.options.peak_qpm
        if peak is None:
            raise PolicyError("policy 'diffserve-static' needs the anticipated peak demand (option peak_qpm)")
        if self._plan is None or stats.workers != self._workers_up:
            idle = ClusterStats(
                now_s=stats.now_s, period_s=stats.period_s, arrivals=0, workers=stats.workers, current=stats.current
            )
            self._plan = self.routed(self.make_plan(idle, float(peak)))
            self._workers_up = stats.workers
        return self._plan

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["predictor"] = f"none: provisioned for an anticipated peak of {self.options.peak_qpm} QPM given in advance"
        return out


@dataclass(frozen=True, slots=True)
class _Stage:
    """One model of the cascade under one plan: its workers, the planned batch size's processing
    times the routing reads (per image in a full batch, a full batch) and one image's alone."""

    id: str
    workers: tuple[str, ...]
    per_image_s: float
    batch_s: float
    alone_s: float

    @classmethod
    def of(cls, plan: Plan, level: ApproxLevel) -> _Stage:
        b = plan.batch_sizes.get(level.id, 1)
        return cls(
            id=level.id,
            workers=tuple(w for w, lv in plan.assignment.items() if lv == level.id),
            per_image_s=level.latency(b) / b,
            batch_s=level.latency(b),
            alone_s=level.latency(1),
        )


class DiffServeRouting(Routing):
    """DiffServe's data path for one plan (immutable): every query to the light model's worker with
    the shortest queue, a deferral to the heavy model's (none planned: the light image is kept),
    and a query dropped when its wait so far plus the predicted queue wait and runtime would exceed
    ``drop_factor`` × its SLO (``slo_s``: the SLO of a request without one)."""

    __slots__ = ("drop_factor", "heavy", "light", "slo_s")

    def __init__(self, plan: Plan, light: ApproxLevel, heavy: ApproxLevel, *, drop_factor: float, slo_s: float) -> None:
        frozen_init(
            self, light=_Stage.of(plan, light), heavy=_Stage.of(plan, heavy), drop_factor=drop_factor, slo_s=slo_s
        )

    def send(self, request: Request, view: RouteView, stage: _Stage) -> Assignment:
        workers = stage.workers
        if not workers:
            return Assignment(
                level=stage.id, worker=None, reason=f"no {stage.id} worker: waits", cause=RouteReason.NO_WORKER
            )
        w = select_worker(workers, view, stage.per_image_s)
        wait = max(0.0, view.busy_until.get(w, view.now_s) - view.now_s)
        # an idle worker starts this query alone; a busy one takes it in a batch of up to b
        runtime = stage.batch_s if wait > 0 else stage.alone_s
        slo = request.slo_s if request.slo_s is not None else self.slo_s
        if (view.now_s - request.arrival_s) + wait + runtime > self.drop_factor * slo:
            return Assignment(
                level=None,
                worker=w,
                refusal=Refusal.POLICY,
                reason="predicted to miss 1.5 x SLO",
                outcome=Outcome.DROPPED,
                cause=RouteReason.PREDICTED_LATE,
            )
        return Assignment(level=stage.id, worker=w)

    def route(self, request: Request, view: RouteView, rng: np.random.Generator) -> Assignment:
        return self.send(request, view, self.light)

    def route_heavy(self, request: Request, view: RouteView) -> Assignment:
        """A deferred query; with no heavy worker in the plan the light image is returned
        (``level=None`` without ``dropped``)."""
        if not self.heavy.workers:
            return Assignment(
                level=None,
                reason="no heavy worker: light image returned",
                outcome=Outcome.KEPT,
                cause=RouteReason.NO_HEAVY,
            )
        return self.send(request, view, self.heavy)
