"""The work queue between router and workers: one queue per level, at-least-once delivery.

:class:`WorkQueue` is the protocol, all a worker needs of its transport; the implementations live in
the service (:mod:`argusdiff.service.transport`: in-process threads, or Redis Streams), which
imports this module and never the other way round.

Delivery contract:

* ``put(level_id, item)`` appends to the level's queue (FIFO within the item's SLO tier).
* ``get(level_id, timeout)`` hands the oldest item of the highest-priority tier queued at the level
  (``interactive``, then ``standard``, then ``batch``: :data:`argusdiff.domain.TIER_PRIORITY`; an
  item without a tier ranks as ``standard``) to one worker (``None`` after ``timeout`` seconds with
  nothing queued); the item stays *pending* until ``ack``. The simulator pulls in the same order.
* ``ack(item)`` after the result is published; ``nack(item)`` returns a pending item to the
  front of its tier at its level (a worker switching level or shutting down never drops work).
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

__all__ = ["WorkQueue"]


@runtime_checkable
class WorkQueue(Protocol):
    def put(self, level_id: str, item: WorkItem) -> None: ...

    def get(self, level_id: str, timeout: float | None = None) -> WorkItem | None: ...

    def ack(self, item: WorkItem) -> None: ...

    def nack(self, item: WorkItem) -> None: ...

    def result(self, request_id: str, result: WorkResult) -> None: ...

    def qsize(self, level_id: str) -> int: ...

    def pending(self, level_id: str) -> int: ...
