"""The work queue between router and workers: one queue per level, at-least-once delivery.

:class:`WorkQueue` is the protocol, all a worker needs of its transport; the implementations live in
the service (:mod:`argusdiff.service.transport`: in-process threads, or Redis Streams), which
imports this module and never the other way round.

Delivery contract:

* ``put(level_id, item)`` appends to the level's queue (FIFO within the item's SLO tier), or, when
  the item names a worker (``item.meta["worker"]``, :data:`WORKER_META`: the router sets it for a
  policy whose delivery is ``PER_WORKER``), to that worker's own queue of the level.
* ``get(level_id, timeout)`` hands the oldest item of the highest-priority tier queued at the level
  (``interactive``, then ``standard``, then ``batch``: :data:`argusdiff.domain.TIER_PRIORITY`; an
  item without a tier ranks as ``standard``) to one worker (``None`` after ``timeout`` seconds with
  nothing queued); the item stays *pending* until ``ack``. The simulator pulls in the same order.
* ``ack(item)`` after the result is published; ``nack(item)`` returns a pending item to the
  front of its tier at its level (a worker switching level or shutting down never drops work).
  ``get(level_id, timeout, worker=w)`` takes from worker ``w``'s own queue of the level first,
  then the level's shared one; an item taken from a worker's own queue and given back goes to the
  level's shared queue.
* ``release(level_id, worker)`` moves the items waiting in ``worker``'s own queue of the level to
  the level's shared queue (the worker left the level or died); ``requeue_consumer`` of a dead
  worker does it too. Accepted work is never stranded behind a worker that will not take it.
* ``result(request_id, result)`` publishes a result (whoever waits for it reads it from the
  transport's result store, :class:`argusdiff.service.transport.protocol.ResultStore`).
* ``qsize(level_id)`` counts queued (not pending) items; ``pending(level_id)`` the taken but
  unacknowledged ones.
* optional ``cancelled(request_ids) -> set`` says which of them a router cancelled: the worker
  skips those it takes, and a running batch whose requests are all cancelled stops at its next
  denoising step (:mod:`workers.cancel`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from workers.messages import WorkItem, WorkResult

__all__ = ["WORKER_META", "WorkQueue"]

#: ``WorkItem.meta`` key naming the worker whose own queue the item waits in (delivery ``PER_WORKER``)
WORKER_META = "worker"


@runtime_checkable
class WorkQueue(Protocol):
    def put(self, level_id: str, item: WorkItem) -> None: ...

    def get(self, level_id: str, timeout: float | None = None, worker: str | None = None) -> WorkItem | None: ...

    def ack(self, item: WorkItem) -> None: ...

    def nack(self, item: WorkItem) -> None: ...

    def result(self, request_id: str, result: WorkResult) -> None: ...

    def qsize(self, level_id: str) -> int: ...

    def pending(self, level_id: str) -> int: ...

    def release(self, level_id: str, worker: str) -> int: ...
