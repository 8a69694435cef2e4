"""How the simulated workers serve (mixed into :class:`~argusdiff.simulator.engine.Simulator`,
whose state it reads and changes): the worker a request is delivered to or pulled by, the
batch it joins or starts (greedy batching, the higher-priority tier first), its service time
(jitter, slow workers, cache lookups, the discriminator) and its outcome.
"""

from __future__ import annotations

import heapq

from argusdiff.domain import ApproxLevel, Plan, Strategy
from argusdiff.errors import ConfigError
from argusdiff.simulator.events import Defer
from argusdiff.simulator.state import INF, PENDING, SERVED, _Batch

__all__ = ["WorkerService"]


class WorkerService:
    """The data path mechanism: delivery, pulling, batching and serving one request."""

    def _slot(self, w: int, served: ApproxLevel, t: float, bsize: int, rank: int) -> tuple[float, int, bool]:
        """Where a request of tier rank ``rank`` at ``served`` goes on worker ``w``'s queue:
        ``(start, k, join)``. The worker pulls the highest-priority tier first, so the request goes
        ahead of the batches at the tail that have not started and hold only lower-priority work
        of the same model (``k`` is the first of them; ``len(dq)`` when there is none, or when the
        worker has a model load queued after its work). ``join``: it joins the batch at ``k - 1``
        (greedy batching, when that batch has not started, runs ``served`` and has room), else
        the one at ``k`` when that runs ``served`` and has room (``k < len(dq)``), else it starts
        a new batch there."""
        dq = self.dq[w]
        n = len(dq)
        k = n
        ready = self.resident[w].get(served.model)
        if n and ready is not None and self.free_at[w] == dq[-1].finish:
            levels = self.levels
            model = served.model
            while k > 0:
                b = dq[k - 1]
                if b.start <= t or b.rank <= rank or levels[b.level].model != model:
                    break
                k -= 1
        if bsize > 1 and k > 0:
            prev = dq[k - 1]
            if prev.start > t and prev.level == served.id and prev.size < bsize:
                return prev.start, k - 1, True
        if k == n:
            free = max(self.free_at[w], t)
            start = free + served.load_time_s if ready is None else max(free, ready)
            return start, k, False
        nxt = dq[k]
        if bsize > 1 and nxt.level == served.id and nxt.size < bsize:
            return nxt.start, k, True
        start = max(t, dq[k - 1].finish if k > 0 else t, ready if ready is not None else t)
        return start, k, False

    def _shift(self, w: int, k: int) -> None:
        """Start the batches of ``w`` from index ``k`` on no earlier than the batch before each
        finishes (after a request went ahead of them); the worker frees up when the last does."""
        dq = self.dq[w]
        prev = dq[k - 1].finish
        for j in range(k, len(dq)):
            b = dq[j]
            if b.start < prev:
                b.finish += prev - b.start
                b.start = prev
                heapq.heappush(self._fin, (b.finish, w))
            prev = b.finish
        self.free_at[w] = prev
        self.view.busy_until[self.wids[w]] = prev

    def _puller(self, level_id: str, served: ApproxLevel, t: float, bsize: int, rank: int) -> int | None:
        """The up worker that pulls ``level_id``'s queue (its planned workers, or the workers of an
        AC sibling level when the plan gives it none) and starts this request first (``_slot``:
        a higher-priority tier goes ahead of queued lower-priority work)."""
        best = None
        best_key = INF
        up, dqs, free_at, resident = self.up, self.dq, self.free_at, self.resident
        model, sid, load = served.model, served.id, served.load_time_s
        # no worker starts it before ``t`` (with a load time >= 0): the first that starts it at
        # ``t`` wins (ties go to the first), so the scan stops there
        now = t if load >= 0 else -INF
        for w in self.pullers.get(level_id, ()):
            if not up[w]:
                continue
            dq = dqs[w]
            if dq:
                last = dq[-1]
                if last.start > t and last.rank > rank:
                    key = self._slot(w, served, t, bsize, rank)[0]  # it may go ahead of queued work
                    if key < best_key:
                        best_key, best = key, w
                        if key <= now:
                            break
                    continue
                # _slot at the tail of the queue (k == len(dq)), inlined: the common case
                if bsize > 1 and last.start > t and last.level == sid and last.size < bsize:
                    if last.start < best_key:
                        best_key, best = last.start, w
                    continue
            f = free_at[w]
            free = f if f > t else t
            ready = resident[w].get(model)
            key = free + load if ready is None else (ready if ready > free else free)
            if key < best_key:
                best_key, best = key, w
                if key <= now:
                    break
        return best

    def _pick_up_worker(self, level: ApproxLevel, t: float) -> int | None:
        """The up worker that would start ``level`` first (a model load counted when needed)."""
        best = None
        best_key = INF
        for w in range(len(self.wids)):
            if not self.up[w]:
                continue
            ready = self.resident[w].get(level.model)
            key = max(self.free_at[w], t) + level.load_time_s if ready is None else max(self.free_at[w], t, ready)
            if key < best_key:
                best_key, best = key, w
        return best

    def _worker_for(
        self, worker: str | None, level_id: str, lv: ApproxLevel, served: ApproxLevel, t: float, bsize: int, rank: int
    ) -> int | None:
        """The worker a request at ``level_id`` (served as ``served``) waits for: the policy's pick
        where it delivers per worker, else the worker of the level that starts it first, else any up
        worker that could load it; None: no worker is up."""
        w = self._deliver_to(worker)
        if w is None:
            w = self._puller(level_id, served, t, bsize, rank)
        if w is None:
            w = self._pick_up_worker(lv, t)
        return w

    def _deliver_to(self, worker: str | None) -> int | None:
        """The worker whose own queue a request waits in (``Delivery.PER_WORKER``): the policy's
        pick while it is up; None: the level's shared pull (``Delivery.SHARED``, or no pick)."""
        if not self.per_worker or worker is None:
            return None
        w = self.widx.get(worker)
        return w if w is not None and self.up[w] else None

    def _serve(
        self, i: int, p: int, t: float, level_id: str, plan: Plan | None, stage: int, worker: str | None = None
    ) -> None:
        lv = self.levels.get(level_id)
        if lv is None:
            raise ConfigError(f"policy {self.policy.name!r} routed to unknown level {level_id!r}")
        served = lv
        extra = 0.0
        hit = False
        if lv.strategy is Strategy.AC and lv.skip > 0:
            if self.cache_down and not self.cache_up(t):
                extra = self.cfg.cache_timeout_s
                served = self.levels[self.ac_base[level_id]]
            else:
                extra = self.cfg.cache_latency_s
                hit = bool(self.similarity(p) >= self.cfg.cache_min_similarity)
                self.period.looked_up(hit)
                if not hit:
                    served = self.levels[self.ac_base[level_id]]
        bsize = plan.batch_sizes.get(served.id, 1) if plan is not None and plan.batch_sizes else 1
        # the policy's delivery: the queue of the worker it picked (PER_WORKER), or, as the service's
        # shared per-level queues, the worker of its level that starts it first (FIFO over the
        # level's workers; the policy's worker is then an estimate)
        rank = self._rank_l[i]
        w = self._worker_for(worker, level_id, lv, served, t, bsize, rank)
        if w is None:  # no worker is up: accepted work waits for the first one to come back
            self.status[i] = PENDING
            self.waiting.append(i)
            return
        self.period.routed(level_id)
        ready = self._need(w, served, t)
        spec = self.specs.get(served.id) if stage == 0 else None
        if spec is not None:
            extra += spec.discriminator_latency_s
        jit = self.jit[i] if self.jit is not None else 1.0
        dq = self.dq[w]
        # bring the queue up to date before touching its tail
        now = t
        while dq and dq[0].finish <= now:
            self.qlen[w] -= dq.popleft().size
        start, k, join = self._slot(w, served, t, bsize, rank)
        if join:
            batch = dq[k]
            batch.size += 1
            batch.members.append(i)
            batch.finish = batch.start + served.latency(batch.size) * batch.jit + max(batch.extra, extra)
            batch.extra = max(batch.extra, extra)
            batch.rank = min(batch.rank, rank)
            k += 1
        else:
            if k == len(dq):
                start = max(self.free_at[w], t, ready)
            if self.slow:
                jit *= self._speed(w, start)
            finish = start + served.latency(1) * jit + extra
            batch = _Batch(start, finish, 1, served.id, [i], w, jit, extra, rank)
            dq.insert(k, batch)
            self.busy.append(batch)
            self._ran.append(batch)
            k += 1
        self.qlen[w] += 1
        self.qd[self.wids[w]] = self.qlen[w]
        heapq.heappush(self._fin, (batch.finish, w))
        if k < len(dq):
            self._shift(w, k)  # the lower-priority work it went ahead of starts later
        else:
            self.free_at[w] = batch.finish
            self.view.busy_until[self.wids[w]] = batch.finish
        self.req_batch[i] = batch
        self.worker_arr[i] = w
        self.status[i] = SERVED
        self.level_arr[i] = self.cat_index[served.id]
        self.quality[i] = self.wl.quality[served.id][p]
        self.relative[i] = self.wl.relative[served.id][p]
        self.hit[i] = hit
        self.miss[i] = served is not lv
        if served.strategy is Strategy.AC:
            self.cached[p] = True
        if spec is not None:
            threshold = plan.thresholds.get(served.id, 0.0) if plan is not None else 0.0
            if self.confidences[served.id][p] < threshold:
                self._push(Defer(batch.finish, i, int(self.epoch[i]), batch))
