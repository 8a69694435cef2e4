"""The control store in Redis: the plan in force, the deployment the routers serve and the workers'
heartbeats, beside (not inside) the Redis Streams work queue.

Layout under a namespace ``ns`` (:class:`~argusdiff.service.transport.redis_streams.RedisKeys`):

* ``ns:plan`` — the plan in force (JSON); ``ns:plan:version`` its version (a reader parses the plan
  only when it changed); ``ns:plan:view`` and ``ns:plan:assign`` what a worker reads of it
  (:func:`worker_view` plus its own entry); ``ns:plan-changed`` — pub/sub of new versions;
* ``ns:deployment`` — the profiles the router serves (a worker started without ``--profile``
  follows it);
* ``ns:hb:<worker>`` — heartbeat hashes with expiry; ``ns:workers`` — every worker id seen (a
  member without a heartbeat key is dead); ``ns:workers:beat`` — worker id -> heartbeat expiry.

Many routers publish plans fenced (:class:`argusdiff.service.leader.FencedPlanStore`), writing the
same keys.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from argusdiff.domain import Plan
from argusdiff.service.plans import plan_from_dict, plan_to_dict
from argusdiff.service.transport.redis_streams import RedisKeys, RedisWorkQueue, decode, redis_call, sync_client

__all__ = ["RedisControlStore", "worker_view"]


def worker_view(plan_json: dict[str, Any]) -> dict[str, Any]:
    """The plan as a worker reads it: everything but the assignment, which keeps one worker of
    each served level (so the served levels stay what they are: ``Plan.unserved_siblings``). The
    worker adds its own entry from ``plan:assign``. A 10,000-worker plan is ~0.3 MB; this is ~1 KB."""
    keep: dict[str, Any] = {}
    for w, lv in (plan_json.get("assignment") or {}).items():
        if lv is not None and lv not in keep.values():
            keep[w] = lv
    return {**plan_json, "assignment": keep}


class RedisControlStore:
    """:class:`~argusdiff.service.transport.protocol.ControlStore` in Redis (thread-safe: redis-py
    pools). Every failure is raised as :class:`~argusdiff.service.errors.QueueUnavailable`."""

    def __init__(
        self,
        url: str | None = None,
        *,
        client: redis.Redis | None = None,
        namespace: str = "argusdiff",
        socket_timeout_s: float = 5.0,
    ) -> None:
        self.r = client if client is not None else sync_client(url, socket_timeout_s, "RedisControlStore")
        self.keys = RedisKeys(namespace)
        self._plan_cache: tuple[Any, dict] | None = None
        self._view_cache: tuple[Any, dict] | None = None
        self._last: tuple[Any, Plan | None] = (None, None)
        self._last_view: tuple[Any, Plan | None] = (None, None)

    @classmethod
    def sharing(cls, queue: RedisWorkQueue) -> RedisControlStore:
        """The control store beside ``queue``: its connection pool and namespace."""
        return cls(client=queue.r, namespace=queue.keys.ns)

    def _call(self, fn, *args, **kwargs):
        return redis_call(fn, *args, **kwargs)

    # -- the plan, as stored (JSON) ----------------------------------------------------------

    def publish_plan_data(self, plan_json: dict[str, Any]) -> None:
        """Unfenced (a single router, tools); many routers publish through
        :class:`argusdiff.service.leader.FencedPlanStore`, which writes the same keys."""
        raw = json.dumps(plan_json)
        assign = {w: json.dumps(lv) for w, lv in (plan_json.get("assignment") or {}).items()}

        def _pub():
            pipe = self.r.pipeline(transaction=True)
            pipe.set(self.keys.plan, raw)
            pipe.set(self.keys.plan_view, json.dumps(worker_view(plan_json)))
            pipe.delete(self.keys.plan_assign)
            if assign:
                pipe.hset(self.keys.plan_assign, mapping=assign)
            pipe.set(self.keys.plan_version, int(plan_json.get("version", 0)))
            pipe.execute()
            # after the write (a cluster runs no PUBLISH inside a transaction)
            self.r.publish(self.keys.plan_channel, str(plan_json.get("version", "")))

        self._call(_pub)

    def read_plan_data_for(self, worker_id: str) -> dict[str, Any] | None:
        """The plan as ``worker_id`` needs it (:func:`worker_view` plus its own entry), read only
        when the version changed; the whole plan where no view is published."""
        version = self._call(self.r.get, self.keys.plan_version)
        cached = self._view_cache
        if version is not None and cached is not None and cached[0] == version:
            return cached[1]

        def _read():
            pipe = self.r.pipeline(transaction=True)
            pipe.get(self.keys.plan_version)
            pipe.get(self.keys.plan_view)
            pipe.hget(self.keys.plan_assign, worker_id)
            return pipe.execute()

        version, view, mine = self._call(_read)
        if view is None:
            return self.read_plan_data()
        data = json.loads(view)
        assignment = {w: lv for w, lv in data["assignment"].items() if w != worker_id}
        if mine is not None:
            assignment[worker_id] = json.loads(mine)
        data["assignment"] = assignment
        self._view_cache = (version, data)
        return data

    def read_plan_data(self) -> dict[str, Any] | None:
        """The published plan; when routers publish it fenced (``ns:plan:version`` set), the plan
        itself is read only when its version changed (a 10,000-worker plan is ~0.5 MB)."""
        version = self._call(self.r.get, self.keys.plan_version)
        cached = self._plan_cache
        if version is not None and cached is not None and cached[0] == version:
            return cached[1]
        raw = self._call(self.r.get, self.keys.plan)
        data = None if raw is None else json.loads(raw)
        self._plan_cache = (version, data) if version is not None and data is not None else None
        return data

    # -- the plan, as the control loop and the workers use it ----------------------------------

    def publish_plan(self, plan: Plan) -> None:
        self.publish_plan_data(plan_to_dict(plan))

    def read_plan(self) -> Plan | None:
        data = self.read_plan_data()
        if data is None:
            return None
        if self._last[0] is not data:  # the same dict comes back while the version holds
            self._last = (data, plan_from_dict(data))
        return self._last[1]

    def read_plan_for(self, worker_id: str) -> Plan | None:
        """The plan as one worker needs it (its own entry, the served levels; see
        :func:`worker_view`): ~1 KB instead of the whole plan."""
        data = self.read_plan_data_for(worker_id)
        if data is None:
            return None
        if self._last_view[0] is not data:
            self._last_view = (data, plan_from_dict(data))
        return self._last_view[1]

    # -- the deployment and the workers' heartbeats --------------------------------------------

    def publish_deployment(self, data: dict[str, Any]) -> None:
        """What the router serves (profile names), so a worker started without --profile can follow."""
        self._call(self.r.set, self.keys.deployment, json.dumps(data))

    def read_deployment(self) -> dict[str, Any] | None:
        raw = self._call(self.r.get, self.keys.deployment)
        return None if raw is None else json.loads(raw)

    def beat(self, worker_id: str, info: dict[str, Any], ttl_s: float) -> None:
        key = self.keys.heartbeat(worker_id)
        mapping = {k: json.dumps(v) for k, v in {**info, "ts": time.time()}.items()}

        def _beat():
            pipe = self.r.pipeline(transaction=True)
            pipe.hset(key, mapping=mapping)
            pipe.pexpire(key, max(1, int(ttl_s * 1000)))
            pipe.sadd(self.keys.workers, worker_id)
            pipe.zadd(self.keys.workers_beat, {worker_id: time.time() + ttl_s})
            pipe.execute()

        self._call(_beat)

    def leave(self, worker_id: str) -> None:
        """A worker shutting down cleanly: heartbeat gone at once."""

        def _leave():
            pipe = self.r.pipeline(transaction=True)
            pipe.delete(self.keys.heartbeat(worker_id))
            pipe.zadd(self.keys.workers_beat, {worker_id: 0})
            pipe.execute()

        self._call(_leave)

    def membership(self) -> tuple[set[str], set[str]]:
        """(ids whose heartbeat has not expired, ids whose heartbeat expired and are not forgotten),
        from one sorted set: cheap enough to ask every heartbeat with 10,000 workers, where
        :meth:`heartbeats` reads and parses every heartbeat hash."""

        def _m():
            now = time.time()
            pipe = self.r.pipeline(transaction=False)
            pipe.zrangebyscore(self.keys.workers_beat, f"({now}", "+inf")
            pipe.zrangebyscore(self.keys.workers_beat, "-inf", now)
            alive, expired = pipe.execute()
            return {decode(w) for w in alive}, {decode(w) for w in expired}

        return self._call(_m)

    def heartbeats(self) -> tuple[dict[str, dict[str, Any]], set[str]]:
        """(alive worker id -> heartbeat info, ids seen before whose heartbeat expired)."""

        def _hb():
            ids = sorted(decode(w) for w in self.r.smembers(self.keys.workers))
            pipe = self.r.pipeline(transaction=False)
            for w in ids:
                pipe.hgetall(self.keys.heartbeat(w))
            rows = pipe.execute()
            alive: dict[str, dict[str, Any]] = {}
            dead: set[str] = set()
            for w, row in zip(ids, rows, strict=True):
                if row:
                    alive[w] = {decode(k): json.loads(v) for k, v in row.items()}
                else:
                    dead.add(w)
            return alive, dead

        return self._call(_hb)

    def forget_worker(self, worker_id: str) -> None:
        def _forget():
            pipe = self.r.pipeline(transaction=True)
            pipe.srem(self.keys.workers, worker_id)
            pipe.zrem(self.keys.workers_beat, worker_id)
            pipe.execute()

        self._call(_forget)
