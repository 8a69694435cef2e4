"""The control path, live: every period (and at once when a worker joins or dies) collect the
cluster's stats, run the policy's ``plan()``, publish the plan to the router and the workers.

One :meth:`ControlLoop.tick`:

1. heartbeats → the workers that are up; a worker whose heartbeat expired is dead: its pending
   work items are re-queued (Redis: XPENDING/XCLAIM of its consumer) and it leaves the plan;
2. background cache probes while the cache is degraded (ARGUS §4.6), so the policy can switch
   approximate caching back on;
3. ``ClusterStats`` (arrivals, optimal-level counts H, per-level queues, which worker runs or loads
   which level, cache latency and error rate) → ``policy.plan()`` → publish;
4. queued work of a level the new plan no longer serves moves to the nearest served level
   (faster first), so nothing waits for a worker that will never come; an AC level whose model a
   served AC level runs stays put (those workers take its work, see :mod:`workers.loop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from argusdiff.domain import TIER_PRIORITY, Plan, PlanTrigger, Strategy
from argusdiff.period import PeriodStats, cluster_stats
from argusdiff.service.dispatch import stop_task
from argusdiff.service.metrics import ServiceMetrics
from argusdiff.service.ports import ControlledRouter, ControlQueue
from argusdiff.service.transport.protocol import ControlStore

__all__ = ["ControlLoop"]

log = logging.getLogger("argusdiff.control")


class ControlLoop:
    def __init__(
        self,
        *,
        router: ControlledRouter,
        store: ControlStore,
        queue: ControlQueue,
        metrics: ServiceMetrics,
        period_s: float,
        heartbeat_s: float,
        level_ids: tuple[str, ...],
        levels: Mapping[str, Any] | None = None,
        cache_probe: Callable[[], Any] | None = None,
        probe_burst: int = 3,
        probe_period_s: float = 0.0,
        clock=time.time,
    ) -> None:
        self.router = router
        self.policy = router.policy
        self.store = store
        self.queue = queue
        self.metrics = metrics
        self.period_s = period_s
        self.heartbeat_s = heartbeat_s
        self.level_ids = level_ids
        self.levels = dict(levels or {})  # level id -> ApproxLevel (AC siblings share workers)
        self.cache_probe = cache_probe
        self.probe_burst = probe_burst
        self.probe_period_s = probe_period_s
        self._last_probe = float("-inf")
        self.clock = clock
        self.plan: Plan | None = None
        self.alive: dict[str, dict[str, Any]] = {}
        self.last_tick = clock()
        self._last_full: tuple[int, float] = (0, period_s)
        self.ticks = 0
        self.requeued = 0
        self.migrated = 0
        self.last_error: str | None = None
        self._version = 0
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._next_tick = 0.0  # when the next full tick is due (monotonic clock)
        self._policy_plan: Plan | None = None  # what the policy's plan() returned last

    # -- one period ------------------------------------------------------------------------

    def adopt_published(self) -> None:
        """After a restart: continue the published plan's version numbers."""
        try:
            prev = self.store.read_plan()
        except Exception as exc:
            log.warning("cannot read the published plan: %s", exc)
            return
        if prev is not None:
            self._version = max(self._version, prev.version)

    def fence(self) -> tuple[str, str] | None:
        """What the queue's side effects of this loop are fenced by: (lease key, holder) for a
        leader among many routers; None for the only one (embedded)."""
        return None

    def _requeue_dead(self, dead: set[str]) -> int:
        moved = 0
        for w in sorted(dead):
            for lv in self.level_ids:
                moved += int(self.queue.requeue_consumer(lv, w, fence=self.fence()) or 0)
                self.queue.drop_consumer(lv, w)  # its consumer goes with it (nothing pending now)
            self.store.forget_worker(w)
            log.warning("worker %s stopped heartbeating: removed from the plan", w)
        return moved

    def _probe_cache(self) -> None:
        health = self.router.cache_health
        if self.cache_probe is None:
            return
        primary_ac = self.router.profile.strategies == {Strategy.AC}
        switched = self.plan is not None and primary_ac and self.plan.strategy is not Strategy.AC
        if health.healthy and not switched:
            return
        if time.monotonic() - self._last_probe < self.probe_period_s:
            return
        self._last_probe = time.monotonic()
        ok = 0
        for _ in range(self.probe_burst):
            t0 = time.perf_counter()
            try:
                self.cache_probe()
            except Exception as exc:
                health.record(None, error=True)
                self.metrics.cache_lookups.labels("error").inc()
                log.info("cache probe failed: %s", exc)
                return
            dt = time.perf_counter() - t0
            if dt <= health.latency_limit_s:
                ok += 1
        if ok == self.probe_burst:
            health.reset()
            for _ in range(self.probe_burst):
                health.record(0.0)

    def step(
        self, period: PeriodStats, elapsed_s: float | None = None, *, now_s: float | None = None, check: bool = False
    ) -> Plan | None:
        """The synchronous part of a tick (runs in a thread: Redis calls, the solver).

        ``elapsed_s`` given: an early re-plan (a worker joined or died) that repeats the last full
        period's arrival rate instead of measuring a partial period. Else the period ends at
        ``now_s`` (the tick's time, default now), and the period's arrival times are binned for the
        demand predictor as the simulator bins them (:func:`argusdiff.period.cluster_stats`).
        ``check``: a look inside the period (``Policy.check_s``): ``period`` is the period so far,
        which goes on; returns None (nothing published) when the policy keeps its plan."""
        from argusdiff.predictors import bin_length_s

        now = self.clock() if now_s is None else now_s
        if check:
            elapsed = max(1e-3, now - self.last_tick)
        elif elapsed_s is None:
            elapsed = max(1e-3, now - self.last_tick)
            self.last_tick = now
        else:
            elapsed = elapsed_s
        alive, dead = self.store.heartbeats()
        if dead:
            n = self._requeue_dead(dead)
            self.requeued += n
            if n:
                self.metrics.requeued.inc(n)
        self.alive = alive
        self._probe_cache()
        level_queue: dict[str, int] = {}
        for lv in self.level_ids:
            try:
                level_queue[lv] = int(self.queue.qsize(lv)) + int(self.queue.pending(lv))
            except Exception as exc:
                log.warning("queue depth of %s unavailable: %s", lv, exc)
        for lv, depth in level_queue.items():
            self.metrics.backlog.labels(lv).set(depth)
        tier_load = self.router.tier_load  # this router's in-flight images
        for lv in self.level_ids:
            for rank, tier in enumerate(TIER_PRIORITY):
                self.metrics.queue_depth_tier.labels(lv, tier).set(tier_load.get((lv, rank), 0))
        workers = tuple(sorted(alive))
        current = {w: info.get("level") for w, info in alive.items()}
        loading = {w: info["loading"] for w, info in alive.items() if info.get("loading")}
        resident = {w: tuple(info.get("resident") or ()) for w, info in alive.items()}
        view_q = {}
        if self.plan is not None:
            view = self.router.view(now, self.plan, None, self.policy.slo_s)
            view_q = {w: view.queue_lengths.get(w, 0) for w in workers}
        health = self.router.cache_health
        stats = cluster_stats(
            period,
            now_s=now,
            period_s=elapsed,
            bin_s=bin_length_s(self.policy.predictor_spec),
            reason=PlanTrigger.CHECK if check else PlanTrigger.PERIOD if elapsed_s is None else PlanTrigger.REPLAN,
            workers=workers,
            queue_lengths=view_q,
            current=current,
            loading=loading,
            cache_latency_s=health.median_latency_s(),
            cache_error_rate=health.error_rate(),
            level_queue=level_queue,
            resident=resident,
        )
        plan = self.policy.plan(stats)
        if check and plan is self._policy_plan:
            return None  # the policy keeps its plan
        self._policy_plan = plan
        plan.validate()
        if elapsed_s is None and not check:
            self._last_full = (period.arrivals, elapsed)
        self._version = max(self._version + 1, plan.version)
        plan = plan.renumbered(self._version)  # with the routing object the policy attached
        self.store.publish_plan(plan)
        self._release_strays(plan)
        self._migrate_orphans(plan, level_queue)
        self._observe(plan)
        self.plan = plan
        self.ticks += 1
        return plan

    def _release_strays(self, plan: Plan) -> None:
        """Delivery ``PER_WORKER``: every worker's own queue of a level it does not serve under
        ``plan`` goes to the level's shared queue, and the queues of workers no longer in the plan
        are forgotten once empty. A worker releases its own queue itself when it switches, and a
        dead one's is re-queued (:meth:`_requeue_dead`); this catches what routers queued there
        with an older plan after that (a router registers a worker's queue before it queues there:
        ``owners``), so no accepted item waits behind a worker that will not take it."""
        if not self.router.per_worker:
            return
        owners = getattr(self.queue, "owners", None)
        if owners is None:
            return
        serving: dict[str, set[str]] = {}
        for w, lv in plan.assignment.items():
            if lv is not None:
                for x in (lv, *plan.unserved_siblings(self.levels, lv)):
                    serving.setdefault(x, set()).add(w)
        for lv in self.level_ids:
            try:
                strays = sorted(owners(lv) - serving.get(lv, set()))
                for w in strays:
                    n = int(self.queue.release(lv, w) or 0)
                    if n:
                        self.migrated += n
                        log.info("released %d items of %s's own queue of %s to the level", n, w, lv)
                    if w not in plan.assignment:
                        self.queue.forget_owner(lv, w)
            except Exception as exc:
                log.warning("cannot sweep the workers' own queues of %s: %s", lv, exc)

    def _migrate_orphans(self, plan: Plan, level_queue: dict[str, int]) -> None:
        from argusdiff.policies.base import nearest_served

        served = {lv for lv in plan.assignment.values() if lv is not None}
        if not served:
            return
        order = list(self.level_ids)
        has_worker = [lv in served for lv in order]
        # AC levels a served level's workers take from as well (workers.loop)
        covered = {lv for s in served for lv in plan.unserved_siblings(self.levels, s)}
        for lv, depth in level_queue.items():
            if depth <= 0 or lv in served or lv in covered or lv not in order:
                continue
            # the data path's fallback: the nearest served level, faster first (keeps deadlines)
            target = order[nearest_served(has_worker, order.index(lv))]
            try:
                n = int(self.queue.migrate(lv, target))
            except Exception as exc:
                log.warning("cannot move queued work from %s to %s: %s", lv, target, exc)
                continue
            if n:
                self.migrated += n
                log.info("moved %d queued items from unserved level %s to %s", n, lv, target)

    def _observe(self, plan: Plan) -> None:
        m = self.metrics
        prev = self.plan
        if prev is None or dict(prev.assignment) != dict(plan.assignment) or prev.strategy != plan.strategy:
            m.plan_changes.inc()
        if prev is not None and prev.strategy != plan.strategy:
            m.strategy_switches.labels(plan.strategy.value).inc()
        m.plan_version.set(plan.version)
        m.predicted_qpm.set(plan.predicted_qpm)
        m.saturated.set(1 if plan.saturated else 0)
        m.workers_up.set(len(self.alive))
        counts = Counter(lv for lv in plan.assignment.values() if lv is not None)
        for lv in self.level_ids:
            m.workers_at.labels(lv).set(counts.get(lv, 0))
        m.capacity_qpm.set(self._capacity_qpm(plan, counts))
        for s in Strategy:
            m.strategy.labels(s.value).set(1 if plan.strategy is s else 0)

    def _capacity_qpm(self, plan: Plan, counts: Counter) -> float:
        """What the plan's assigned workers serve per minute at their levels' batch sizes."""
        total = 0.0
        for lv, n in counts.items():
            level = self.levels.get(lv)
            if level is not None:
                b = int(plan.batch_sizes.get(lv, 1))
                total += n * (level.peak_qpm if b <= 1 else level.throughput_qpm(b))
        return total

    # -- the loop --------------------------------------------------------------------------

    @property
    def check_s(self) -> float | None:
        """How often the loop looks inside a period for the policy (``Policy.check_s``; None: never)."""
        c = self.policy.check_s
        return c if c and c < self.period_s else None

    async def check(self) -> Plan | None:
        """A look inside the period for the policy (``Policy.check_s``): the period so far, which
        goes on counting; a new plan is published only when the policy makes one."""
        return await self._step_and_publish("check", self.router.peek_period(), None, check=True)

    async def _step_and_publish(
        self,
        what: str,
        period: PeriodStats,
        elapsed: float | None,
        on_error: Callable[[], None] | None = None,
        **kw: Any,
    ) -> Plan | None:
        """:meth:`step` on a worker thread, then the plan it makes published to the router; a
        failure keeps the previous plan (``on_error`` runs, the error is recorded and logged as
        the control ``what``'s); None: nothing published."""
        try:
            plan = await asyncio.to_thread(self.step, period, elapsed, **kw)
        except Exception as exc:
            if on_error is not None:
                on_error()
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("control %s failed: %s", what, self.last_error)
            return None
        if plan is None:  # a look inside the period that kept the plan
            return None
        self.last_error = None
        self.router.set_plan(plan, frozenset(self.alive))
        return plan

    def next_check(self, now: float) -> float:
        """When the next look inside the period is due (monotonic clock; inf: none before the
        period's end)."""
        c = self.check_s
        if c is None:
            return float("inf")
        start = self._next_tick - self.period_s
        k = math.floor((now - start) / c + 1e-9) + 1
        due = start + k * c
        return due if due < self._next_tick - 1e-6 else float("inf")

    async def tick(self, full: bool = True, due: float | None = None) -> Plan | None:
        """One control tick. ``full``: closes a control period (its arrivals feed the predictors);
        else an early re-plan on the last full period's rate, the current period keeps counting.
        ``due``: when the tick was scheduled (monotonic clock); a tick that runs late still ends
        its period at that time, so every period has its nominal length and the predictor's bins
        keep their alignment (the few arrivals of the delay count in its last bin)."""
        now: float | None = None
        if full:
            # the period ends now: its counts and its arrivals' times, taken together on the event
            # loop (the only writer), so that they describe the same arrivals
            now = self.clock()
            if due is not None:
                late = time.monotonic() - due
                if 0.0 < late < self.period_s:
                    now -= late
            period = self.router.take_period()
            elapsed = None
        else:  # the last full period's rate; the current period keeps counting
            arrivals, elapsed = self._last_full
            period = PeriodStats(arrivals, latency_scale=self.router.latency_scales())
        # a failure keeps the previous plan and gives the period back, so demand is not under-counted
        give_back = (lambda: self.router.give_back(period)) if full else None
        return await self._step_and_publish("tick", period, elapsed, give_back, now_s=now)

    def trigger(self) -> None:
        """Re-plan now (e.g. a test or an operator)."""
        self._wake.set()

    async def _membership_changed(self) -> bool:
        try:
            alive, dead = await asyncio.to_thread(self.store.heartbeats)
        except Exception:
            return False
        return set(alive) != set(self.alive) or bool(dead)

    def next_period(self, due: float, now: float) -> float:
        """The next full tick after one due at ``due`` ran (monotonic clock): one period later, so
        the periods keep their length however long the tick took (the predictor's bins stay aligned
        to them); periods missed meanwhile are skipped."""
        due += self.period_s
        if due <= now:
            due += self.period_s * (1 + int((now - due) // self.period_s))
        return due

    def restart_period(self) -> None:
        """Start a control period now: the next full tick is one period from now, and the cadence
        continues from there (e.g. to line the periods up with a replayed trace)."""
        self.last_tick = self.clock()
        self._next_tick = time.monotonic() + self.period_s

    async def run(self) -> None:
        await asyncio.to_thread(self.adopt_published)
        self._next_tick = time.monotonic()
        await self.tick()
        self._next_tick = self.next_period(self._next_tick, time.monotonic())
        next_check = self.next_check(time.monotonic())
        while True:
            timeout = max(0.0, min(self.heartbeat_s, self._next_tick - time.monotonic(), next_check - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            next_check = await self.due_work(next_check, self._membership_changed, pass_due=True)

    async def due_work(
        self, next_check: float, membership_changed: Callable[[], Awaitable[bool]], *, pass_due: bool
    ) -> float:
        """One turn of a control loop's schedule (this loop's and the cluster leader's): the full
        tick when the period is due (then the next period and its first look inside it), else a
        look inside the period when one is due, else an early re-plan when woken or when
        ``membership_changed()`` says the workers changed. ``pass_due``: the tick ends its period at
        the time it was due (:meth:`tick`). Returns when the next look inside the period is due."""
        if time.monotonic() >= self._next_tick:
            self._wake.clear()
            await self.tick(due=self._next_tick if pass_due else None)
            self._next_tick = self.next_period(self._next_tick, time.monotonic())
            return self.next_check(time.monotonic())
        if time.monotonic() >= next_check:
            await self.check()
            return self.next_check(time.monotonic())
        if self._wake.is_set() or await membership_changed():
            self._wake.clear()
            await self.tick(full=False)
        return next_check

    def start(self) -> asyncio.Task:
        self._task = asyncio.create_task(self.run(), name="argusdiff-control")
        return self._task

    async def stop(self) -> None:
        await stop_task(self._task)
