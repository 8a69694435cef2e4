"""Statistics shared by every router through Redis, so the leader plans on the whole cluster.

Each router counts what it routes (:class:`argusdiff.period.PeriodStats`: arrivals, the
classifier's optimal levels H, per-level and per-tier arrivals, cache lookups and hits) and, every
heartbeat, adds those counts to one Redis hash, ``ns:stats``
(``HINCRBY``). At the end of a control period the leader adds its own counts and takes the whole
hash in one script (``HINCRBY``… ``HGETALL`` + ``DEL``): every count lands in exactly one period,
and a failed plan puts the counts back. Each router also publishes a heartbeat
(``ns:router:<id>``, with expiry; ids in ``ns:routers``): its role, the plan version it routes
with, its in-flight requests per level (and, under ``Delivery.PER_WORKER``, per worker), its
cache-health window and its latency measurements (:meth:`argusdiff.latency.LatencyEstimator.windows`).
The leader's :class:`ClusterRouterView` plans on the sum of the routers' in-flight requests (per
level, and per worker for a per-worker policy), on the routers' combined cache health and on the
measured latencies pooled over every router's window (each router measures the results that come
back to it); a background probe that finds the cache healthy again resets every router's window
(``ns:cache:health-epoch``).

:func:`cluster_status` is what ``GET /v1/cluster`` and ``argusdiff status`` show.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from argusdiff.period import PeriodStats
from argusdiff.service.transport.redis_client import control_prefix

if TYPE_CHECKING:
    from argusdiff.domain import Plan, Profile
    from argusdiff.policies.base import Policy, RouteView
    from argusdiff.service.health import CacheHealth
    from argusdiff.service.router import Router

__all__ = [
    "ClusterBus",
    "ClusterCacheHealth",
    "ClusterRouterView",
    "cluster_status",
    "format_status",
    "local_status",
    "parse_holder",
    "service_status",
]

# KEYS: stats hash. ARGV: field, increment, ... Returns the hash (field, value, ...) and empties it.
_FLUSH_AND_DRAIN = """
for i = 1, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
local all = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
return all
"""


def parse_holder(raw: Any) -> tuple[str, int] | None:
    """The leader lease's holder (``router id|fencing token``, as :class:`argusdiff.service.leader.LeaderLease`
    writes it), or None."""
    if raw is None:
        return None
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    rid, _, tok = text.rpartition("|")
    return (rid, int(tok)) if tok.isdigit() else None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _fields(period: PeriodStats) -> list[Any]:
    return [x for name, n in period.counts().items() for x in (name, n)]


def _period(flat: list[Any]) -> PeriodStats:
    return PeriodStats.from_counts((_text(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2))


class ClusterBus:
    """The Redis side of the shared statistics and router heartbeats (synchronous)."""

    def __init__(self, client: Any, namespace: str, router_id: str) -> None:
        namespace = control_prefix(namespace)  # the control keys' hash tag (Redis Cluster: one slot)
        self.r = client
        self.ns = namespace
        self.router_id = router_id
        self.stats_key = f"{namespace}:stats"
        self.routers_key = f"{namespace}:routers"
        self.health_epoch_key = f"{namespace}:cache:health-epoch"
        self._drain = client.register_script(_FLUSH_AND_DRAIN)
        self.started_s = time.time()
        self.peers: dict[str, dict] = {}  # other routers' last heartbeats

    def router_key(self, router_id: str) -> str:
        return f"{self.ns}:router:{router_id}"

    # -- period statistics ----------------------------------------------------------------------

    def flush(self, period: PeriodStats) -> None:
        fields = _fields(period)
        if not fields:
            return
        pipe = self.r.pipeline(transaction=True)
        for i in range(0, len(fields), 2):
            pipe.hincrby(self.stats_key, fields[i], fields[i + 1])
        pipe.execute()

    def peek(self) -> PeriodStats:
        """Every router's counts flushed since the last drain, left in place (a look inside the
        period)."""
        raw = self.r.hgetall(self.stats_key) or {}
        return PeriodStats.from_counts((_text(k), int(v)) for k, v in raw.items())

    def flush_and_drain(self, period: PeriodStats) -> PeriodStats:
        """Add ``period`` and take every router's counts since the last drain, atomically (counts
        only: no arrival times, no latencies)."""
        return _period(self._drain(keys=[self.stats_key], args=_fields(period)))

    # -- router heartbeats ----------------------------------------------------------------------

    def beat_router(self, info: dict[str, Any], ttl_s: float) -> None:
        body = {
            "id": self.router_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_s": self.started_s,
            "ts": time.time(),
            **info,
        }
        pipe = self.r.pipeline(transaction=True)
        pipe.set(self.router_key(self.router_id), json.dumps(body), px=max(1, int(ttl_s * 1000)))
        pipe.sadd(self.routers_key, self.router_id)
        pipe.execute()

    def routers(self) -> dict[str, dict]:
        """Live routers (id → last heartbeat); ids whose heartbeat expired are forgotten."""
        ids = sorted(_text(x) for x in self.r.smembers(self.routers_key))
        if not ids:
            return {}
        raws = self.r.mget([self.router_key(i) for i in ids])
        alive = {}
        gone = []
        for rid, raw in zip(ids, raws, strict=True):
            if raw is None:
                gone.append(rid)
            else:
                alive[rid] = json.loads(raw)
        if gone:
            self.r.srem(self.routers_key, *gone)
        return alive

    def leave(self) -> None:
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(self.router_key(self.router_id))
        pipe.srem(self.routers_key, self.router_id)
        pipe.execute()

    def health_epoch(self) -> int:
        raw = self.r.get(self.health_epoch_key)
        return int(raw) if raw is not None else 0

    def bump_health_epoch(self) -> int:
        return int(self.r.incr(self.health_epoch_key))


class ClusterCacheHealth:
    """The routers' cache-health windows combined, as :class:`~argusdiff.service.health.CacheHealth`
    reads (median latency weighted by samples, error share over all samples): what the leader's
    control loop reads and its probes write (:class:`~argusdiff.service.ports.ControlCacheHealth`).
    Samples are recorded in this router's window; the others' come with their heartbeats."""

    def __init__(self, local: CacheHealth) -> None:
        self.local = local
        self.peers: list[dict] = []
        self.reset_pending = False

    @property
    def latency_limit_s(self) -> float:
        return self.local.latency_limit_s

    @property
    def error_limit(self) -> float:
        return self.local.error_limit

    def _windows(self) -> list[dict]:
        return [summarize_health(self.local), *self.peers]

    def median_latency_s(self) -> float | None:
        pts = [(w["median_latency_s"], w["samples"] - w["errors"]) for w in self._windows()]
        pts = [(m, n) for m, n in pts if m is not None and n > 0]
        if not pts:
            return None
        pts.sort()
        half = sum(n for _, n in pts) / 2
        seen = 0
        for m, n in pts:
            seen += n
            if seen >= half:
                return float(m)
        return float(pts[-1][0])

    def error_rate(self) -> float:
        ws = self._windows()
        total = sum(w["samples"] for w in ws)
        return sum(w["errors"] for w in ws) / total if total else 0.0

    @property
    def healthy(self) -> bool:
        if self.error_rate() > self.local.error_limit:
            return False
        med = self.median_latency_s()
        return med is None or med <= self.local.latency_limit_s

    def record(self, latency_s: float | None, *, error: bool = False, hit: bool | None = None) -> None:
        self.local.record(latency_s, error=error, hit=hit)

    def reset(self) -> None:
        """Probes found the cache healthy: forget this window and, at the next heartbeat, every
        router's (the epoch bump)."""
        self.local.reset()
        self.peers = []
        self.reset_pending = True


