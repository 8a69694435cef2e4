"""The simulated cluster's events, one small class per kind, each with its time and the method
that handles it (:meth:`Event.handle`, which reads and changes the
:class:`~argusdiff.simulator.engine.Simulator`): the period's end, a look inside the period, an
arrival, workers going down and up, a request re-dispatched, a cascade's hand-off to its heavy
level and a finished model load; the order they happen in; and the helpers they share
(admission, re-dispatch, the counterfactual finish time, measured latencies).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np

from argusdiff.admission import ADMITTED, Decision
from argusdiff.domain import Outcome, Plan, PlanTrigger, Strategy
from argusdiff.simulator.state import BIG_QUEUE, DROPPED, INF, PENDING, SERVED, _Batch

#: the :class:`~argusdiff.simulator.engine.Simulator` an event acts on (engine.py imports this
#: module, so the type is named, not imported: no import cycle, type-only ones included)
Simulator = Any

__all__ = [
    "Arrival",
    "Defer",
    "Event",
    "EventHandling",
    "ModelLoaded",
    "PeriodCheck",
    "PeriodTick",
    "Redispatch",
    "WorkerUp",
    "WorkersDown",
]


@dataclass(slots=True, eq=False)
class Event:
    """Something that happens at ``t`` (virtual seconds); :meth:`handle` does it to the cluster.

    The order (:meth:`EventHandling._next_event`): at one instant the period's end first, then a
    look inside the period, then an arrival (in trace order), then the events on the heap in the
    order they were pushed. The heap holds ``(t, seq, event)`` entries: ``seq`` is unique, so
    ``(t, seq)`` alone orders them and events are never compared."""

    t: float

    def handle(self, sim: Simulator) -> None:
        raise NotImplementedError


@dataclass(slots=True, eq=False)
class PeriodTick(Event):
    """The end of a control period (every ``period_s`` from 0): the period's
    :class:`~argusdiff.domain.ClusterStats` to the policy, its plan applied. The first one (at 0)
    sees the first period's arrivals, as if the cluster ran before the trace started (otherwise
    every policy would start planned for 0 QPM), and its models are loaded before the trace
    (``SimConfig.warm_start``)."""

    def handle(self, sim: Simulator) -> None:
        t = self.t
        sim.now = t
        sim._sync(t)
        period = sim.cfg.period_s
        arr, pidx, tiers = sim.wl.arrivals_s, sim.wl.prompt_idx, sim.tier_codes
        first = sim.first_plan
        if first:
            j0 = int(np.searchsorted(arr, period, side="left"))
            stats = sim._stats(t, period, j0, pidx[:j0], arr[:j0] - period, tiers=tiers[:j0])
        else:
            i, last = sim.next_i, sim.last_tick_i
            stats = sim._stats(t, period, i - last, pidx[last:i], arr[last:i], tiers=tiers[last:i])
        sim.last_tick_i = sim.next_i
        sim._new_plan(sim.policy.plan(stats), t, first and sim.cfg.warm_start)
        sim.first_plan = False
        if sim.check_s is not None:
            sim.next_check = t + sim.check_s
        sim.next_tick = t + period


@dataclass(slots=True, eq=False)
class PeriodCheck(Event):
    """A look inside the period (``Policy.check_s``): the period so far, not yet observed
    (``PlanTrigger.CHECK``); a plan the policy changes is applied."""

    def handle(self, sim: Simulator) -> None:
        t = self.t
        sim.now = t
        sim._sync(t)
        arr = sim.wl.arrivals_s
        i, last = sim.next_i, sim.last_tick_i
        since = t - (sim.next_tick - sim.cfg.period_s)
        stats = sim._stats(t, since, i - last, sim.wl.prompt_idx[:0], arr[last:i], reason=PlanTrigger.CHECK)
        fresh = sim.policy.plan(stats)
        if fresh is not sim.plan:
            sim._new_plan(fresh, t, False)
        sim.next_check = t + sim.check_s


@dataclass(slots=True, eq=False)
class Arrival(Event):
    """Request ``i`` arrives: the policy routes it, admission judges it, and it is queued."""

    i: int

    def handle(self, sim: Simulator) -> None:
        t, i = self.t, self.i
        sim.now = t
        if sim._fin and sim._fin[0][0] <= t:
            sim._sync(t)
        p = sim._pidx_l[i]
        view, plan = sim.view, sim.plan
        view.now_s = t
        opt = sim._cur_opt
        view.optimal_level = sim._cur_ids[opt[p]] if opt is not None else None
        up_cache = sim.cache_up(t) if sim.cache_down else True
        view.cache_healthy = up_cache
        if sim.needs_similarity:
            view.cache_similarity = sim.similarity(p) if up_cache else None
        a = sim.policy.decide(sim._request(i, p), plan, view)
        if not a.taken:
            sim.status[i] = DROPPED
        elif sim.admission is not None and not sim._admit(i, a.level, plan, t, a.verdict).admitted:
            sim.status[i] = DROPPED
            sim.refused[i] = True
            # a false refusal: queued there and then, it would have finished within its SLO
            would = sim._would_finish(i, p, t, a.level, plan, a.worker)
            sim.false_refused[i] = would <= sim._arr_l[i] + sim._slo_l[i] + 1e-9
        else:
            sim.best_effort[i] = a.best_effort
            sim._serve(i, p, t, a.level, plan, stage=0, worker=a.worker)
        if sim.progress is not None and (i + 1) % sim._report_every == 0:
            sim.progress((i + 1) / sim.wl.n_requests)


@dataclass(slots=True, eq=False)
class WorkersDown(Event):
    """A fault: the last ``count`` up workers go down for ``duration`` seconds."""

    count: int
    duration: float

    def handle(self, sim: Simulator) -> None:
        sim.now = self.t
        sim._sync(self.t)
        sim._workers_down(self.t, self.count, self.duration)


@dataclass(slots=True, eq=False)
class WorkerUp(Event):
    """Worker ``worker`` comes back, empty (its models must be loaded again); the requests that
    waited for any worker are re-dispatched."""

    worker: int

    def handle(self, sim: Simulator) -> None:
        t, w = self.t, self.worker
        sim.now = t
        sim._sync(t)
        sim.up[w] = True
        sim.up_since[w] = t
        sim.free_at[w] = t
        sim.model[w] = None
        sim.resident[w].clear()
        wid = sim.wids[w]
        sim.view.worker_models[wid] = None
        sim.view.busy_until[wid] = t
        sim.view.up.add(wid)
        sim._upv += 1
        sim.qd[wid] = sim.qlen[w]
        for i in sim.waiting:
            sim.epoch[i] += 1
            sim._push(Redispatch(t, i))
        sim.waiting.clear()


@dataclass(slots=True, eq=False)
class Redispatch(Event):
    """Request ``i``, taken off a failed worker (or waiting for one), is routed again."""

    i: int

    def handle(self, sim: Simulator) -> None:
        sim.now = self.t
        sim._sync(self.t)
        sim._redispatch(self.i, self.t, sim.plan)


@dataclass(slots=True, eq=False)
class Defer(Event):
    """Request ``i``'s light batch ends below the plan's confidence threshold: the policy hands it
    to a heavy level (stale when the request was re-dispatched since: ``epoch``)."""

    i: int
    epoch: int
    batch: _Batch

    def handle(self, sim: Simulator) -> None:
        t, i = self.t, self.i
        sim.now = t
        sim._sync(t)
        if sim.epoch[i] != self.epoch or sim.status[i] != SERVED:
            return
        ready = self.batch.finish
        if ready > t + 1e-12:  # the light batch grew after this event was scheduled
            sim._push(Defer(ready, i, self.epoch, self.batch))
            return
        sim._defer(i, t, sim.plan, self.batch.level)


@dataclass(slots=True, eq=False)
class ModelLoaded(Event):
    """A background load of ``model`` on ``worker`` ends: ARGUS §4.6 re-plans at once (a policy
    with ``replans_on_load``), once for every load that ends at this instant."""

    worker: int
    model: str

    def handle(self, sim: Simulator) -> None:
        t = self.t
        sim.now = t
        sim._sync(t)
        fresh = self._fresh(sim)
        heap = sim.heap
        while heap and heap[0][0] == t and type(heap[0][2]) is ModelLoaded:
            more = heapq.heappop(heap)[2]
            fresh = fresh or more._fresh(sim)
        if fresh:
            wl = sim.wl
            stats = sim._stats(t, sim.cfg.period_s, 0, wl.prompt_idx[:0], wl.arrivals_s[:0], reason=PlanTrigger.LOADED)
            sim._new_plan(sim.policy.plan(stats), t, False)

    def _fresh(self, sim: Simulator) -> bool:
        """The load still stands: its worker is up and the model was not evicted or reloaded."""
        return sim.up[self.worker] and sim.resident[self.worker].get(self.model) == self.t


class EventHandling:
    """The run's events in order, and what the events share (mixed into
    :class:`~argusdiff.simulator.engine.Simulator`, whose state it reads and changes)."""

    def _next_event(self) -> Event | None:
        """The next event of the run (None: the trace is done and nothing is pending). At one
        instant the period's end goes first, then a look inside the period (only strictly before
        the period's end), then the arrival, then the heap's events in push order."""
        i = self.next_i
        ta = self._arr_l[i] if i < self._n else INF
        heap = self.heap
        te = heap[0][0] if heap else INF
        if i >= self._n and not heap:
            return None
        tc, tt = self.next_check, self.next_tick
        if tc < tt and tc <= ta and tc <= te:
            return PeriodCheck(tc)
        if tt <= ta and tt <= te:
            return PeriodTick(tt)
        if te < ta:
            return heapq.heappop(heap)[2]
        self.next_i = i + 1
        return Arrival(ta, i)

    def _start_clock(self, n: int) -> None:
        """The run's clock before its first event, for ``n`` arrivals: the next arrival, the next
        period's end and look inside the period, the plan in force and its predicted optimal level
        per prompt, and the heap of the other events (``(t, seq, event)``), holding the workers'
        faults."""
        self._n = n
        self._pidx_l: list[int] = self.wl.prompt_idx.tolist()
        self._report_every = max(1, n // 200)
        self.next_i = 0
        self.last_tick_i = 0  # the first arrival of the current period
        self.next_tick = 0.0
        check_s = self.policy.check_s
        self.check_s = check_s if check_s and check_s < self.cfg.period_s else None
        self.next_check = INF
        self.first_plan = True
        self.plan: Plan | None = None
        self._cur_ids: tuple[str, ...] = ()
        self._cur_opt: np.ndarray | None = None
        self.heap: list[tuple[float, int, Event]] = []
        self.seq = 0
        for f in self.cfg.faults:
            if f.kind == "gpus":
                self._push(WorkersDown(f.start_s, f.count, f.duration_s))

    def _push(self, ev: Event) -> None:
        heapq.heappush(self.heap, (ev.t, self.seq, ev))
        self.seq += 1

    def _new_plan(self, plan: Plan, t: float, warm: bool) -> None:
        """Apply ``plan`` at ``t`` and keep its levels' predicted optimal level per prompt (the
        policy's view of each arrival)."""
        self.plan = plan
        self._apply(plan, t, warm)
        ids = plan.levels
        opt = self.wl.optimal.get(ids)
        if opt is None and ids == self.policy.profile.ids:
            opt = self.wl.optimal_for(self.policy.profile)
        self._cur_ids, self._cur_opt = ids, opt

    def _workers_down(self, t: float, count: int, duration: float) -> None:
        victims = [w for w in range(len(self.wids) - 1, -1, -1) if self.up[w]][:count]
        for w in victims:
            self.up[w] = False
            self.up_intervals.append((w, self.up_since[w], t))
            wid = self.wids[w]
            self.view.up.discard(wid)
            self._upv += 1
            self.view.busy_until[wid] = INF
            self.model[w] = None
            self.resident[w].clear()  # loads in progress are lost with the worker
            self.view.worker_models[wid] = None
            for b in self.dq[w]:
                if b.finish <= t:
                    continue
                b.finish = max(b.start, t) if b.start < t else b.start
                for i in b.members:
                    self.status[i] = PENDING
                    self.worker_arr[i] = -1
                    self.epoch[i] += 1
                    self._push(Redispatch(t, i))
            self.dq[w].clear()
            self.qlen[w] = 0
            self.qd[wid] = BIG_QUEUE
            # loads in progress are lost with the worker
            self.free_at[w] = INF
            self._push(WorkerUp(t + duration, w))

    def _redispatch(self, i: int, t: float, plan: Plan | None) -> None:
        p = int(self.wl.prompt_idx[i])
        view = self.view
        view.now_s = t
        ids = plan.levels if plan is not None else ()
        opt = self.wl.optimal.get(ids)
        if opt is None and ids and ids == self.policy.profile.ids:
            opt = self.wl.optimal_for(self.policy.profile)
        view.optimal_level = ids[opt[p]] if opt is not None else None
        up_cache = self.cache_up(t)
        view.cache_healthy = up_cache
        if self.needs_similarity:
            view.cache_similarity = self.similarity(p) if up_cache else None
        req = self._request(i, p)
        a = self.policy.decide(req, plan, view)
        if not a.taken:
            self.status[i] = DROPPED
            return
        self._serve(i, p, t, a.level, plan, stage=0, worker=a.worker)

    def _would_finish(
        self, i: int, p: int, t: float, level_id: str, plan: Plan | None, worker: str | None = None
    ) -> float:
        """When arrival ``i`` (prompt ``p``) would finish had it been queued at ``level_id`` at
        ``t``, as :meth:`_serve` would place it (nothing changes): the counterfactual behind the
        false-refusal count."""
        lv = self.levels.get(level_id)
        if lv is None:
            return INF
        served, extra = lv, 0.0
        if lv.strategy is Strategy.AC and lv.skip > 0:
            if self.cache_down and not self.cache_up(t):
                served, extra = self.levels[self.ac_base[level_id]], self.cfg.cache_timeout_s
            else:
                extra = self.cfg.cache_latency_s
                if self.similarity(p) < self.cfg.cache_min_similarity:
                    served = self.levels[self.ac_base[level_id]]
        spec = self.specs.get(served.id)
        if spec is not None:
            extra += spec.discriminator_latency_s
        bsize = plan.batch_sizes.get(served.id, 1) if plan is not None and plan.batch_sizes else 1
        rank = self._rank_l[i]
        w = self._worker_for(worker, level_id, lv, served, t, bsize, rank)
        if w is None:
            return INF
        jit = self.jit[i] if self.jit is not None else 1.0
        dq = self.dq[w]
        while dq and dq[0].finish <= t:
            self.qlen[w] -= dq.popleft().size
            self.qd[self.wids[w]] = self.qlen[w]
        start, k, join = self._slot(w, served, t, bsize, rank)
        if join:
            b = dq[k]
            return b.start + served.latency(b.size + 1) * b.jit + max(b.extra, extra)
        if k == len(dq):
            ready = self.resident[w].get(served.model)
            start = max(self.free_at[w], t, ready if ready is not None else t + served.load_time_s)
        if self.slow:
            jit *= self._speed(w, start)
        return start + served.latency(1) * jit + extra

    def _speed(self, w: int, t: float) -> float:
        """How many times slower than profiled worker ``w`` runs a batch that starts at ``t``."""
        f = 1.0
        for s, e, n, factor in self.slow:
            if w < n and s <= t < e:
                f *= factor
        return f

    def _measured(self, t: float) -> dict[str, float]:
        """Feed the batches finished by ``t`` to the latency estimator, as workers report them;
        the estimate per level (``ClusterStats.latency_scale``)."""
        ran = self._ran
        est = self.latency
        while ran and ran[0].finish <= t:
            b = ran.popleft()
            if b.finish <= b.start:  # cut short by a failure: no measurement
                continue
            lv = self.levels[b.level]
            prof = lv.latency(b.size)
            est.observe(b.level, prof * b.jit, prof)
        return est.scales()

    def _admit(self, i: int, level_id: str, plan: Plan | None, t: float, verdict=None) -> Decision:
        """Admission (argusdiff.admission) of arrival ``i`` routed to ``level_id``: the requests
        queued or in service on the up workers serving the level that it waits behind (those of
        its tier or a higher one: workers pull the highest-priority tier first), as the service's
        in-flight count of the level and tier."""
        if plan is None:
            return ADMITTED
        adm = self.admission
        if verdict is not None:  # the policy judged the deadline: admission takes its verdict
            return adm.check(
                level_id, plan=plan, queued=0, workers=0, now_s=t,
                arrival_s=self._arr_l[i], slo_s=self._slo_l[i], verdict=verdict,
            )  # fmt: skip
        if self._adm_key[0] is not plan or self._adm_key[1] != self._upv:
            self._adm_key = (plan, self._upv)
            self._adm_ws = {}
        ws = self._adm_ws.get(level_id)
        if ws is None:
            ws = self._adm_ws[level_id] = adm.workers(plan, level_id, self.view.up)
        rank = self._rank_l[i]
        queued = 0
        if rank >= self.max_rank:
            qd = self.qd
            queued = sum([qd[w] for w in ws])
        else:
            ranks = self._rank_l
            widx = self.widx
            for wid in ws:
                w = widx.get(wid)
                if w is None or not self.up[w]:
                    continue
                for b in self.dq[w]:
                    if b.finish > t and b.rank <= rank:
                        queued += sum(1 for m in b.members if ranks[m] <= rank)
        return adm.check(
            level_id, plan=plan, queued=queued, workers=len(ws),
            now_s=t, arrival_s=self._arr_l[i], slo_s=self._slo_l[i], verdict=verdict,
        )  # fmt: skip

    def _defer(self, i: int, t: float, plan: Plan | None, light: str) -> None:
        p = int(self.wl.prompt_idx[i])
        view = self.view
        view.now_s = t
        req = self._request(i, p)
        view.deferred_from = light  # which pair's heavy level the policy picks
        a = self.policy.decide_heavy(req, plan, view)
        view.deferred_from = None
        if a.outcome is Outcome.KEPT:
            return  # the policy keeps the light image
        self.deferred[i] = True
        if not a.taken:
            self.status[i] = DROPPED
            self.level_arr[i] = -1
            return
        self._serve(i, p, t, a.level, plan, stage=1, worker=a.worker)
