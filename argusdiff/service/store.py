"""Where the plan and worker heartbeats live: in memory (embedded) or in Redis (distributed).

A :class:`ControlStore` is what the control loop and the workers share: the published plan and
each worker's heartbeat (its level, what it is loading, how much it has done). A worker whose
heartbeat is older than the timeout is dead.
"""

from __future__ import annotations

from typing import Any

from argusdiff.domain import Plan
from argusdiff.service.plans import plan_from_dict, plan_to_dict
from argusdiff.service.transport.memory import LocalControlStore
from argusdiff.service.transport.protocol import ControlStore

__all__ = ["ControlStore", "LocalControlStore", "RedisControlStore"]


class RedisControlStore:
    """The same in Redis (plan key + heartbeat hashes with expiry), over a RedisWorkQueue's client."""

    def __init__(self, queue) -> None:
        self.queue = queue
        self._last: tuple[Any, Plan | None] = (None, None)
        self._last_view: tuple[Any, Plan | None] = (None, None)

    def publish_plan(self, plan: Plan) -> None:
        self.queue.publish_plan(plan_to_dict(plan))

    def read_plan(self) -> Plan | None:
        data = self.queue.read_plan()
        if data is None:
            return None
        if self._last[0] is not data:  # the queue returns the same dict while the version holds
            self._last = (data, plan_from_dict(data))
        return self._last[1]

    def read_plan_for(self, worker_id: str) -> Plan | None:
        """The plan as one worker needs it (its own entry, the served levels; see
        :func:`argusdiff.service.redis_queue.worker_view`): ~1 KB instead of the whole plan."""
        data = self.queue.read_plan_for(worker_id)
        if data is None:
            return None
        if self._last_view[0] is not data:
            self._last_view = (data, plan_from_dict(data))
        return self._last_view[1]

    def membership(self) -> tuple[set[str], set[str]]:
        return self.queue.membership()

    def beat(self, worker_id: str, info: dict[str, Any], ttl_s: float) -> None:
        self.queue.beat(worker_id, info, ttl_s)

    def leave(self, worker_id: str) -> None:
        self.queue.leave(worker_id)

    def heartbeats(self) -> tuple[dict[str, dict[str, Any]], set[str]]:
        return self.queue.heartbeats()

    def forget_worker(self, worker_id: str) -> None:
        self.queue.forget_worker(worker_id)