def summarize_health(health: CacheHealth) -> dict[str, Any]:
    n = int(health.samples)
    return {
        "samples": n,
        "errors": round(health.error_rate() * n),
        "median_latency_s": health.median_latency_s(),
        "healthy": bool(health.healthy),
        "hit_ratio": health.hit_ratio(),
    }


class ClusterRouterView:
    """The router as the leader's control loop sees it
    (:class:`~argusdiff.service.ports.ControlledRouter`), member by member: the policy, the
    profile, the period's traffic, the plan handed back and the metrics' in-flight counts are the
    local router's; the queues behind the view count every router's in-flight requests and the
    cache's health combines every router's window. Nothing else of the router shows through: a new
    observation the control loop reads is a member of the protocol, implemented here too."""

    def __init__(self, router: Router, bus: ClusterBus) -> None:
        self._router = router
        self._bus = bus
        self.cache_health = ClusterCacheHealth(router.cache_health)
        self._peer_load: Counter[str] = Counter()
        self._peer_worker_load: Counter[str] = Counter()  # other routers' in-flight per worker (PER_WORKER)
        self._peer_latency: list[dict[str, list[float]]] = []  # other routers' latency windows
        self._epoch: int | None = None

    # -- the local router's ---------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        return self._router.policy

    @property
    def profile(self) -> Profile:
        return self._router.profile

    @property
    def per_worker(self) -> bool:
        return self._router.per_worker

    @property
    def tier_load(self) -> Mapping[tuple[str, int], int]:
        """This router's in-flight images per (level, tier rank): its own queue-depth metrics."""
        return self._router.tier_load

    def take_period(self) -> PeriodStats:
        """This router's period (the leader adds the others' counts: ``ClusterBus.flush_and_drain``)
        with every router's measured latencies (:meth:`latency_scales`)."""
        return self._router.take_period(self.latency_scales())

    def peek_period(self) -> PeriodStats:
        """This router's period so far (the leader adds the others' counts: ``ClusterBus.peek``)
        with every router's measured latencies (:meth:`latency_scales`)."""
        return self._router.peek_period(self.latency_scales())

    def give_back(self, period: PeriodStats) -> None:
        self._router.give_back(period)

    def latency_scales(self) -> dict[str, float]:
        """Each measured level's latency / profiled over every router's measurements: this
        router's window pooled with the others' (their heartbeats)."""
        return self._router.latency_scales(self._peer_latency)

    def set_plan(self, plan: Plan, up: frozenset[str]) -> None:
        self._router.set_plan(plan, up)

    # -- the cluster's --------------------------------------------------------------------------

    @property
    def level_load(self) -> Counter[str]:
        """Every router's in-flight images per level."""
        return self._router.level_load + self._peer_load

    @property
    def worker_load(self) -> Counter[str]:
        """Every router's in-flight images per worker (``Delivery.PER_WORKER``: each worker's own
        queue; empty otherwise)."""
        return self._router.worker_load + self._peer_worker_load

    def view(
        self, now: float, plan: Plan, optimal: str | None, slo_s: float, similarity: float | None = None
    ) -> RouteView:
        """:meth:`Router.view` with every router's load and the combined cache health."""
        return self._router.view(
            now,
            plan,
            optimal,
            slo_s,
            similarity,
            level_load=self.level_load,
            worker_load=self.worker_load,
            cache_healthy=self.cache_health.healthy,
        )

    def summary(self) -> dict[str, Any]:
        """This router's part of its heartbeat."""
        r = self._router
        return {
            "level_load": {lv: n for lv, n in r.level_load.items() if n},
            "worker_load": {w: n for w, n in r.worker_load.items() if n},  # Delivery.PER_WORKER's queues
            "inflight": len(r.inflight),
            "accepted": r.accepted,
            "completed": r.completed,
            "cache": {**summarize_health(r.cache_health), "epoch": self._epoch},
            # its measurements for the leader's latency estimate: level -> [sum of ratios, ratios]
            "latency": {lv: [total, n] for lv, (total, n) in r.latency.windows().items()},
        }

    def refresh(self) -> None:
        """After a heartbeat (in a thread): the other routers' load and cache windows; a cache
        health reset requested by this router's probes goes out, one from another router comes in."""
        bus = self._bus
        health = self.cache_health
        if health.reset_pending:
            health.reset_pending = False
            self._epoch = bus.bump_health_epoch()
        else:
            epoch = bus.health_epoch()
            if self._epoch is not None and epoch != self._epoch:
                self._router.cache_health.reset()
            self._epoch = epoch
        peers = {rid: info for rid, info in bus.routers().items() if rid != bus.router_id}
        bus.peers = peers
        load: Counter[str] = Counter()
        worker_load: Counter[str] = Counter()
        windows = []
        latency = []
        for info in peers.values():
            load.update({lv: int(n) for lv, n in (info.get("level_load") or {}).items()})
            worker_load.update({w: int(n) for w, n in (info.get("worker_load") or {}).items()})
            if info.get("latency"):
                latency.append(info["latency"])
            cache = info.get("cache") or {}
            if cache.get("epoch") == self._epoch and cache.get("samples"):
                windows.append(cache)
        self._peer_load = load
        self._peer_worker_load = worker_load
        self._peer_latency = latency
        health.peers = windows


