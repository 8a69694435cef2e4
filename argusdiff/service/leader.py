"""One control loop across many routers: a Redis lease with a fencing token.

Every ``argusdiff serve --redis`` router runs a :class:`ClusterControlLoop`. Exactly one of them,
the leader, runs the policy's ``plan()`` and publishes plans; the others (followers) route with the
published plan and feed the leader their statistics (:mod:`argusdiff.service.cluster`).

* **Lease.** ``ns:leader`` holds ``"<router id>|<token>"`` with an expiry of ``leader_lease_s``
  (``SET NX PX``). A router that finds no lease takes it with a new token: ``ns:leader:epoch`` is
  incremented in the same script, so tokens rise with every change of leader. The leader renews
  the lease several times per lease (every poll); a follower polls at the same rate, so a dead
  leader's lease is taken over at most ``leader_lease_s`` + one poll after its last renewal.
* **Fencing.** Every plan write carries the writer's token; one Lua script checks that the token
  is the current epoch, that the lease is held by that token, and that the plan version rises,
  then writes the plan, the policy state, the version and an entry in ``ns:plan:log`` and
  announces it. A stale leader (paused past its lease, partitioned away) has its write refused
  atomically: :class:`StaleLeader`. It then steps down.
* **Takeover.** A new leader loads the last published plan (its version, its assignment as the
  workers' current levels) and the policy state published with it
  (:mod:`argusdiff.policies.state`: demand EWMA, affinity histograms H, active strategy), re-queues
  work a dead router's control loop had taken mid-migration, and plans at once: its first plan is
  the next version, made from the cluster's statistics since the dead leader's last plan.
* **Followers** read ``ns:plan:version`` every poll and the plan when it changed.

Embedded mode (no Redis) has one router, always the leader; the loop is
:class:`~argusdiff.service.control.ControlLoop`'s own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import socket
import time
import uuid
from typing import Any

from argusdiff.domain import Plan
from argusdiff.errors import ArgusdiffError
from argusdiff.period import PeriodStats
from argusdiff.service.cluster import ClusterBus, ClusterRouterView, parse_holder
from argusdiff.service.control import ControlLoop
from argusdiff.service.errors import FencedOut
from argusdiff.service.plans import plan_to_dict
from argusdiff.service.transport.redis_control import worker_view
from argusdiff.service.transport.redis_streams import RedisKeys

__all__ = ["ClusterControlLoop", "FencedPlanStore", "LeaderLease", "StaleLeader", "new_router_id"]

log = logging.getLogger("argusdiff.leader")

PLAN_LOG_MAXLEN = 1000

# KEYS: lease, epoch. ARGV: router id, ttl ms, token held (0: none).
# Returns the token now held, or 0 (another router holds the lease).
_LEASE_STEP = """
local cur = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. '|' .. ARGV[3]
if cur then
  if ARGV[3] ~= '0' and cur == mine then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(ARGV[3])
  end
  return 0
end
if ARGV[3] ~= '0' and redis.call('GET', KEYS[2]) == ARGV[3] then
  -- our lease lapsed and nobody took it since: continue under the same token
  redis.call('SET', KEYS[1], mine, 'NX', 'PX', ARGV[2])
  return tonumber(ARGV[3])
