"""The simulated cluster's events (mixed into :class:`~argusdiff.simulator.engine.Simulator`,
whose state it reads and changes): the event heap, workers going down and up, slow workers,
finished model loads, re-dispatch of a failed worker's requests, admission of an arrival and
the hand-off of a cascade's deferred request to its heavy level.
"""

from __future__ import annotations

import heapq
from typing import Any

from argusdiff.admission import ADMITTED, Decision
from argusdiff.domain import Outcome, Plan, Strategy
from argusdiff.simulator.state import BIG_QUEUE, DROPPED, INF, PENDING, SERVED

__all__ = ["EventHandling"]


class EventHandling:
    """The events of a run and what each does to the cluster."""

    def _push(self, t: float, *payload: Any) -> None:
        heapq.heappush(self.heap, (t, self.seq, *payload))
        self.seq += 1

    def _event(self, ev: tuple, plan: Plan | None) -> None:
        t, _, kind = ev[0], ev[1], ev[2]
        if kind == "down":
            self._workers_down(t, ev[3], ev[4])
        elif kind == "up":
            w = ev[3]
            self.up[w] = True
            self.up_since[w] = t
            self.free_at[w] = t
            self.model[w] = None
            self.resident[w].clear()
            self.view.worker_models[self.wids[w]] = None
            self.view.busy_until[self.wids[w]] = t
            self.view.up.add(self.wids[w])
            self._upv += 1
            self.qd[self.wids[w]] = self.qlen[w]
            for i in self.waiting:
                self.epoch[i] += 1
                self._push(t, "redispatch", i)
            self.waiting.clear()
        elif kind == "redispatch":
            i = ev[3]
            self._redispatch(i, t, plan)
        elif kind == "defer":
            i, epoch, batch = ev[3], ev[4], ev[5]
            if self.epoch[i] != epoch or self.status[i] != SERVED:
                return
            ready = batch.finish
            if ready > t + 1e-12:  # the light batch grew after this event was scheduled
                self._push(ready, "defer", i, epoch, batch)
                return
            self._defer(i, t, plan, batch.level)

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
                    self._push(t, "redispatch", i)
            self.dq[w].clear()
            self.qlen[w] = 0
            self.qd[wid] = BIG_QUEUE
            # loads in progress are lost with the worker
            self.free_at[w] = INF
            self._push(t + duration, "up", w)

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