# -- status ------------------------------------------------------------------------------------


def _age(ts: Any, now: float) -> float | None:
    try:
        return round(max(0.0, now - float(ts)), 3)
    except (TypeError, ValueError):
        return None


def _plan_summary(plan: dict | None, levels: Any = None) -> dict | None:
    if plan is None:
        return None
    from argusdiff.service.autoscale import desired_workers

    assignment = plan.get("assignment") or {}
    out = {
        "version": plan.get("version"),
        "created_s": plan.get("created_s"),
        "policy": plan.get("policy"),
        "strategy": plan.get("strategy"),
        "counts": plan.get("counts"),
        "predicted_qpm": plan.get("predicted_qpm"),
        "saturated": plan.get("saturated"),
        "shortfall_qpm": plan.get("shortfall_qpm"),
        "workers": len(assignment),
    }
    if levels:
        from argusdiff.service.plans import plan_from_dict

        out["desired_workers"] = desired_workers(plan_from_dict(plan), levels, len(assignment))
    return out


def cluster_status(store: Any, *, levels: Any = None, plan_log: int = 10) -> dict[str, Any]:
    """Routers, the leader, workers (level, loading, heartbeat age), the plan and its recent
    writes, read from Redis through a :class:`~argusdiff.service.transport.redis_control.RedisControlStore`."""
    r = store.r
    ns = store.keys.ns
    k = store.keys
    now = time.time()
    holder = parse_holder(r.get(k.leader))
    ttl_ms = r.pttl(k.leader) if holder else None
    epoch = r.get(k.leader_epoch)
    bus = ClusterBus(r, ns, "status")
    routers = bus.routers()
    raw_plan = r.get(k.plan)
    plan = json.loads(raw_plan) if raw_plan else None
    alive, dead = store.heartbeats()
    log_rows = r.xrevrange(k.plan_log, count=plan_log)
    writes = [{_text(f): (_text(v)) for f, v in fields.items()} | {"id": _text(eid)} for eid, fields in log_rows or []]
    for w in writes:
        for key in ("version", "token"):
            w[key] = int(w[key])
        w["created_s"] = float(w["created_s"])
    return {
        "mode": "redis",
        "namespace": ns,
        "now_s": now,
        "leader": None
        if holder is None
        else {"router": holder[0], "token": holder[1], "lease_left_s": None if ttl_ms is None else ttl_ms / 1000},
        "epoch": int(epoch) if epoch is not None else 0,
        "routers": {
            rid: {
                "role": info.get("role"),
                "host": info.get("host"),
                "pid": info.get("pid"),
                "plan_version": info.get("plan_version"),
                "heartbeat_age_s": _age(info.get("ts"), now),
                "inflight": info.get("inflight"),
                "accepted": info.get("accepted"),
                "refused_writes": info.get("refused_writes"),
            }
            for rid, info in sorted(routers.items())
        },
        "workers": _workers(alive, dead, plan, now),
        "plan": _plan_summary(plan, levels),
        "plan_writes": writes,
    }