end
local t = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. t, 'NX', 'PX', ARGV[2])
return t
"""

# KEYS: lease. ARGV: router id, token. Deletes the lease only if we hold it.
_LEASE_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] .. '|' .. ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS: lease, epoch, plan, plan version, policy state, plan log, worker assignment, worker view.
# ARGV: router id, token, version, plan JSON, state JSON ('' keeps it), created_s, log maxlen, channel,
#       worker view JSON, then worker id, level JSON pairs.
# Returns 1 (written), -1 (stale token), -2 (lease not held by this token), -3 (version not rising).
_PUBLISH = """
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[2]) then return -1 end
if redis.call('GET', KEYS[1]) ~= ARGV[1] .. '|' .. ARGV[2] then return -2 end
if tonumber(ARGV[3]) <= tonumber(redis.call('GET', KEYS[4]) or '0') then return -3 end
redis.call('SET', KEYS[3], ARGV[4])
redis.call('SET', KEYS[4], ARGV[3])
if ARGV[5] ~= '' then redis.call('SET', KEYS[5], ARGV[5]) end
redis.call('SET', KEYS[8], ARGV[9])
redis.call('DEL', KEYS[7])
for i = 10, #ARGV, 2000 do
  redis.call('HSET', KEYS[7], unpack(ARGV, i, math.min(i + 1999, #ARGV)))
end
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[7], '*',
  'version', ARGV[3], 'token', ARGV[2], 'router', ARGV[1], 'created_s', ARGV[6])
redis.call('PUBLISH', ARGV[8], ARGV[3])
return 1
"""

_REFUSALS = {
    -1: "a newer leader holds a higher token",
    -2: "the lease is not held",
    -3: "the plan version is not newer",
}


async def _unchanged() -> bool:
    """No look at the workers' membership this turn (it is looked at once per heartbeat)."""
    return False


class StaleLeader(ArgusdiffError):
    """A plan write was refused: this router no longer holds the leader lease."""


def new_router_id() -> str:
    """Unique per process start (a restarted router never reuses its old lease or token)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class LeaderLease:
    """The leader lease of one router (synchronous; call from a thread)."""

    def __init__(self, client: Any, namespace: str, router_id: str, lease_s: float) -> None:
        self.r = client
        self.keys = RedisKeys(namespace)
        self.router_id = router_id
        self.lease_ms = max(1, int(lease_s * 1000))
        self.token: int | None = None
        self._step = client.register_script(_LEASE_STEP)
        self._release = client.register_script(_LEASE_RELEASE)

    def step(self) -> int | None:
        """Acquire (when free) or renew the lease; the token held, or None (a follower)."""
        keys = [self.keys.leader, self.keys.leader_epoch]
        got = int(self._step(keys=keys, args=[self.router_id, self.lease_ms, self.token or 0]))
        self.token = got or None
        return self.token

    def lost(self) -> None:
        self.token = None

    def release(self) -> bool:
        """Hand the lease back (clean shutdown), so another router takes over at its next poll."""
        token, self.token = self.token, None
        if token is None:
            return False
        return bool(self._release(keys=[self.keys.leader], args=[self.router_id, token]))

    def holder(self) -> tuple[str, int] | None:
        raw = self.r.get(self.keys.leader)
        return parse_holder(raw)


class FencedPlanStore:
    """A :class:`~argusdiff.service.transport.redis_control.RedisControlStore` whose plan writes carry the lease's
    token (see the module doc); everything else is delegated."""

    def __init__(self, store: Any, lease: LeaderLease, state_fn: Any = None) -> None:
        self.store = store
        self.lease = lease
        self.state_fn = state_fn
        self.refused = 0
        self.written = 0
        self._publish = lease.r.register_script(_PUBLISH)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def publish_plan(self, plan: Plan, token: int | None = None) -> None:
        token = self.lease.token if token is None else token
        if token is None:
            raise StaleLeader("not the leader: plan not published")
        state = ""
        if self.state_fn is not None:
            state = json.dumps(self.state_fn())
        k = self.lease.keys
        data = plan_to_dict(plan)
        assign = [x for w, lv in data["assignment"].items() for x in (w, json.dumps(lv))]
        res = int(
            self._publish(
                keys=[k.leader, k.leader_epoch, k.plan, k.plan_version, k.plan_state, k.plan_log, k.plan_assign,
                      k.plan_view],
                args=[self.lease.router_id, token, int(plan.version), json.dumps(data), state,
                      repr(float(plan.created_s)), PLAN_LOG_MAXLEN, k.plan_channel, json.dumps(worker_view(data)),
                      *assign],
            )
        )  # fmt: skip
        if res != 1:
            self.refused += 1
            if token == self.lease.token:
                self.lease.lost()
            raise StaleLeader(f"plan v{plan.version} with token {token} refused: {_REFUSALS.get(res, res)}")
        self.written += 1

    def read_state(self) -> dict | None:
        raw = self.lease.r.get(self.lease.keys.plan_state)
        return None if raw is None else json.loads(raw)

    def published_version(self) -> int:
        raw = self.lease.r.get(self.lease.keys.plan_version)
        return int(raw) if raw is not None else 0

    def read_plan(self) -> Plan | None:
        return self.store.read_plan()


class ClusterControlLoop(ControlLoop):
    """:class:`ControlLoop` for many routers (Redis) or one (embedded).

    With a Redis store: leader election, fenced plan writes, takeover from the published plan and
    policy state, followers that route with the published plan, and cluster-wide statistics
    (:class:`~argusdiff.service.cluster.ClusterBus`). Without: the parent's loop. Both publish the
    autoscaling signal (:mod:`argusdiff.service.autoscale`) with every plan."""

    def __init__(self, *, router_id: str | None = None, lease_s: float | None = None, **kwargs: Any) -> None:
        from argusdiff.service.autoscale import AutoscaleMetrics
        from argusdiff.service.transport.redis_control import RedisControlStore

        router = kwargs.pop("router")
        store = kwargs.pop("store")
        queue = kwargs["queue"]
        self.real_router = router
        self.router_id = router_id or new_router_id()
        self.role = "leader"
        self.bus: ClusterBus | None = None
        self.lease: LeaderLease | None = None
        period = float(kwargs["period_s"])
        self.lease_s = float(lease_s) if lease_s else 0.75 * period
        self.poll_s = min(float(kwargs["heartbeat_s"]), self.lease_s / 4)
        if isinstance(store, RedisControlStore):
            client = queue.r
            ns = queue.keys.ns
            self.bus = ClusterBus(client, ns, self.router_id)
            self.lease = LeaderLease(client, ns, self.router_id, self.lease_s)
            router = ClusterRouterView(router, self.bus)
            store = FencedPlanStore(store, self.lease, self._export_state)
            # this router's control consumer: a dead router's items taken mid-migration can be found
            queue.consumer = f"control-{self.router_id}"
            self.role = "follower"
        super().__init__(router=router, store=store, **kwargs)
        self.autoscale = AutoscaleMetrics(self.metrics, self.levels)
        self.takeovers = 0
        self.imported: list[str] = []  # the policy state parts the last takeover continued from
        self.full_ticks = 0
        self.cluster_arrivals = 0  # arrivals of every router, as the leader drained them
        self.became_leader_s: float | None = None
        self._membership_checked = 0.0

    # -- policy state -------------------------------------------------------------------------

    def _export_state(self) -> dict:
        from argusdiff.policies.state import export_state

        return export_state(self.policy)

    # -- roles ----------------------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        return self.role == "leader"

    def fence(self) -> tuple[str, str] | None:
        """The lease this leader's queue side effects run under (``router|token``); a router that
        holds none is refused them (:class:`StaleLeader`)."""
        if self.lease is None:
            return None
        token = self.lease.token
        if token is None:
            raise StaleLeader("not the leader: dead workers' items are not re-queued")
        return self.lease.keys.leader, f"{self.lease.router_id}|{token}"

    def _requeue_dead(self, dead: set[str]) -> int:
        try:
            return super()._requeue_dead(dead)
        except FencedOut as exc:
            if self.lease is not None:
                self.lease.lost()
            raise StaleLeader(str(exc)) from exc

    def _take_over(self) -> None:
        """Continue from the published plan and policy state (runs in a thread)."""
        from argusdiff.policies.state import import_state

        assert self.bus is not None
        now = self.clock()
        store = self.store
        plan = store.read_plan()
        state = store.read_state()
        taken = self.imported = import_state(self.policy, state) if state else []
        if plan is not None:
            self._version = max(self._version, plan.version)
            self.plan = plan
            # this period started when the last plan was made (its statistics accumulated since)
            self.last_tick = min(now - 1e-3, max(plan.created_s, now - 3 * self.period_s))
        self._requeue_dead_routers()
        self.takeovers += 1
        self.became_leader_s = now
        log.info(
            "router %s leads with token %s from plan v%s (state: %s)",
            self.router_id, self.lease.token if self.lease else None,
            plan.version if plan else None, ", ".join(taken) or "none",
        )  # fmt: skip

    def _requeue_dead_routers(self) -> None:
        """Items a dead router's control loop took from a stream mid-migration go back to it."""
        assert self.bus is not None
        alive = set(self.bus.routers())
        for lv in self.level_ids:
            try:
                holders = self.queue.pending_by_consumer(lv)
            except Exception as exc:
                log.warning("cannot list pending work of %s: %s", lv, exc)
                continue
            for consumer, n in holders.items():
                rid = consumer.removeprefix("control-")
                if n and consumer.startswith("control-") and rid != self.router_id and rid not in alive:
                    moved = int(self.queue.requeue_consumer(lv, consumer, fence=self.fence()) or 0)
                    self.requeued += moved
                    log.warning("re-queued %d items of %s taken by dead router %s", moved, lv, rid)

    def step(self, period: Any, elapsed_s: float | None = None, **kwargs: Any) -> Plan:
        if self.bus is None or elapsed_s is not None:
            return super().step(period, elapsed_s, **kwargs)
        if kwargs.get("check"):
            # a look inside the period: every router's counts so far (the others' flushed, this
            # one's not yet), left where they are
            seen = self.bus.peek() + dataclasses.replace(period, arrival_times=None)
            cluster = dataclasses.replace(seen, arrival_times=period.arrival_times, latency_scale=period.latency_scale)
            return super().step(cluster, None, **kwargs)
        # a full period: this router's counts join the cluster's, and the leader takes them all
        # (its own arrivals' times bin them only when they are all of them)
        local: PeriodStats = period
        drained = self.bus.flush_and_drain(local)
        try:
            cluster = dataclasses.replace(drained, arrival_times=local.arrival_times, latency_scale=local.latency_scale)
            plan = super().step(cluster, None, **kwargs)
            self.cluster_arrivals += drained.arrivals
            return plan
        except Exception:
            with contextlib.suppress(Exception):  # the tick gives ``local`` back to the router
                self.bus.flush(drained.minus(local))
            raise

    def _observe(self, plan: Plan) -> None:
        super()._observe(plan)
        self.autoscale.observe(plan, len(self.alive) or len(plan.assignment))
        self.metrics_leader()

    def metrics_leader(self) -> None:
        self.autoscale.leader.set(1 if self.leading else 0)
        token = self.lease.token if self.lease is not None else 0
        self.autoscale.token.set(token or 0)

    # -- the loop -------------------------------------------------------------------------------

    async def _follow(self) -> None:
        """A follower: take the published plan when its version changed."""
        store = self.store
        version = await asyncio.to_thread(store.published_version)
        if self.plan is not None and version == self.plan.version and self.real_router.plan is not None:
            return
        plan = await asyncio.to_thread(store.read_plan)
        if plan is None:
            return
        self._observe(plan)
        self.plan = plan
        self._version = max(self._version, plan.version)
        self.real_router.set_plan(plan, frozenset(w for w, lv in plan.assignment.items()))

    async def _membership_changed(self) -> bool:
        """Workers joined or left: one sorted-set read (``membership``), not every heartbeat hash."""
        membership = getattr(self.store, "membership", None)
        if membership is None:
            return await super()._membership_changed()
        try:
            alive, expired = await asyncio.to_thread(membership)
        except Exception:
            return False
        if not alive and self.alive:  # workers of a version without the sorted set
            return await super()._membership_changed()
        return alive != set(self.alive) or bool(expired)

    async def _refresh_alive(self) -> None:
        """A follower's view of the workers (``/readyz``, ``/v1/plan``), once per period."""
        alive, _dead = await asyncio.to_thread(self.store.heartbeats)
        self.alive = alive

    async def _beat(self) -> None:
        """Every router, every heartbeat: its counts into the cluster's, its heartbeat out, the
        others' summaries in."""
        assert self.bus is not None
        bus = self.bus
        local = self.real_router.period.take(times=False)  # the arrival times stay for the tick
        try:
            await asyncio.to_thread(bus.flush, local)
        except Exception:
            self.real_router.period.add(local)
            raise
        info = {
            "role": self.role,
            "token": self.lease.token if self.lease else None,
            "plan_version": self.plan.version if self.plan is not None else None,
            "ticks": self.ticks,
            "takeovers": self.takeovers,
            "refused_writes": getattr(self.store, "refused", 0),
            **self.router.summary(),
        }
        ttl = max(3 * self.poll_s, 3 * self.heartbeat_s, 2.0)
        await asyncio.to_thread(bus.beat_router, info, ttl)
        await asyncio.to_thread(self.router.refresh)

    async def _lease_step(self) -> bool:
        assert self.lease is not None
        try:
            token = await asyncio.to_thread(self.lease.step)
        except Exception as exc:  # Redis unreachable: nobody can publish; keep the role, retry
            self.last_error = f"lease: {type(exc).__name__}: {exc}"
            return self.leading
        return token is not None

    async def run(self) -> None:
        if self.bus is None:
            return await super().run()
        await asyncio.to_thread(self.adopt_published)
        self._next_tick = 0.0
        next_check = float("inf")
        next_beat = 0.0
        next_alive = 0.0
        while True:
            try:
                leader = await self._lease_step()
                now = time.monotonic()
                if leader and not self.leading:
                    await asyncio.to_thread(self._take_over)
                    self.role = "leader"
                    self._next_tick = now  # plan at once
                elif not leader and self.leading:
                    log.warning("router %s lost the leader lease: following", self.router_id)
                    self.role = "follower"
                    self.metrics_leader()
                if self.leading:
                    due = now - self._membership_checked >= self.heartbeat_s
                    membership = self._membership_changed if due else _unchanged
                    next_check = await self.due_work(next_check, membership, pass_due=False)
                    if due:
                        self._membership_checked = now
                else:
                    await self._follow()
                    if now >= next_alive:
                        await self._refresh_alive()
                        next_alive = now + self.period_s
                if time.monotonic() >= next_beat:
                    await self._beat()
                    next_beat = time.monotonic() + self.heartbeat_s
            except asyncio.CancelledError:
                raise
            except StaleLeader as exc:
                self.role = "follower"
                self.last_error = str(exc)
                log.warning("%s", exc)
            except Exception as exc:
                msg = f"{type(exc).__name__}: {exc}"
                if msg != self.last_error:  # once per distinct failure, not every poll of an outage
                    log.warning("cluster control step failed: %s", msg)
                self.last_error = msg
            wait = self.poll_s
            if self.leading:
                wait = max(0.0, min(wait, self._next_tick - time.monotonic(), next_check - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def tick(self, full: bool = True, due: float | None = None) -> Plan | None:
        plan = await super().tick(full, due)
        if full and plan is not None:
            self.full_ticks += 1
        if plan is None and self.lease is not None and self.lease.token is None and self.role == "leader":
            self.role = "follower"  # the write was refused: another router leads
        return plan

    async def stop(self) -> None:
        await super().stop()
        if self.bus is not None and self.lease is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.lease.release)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.bus.leave)
            self.role = "follower"