def _workers(alive: dict, dead: set, plan: dict | None, now: float) -> dict[str, dict]:
    assignment = (plan or {}).get("assignment") or {}
    out = {}
    for w, info in sorted(alive.items()):
        out[w] = {
            "up": True,
            "level": info.get("level"),
            "planned": assignment.get(w),
            "loading": info.get("loading"),
            "heartbeat_age_s": _age(info.get("ts"), now),
            "done": info.get("done"),
            "failed": info.get("failed"),
            "plan_version": info.get("plan_version"),
            "host": info.get("host"),
        }
    for w in sorted(dead):
        out[w] = {"up": False, "planned": assignment.get(w)}
    return out


def local_status(service: Any) -> dict[str, Any]:
    """The same shape for an embedded service (one router, always the leader)."""
    from argusdiff.service.plans import plan_to_dict

    control = service.control
    plan = control.plan
    now = time.time()
    router = service.router
    rid = getattr(control, "router_id", "local")
    return {
        "mode": "embedded",
        "namespace": None,
        "now_s": now,
        "leader": {"router": rid, "token": None, "lease_left_s": None},
        "epoch": 0,
        "routers": {
            rid: {
                "role": "leader",
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "plan_version": None if plan is None else plan.version,
                "heartbeat_age_s": 0.0,
                "inflight": len(router.inflight),
                "accepted": router.accepted,
                "refused_writes": 0,
            }
        },
        "workers": _workers(control.alive, set(), None if plan is None else plan_to_dict(plan), now),
        "plan": None if plan is None else _plan_summary(plan_to_dict(plan), service.levels),
        "plan_writes": [],
    }


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.2f}" if math.isfinite(x) else str(x)
    return str(x)


def format_status(status: dict[str, Any]) -> str:
    """Plain-text rendering for ``argusdiff status``."""
    lines = []
    leader = status.get("leader")
    plan = status.get("plan") or {}
    lines.append(f"mode: {status['mode']}" + (f"  namespace: {status['namespace']}" if status.get("namespace") else ""))
    if leader:
        lines.append(
            f"leader: {leader['router']}  token {_fmt(leader['token'])}  lease left {_fmt(leader['lease_left_s'])} s"
        )
    else:
        lines.append("leader: none (no router holds the lease)")
    if plan:
        lines.append(
            f"plan: v{plan['version']}  policy {plan.get('policy')}  strategy {plan.get('strategy')}  "
            f"workers {plan.get('workers')}  predicted {_fmt(plan.get('predicted_qpm'))} QPM  "
            f"saturated {plan.get('saturated')}  shortfall {_fmt(plan.get('shortfall_qpm'))} QPM  "
            f"desired workers {_fmt(plan.get('desired_workers'))}"
        )
    else:
        lines.append("plan: none published")
    lines.append("")
    lines.append(f"routers ({len(status['routers'])}):")
    lines.append(f"  {'id':<40} {'role':<9} {'plan':>6} {'hb age s':>9} {'inflight':>9} {'accepted':>9}")
    for rid, r in status["routers"].items():
        lines.append(
            f"  {rid:<40} {_fmt(r['role']):<9} {_fmt(r['plan_version']):>6} {_fmt(r['heartbeat_age_s']):>9} "
            f"{_fmt(r['inflight']):>9} {_fmt(r['accepted']):>9}"
        )
    workers = status["workers"]
    lines.append("")
    lines.append(f"workers ({sum(1 for w in workers.values() if w['up'])} up, {len(workers)} known):")
    lines.append(f"  {'id':<32} {'up':<4} {'level':<14} {'planned':<14} {'loading':<12} {'hb age s':>9} {'done':>7}")
    for wid, w in workers.items():
        lines.append(
            f"  {wid:<32} {('yes' if w['up'] else 'NO'):<4} {_fmt(w.get('level')):<14} {_fmt(w.get('planned')):<14} "
            f"{_fmt(w.get('loading')):<12} {_fmt(w.get('heartbeat_age_s')):>9} {_fmt(w.get('done')):>7}"
        )
    writes = status.get("plan_writes") or []
    if writes:
        lines.append("")
        lines.append("recent plan writes (newest first):")
        for w in writes:
            lines.append(f"  v{w['version']:<6} token {w['token']:<4} by {w['router']}  at {_clock(w['created_s'])}")
    return "\n".join(lines)


def _clock(epoch_s: float) -> str:
    """A wall-clock time as people read it: ``2026-11-27 13:52:25.393 UTC``."""
    whole = math.floor(epoch_s)
    millis = min(999, round((epoch_s - whole) * 1000))
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(whole))}.{millis:03d} UTC"


def service_status(service: Any) -> dict[str, Any]:
    """``GET /v1/cluster``: the cluster as Redis knows it, or this embedded service."""
    if service.dispatch.mode != "redis":
        return local_status(service)
    try:
        return cluster_status(service.store, levels=service.levels)
    except (RedisError, OSError) as exc:
        from argusdiff.service.errors import ApiError

        raise ApiError(
            503, f"redis unavailable: {exc}", type="server_busy", code="queue_unavailable", headers={"Retry-After": "2"}
        ) from None
