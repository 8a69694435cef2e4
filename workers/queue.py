"""The work queue between router and workers: one queue per level, at-least-once delivery.

:class:`WorkQueue` is the protocol; :class:`InProcessWorkQueue` the in-process implementation
(threads); the service provides a Redis Streams implementation of the same protocol.

Delivery contract:

* ``put(level_id, item)`` appends to the level's queue (FIFO within the item's SLO tier).
* ``get(level_id, timeout)`` hands the oldest item of the highest-priority tier queued at the level
  (``interactive``, then ``standard``, then ``batch``: :data:`argusdiff.domain.TIER_PRIORITY`; an
  item without a tier ranks as ``standard``) to one worker (``None`` after ``timeout`` seconds with
  nothing queued); the item stays *pending* until ``ack``. The simulator pulls in the same order.
* ``ack(item)`` after the result is published; ``nack(item)`` returns a pending item to the
  front of its tier at its level (a worker switching level or shutting down never drops work).
* ``result(request_id, result)`` publishes a result; ``wait_result(request_id, timeout)``
  returns it (once) or ``None`` after ``timeout``.
* ``qsize(level_id)`` counts queued (not pending) items; ``pending(level_id)`` the taken but
  unacknowledged ones.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from typing import Protocol, runtime_checkable

from argusdiff.domain import TIER_PRIORITY, tier_rank
from workers.messages import WorkItem, WorkResult

__all__ = ["InProcessWorkQueue", "TierQueue", "WorkQueue"]


@runtime_checkable
class WorkQueue(Protocol):
    def put(self, level_id: str, item: WorkItem) -> None: ...

    def get(self, level_id: str, timeout: float | None = None) -> WorkItem | None: ...

    def ack(self, item: WorkItem) -> None: ...

    def nack(self, item: WorkItem) -> None: ...

    def result(self, request_id: str, result: WorkResult) -> None: ...

    def wait_result(self, request_id: str, timeout: float | None = None) -> WorkResult | None: ...

    def qsize(self, level_id: str) -> int: ...

    def pending(self, level_id: str) -> int: ...


class TierQueue:
    """One level's queued items: a FIFO per SLO tier, taken highest-priority tier first.

    ``append`` queues an item at the back of its tier, ``appendleft`` at the front (a nack);
    ``popleft`` takes the oldest item of the first tier of :data:`TIER_PRIORITY` that has any.
    Iteration is in that pull order. Not thread-safe: the owning queue holds its lock."""

    __slots__ = ("_fifos",)

    def __init__(self) -> None:
        self._fifos: tuple[deque[WorkItem], ...] = tuple(deque() for _ in TIER_PRIORITY)

    def _fifo(self, item: WorkItem) -> deque[WorkItem]:
        return self._fifos[tier_rank(item.tier)]

    def append(self, item: WorkItem) -> None:
        self._fifo(item).append(item)

    def appendleft(self, item: WorkItem) -> None:
        self._fifo(item).appendleft(item)

    def popleft(self) -> WorkItem:
        for fifo in self._fifos:
            if fifo:
                return fifo.popleft()
        raise IndexError("pop from an empty TierQueue")

    def remove(self, item: WorkItem) -> None:
        for fifo in self._fifos:
            if item in fifo:
                fifo.remove(item)
                return
        raise ValueError("item not queued")

    def __len__(self) -> int:
        return sum(len(fifo) for fifo in self._fifos)

    def __bool__(self) -> bool:
        return any(self._fifos)

    def __iter__(self) -> Iterator[WorkItem]:
        for fifo in self._fifos:
            yield from list(fifo)


class InProcessWorkQueue:
    """Thread-safe in-process :class:`WorkQueue` (one :class:`TierQueue` per level)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queues: dict[str, TierQueue] = {}
        self._pending: dict[str, WorkItem] = {}  # receipt -> item
        self._results: dict[str, WorkResult] = {}
        self._seq = 0
        self.delivered = 0
        self.acked = 0
        self.requeued = 0

    def put(self, level_id: str, item: WorkItem) -> None:
        if item.level != level_id:
            item = replace(item, level=level_id)
        if not item.enqueue_s:
            item = replace(item, enqueue_s=time.time())
        with self._cond:
            self._queues.setdefault(level_id, TierQueue()).append(item.with_receipt(None))
            self._cond.notify_all()

    def get(self, level_id: str, timeout: float | None = None) -> WorkItem | None:
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._cond:
            while True:
                q = self._queues.get(level_id)
                if q:
                    item = q.popleft()
                    self._seq += 1
                    receipt = f"{level_id}:{self._seq}"
                    item = item.with_receipt(receipt)
                    self._pending[receipt] = item
                    self.delivered += 1
                    return item
                if deadline is None:
                    self._cond.wait()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def ack(self, item: WorkItem) -> None:
        with self._cond:
            if item.receipt is not None and self._pending.pop(item.receipt, None) is not None:
                self.acked += 1

    def nack(self, item: WorkItem) -> None:
        with self._cond:
            if item.receipt is None or self._pending.pop(item.receipt, None) is None:
                return
            back = replace(item, attempt=item.attempt + 1, receipt=None)
            self._queues.setdefault(item.level, TierQueue()).appendleft(back)
            self.requeued += 1
            self._cond.notify_all()

    def result(self, request_id: str, result: WorkResult) -> None:
        with self._cond:
            self._results[request_id] = result
            self._cond.notify_all()

    def wait_result(self, request_id: str, timeout: float | None = None) -> WorkResult | None:
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._cond:
            while request_id not in self._results:
                if deadline is None:
                    self._cond.wait()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return self._results.pop(request_id)

    def qsize(self, level_id: str) -> int:
        with self._cond:
            return len(self._queues.get(level_id, ()))

    def pending(self, level_id: str) -> int:
        with self._cond:
            return sum(1 for item in self._pending.values() if item.level == level_id)

    def wake(self) -> None:
        """Wake every blocked ``get`` (used when a worker is asked to stop or switch)."""
        with self._cond:
            self._cond.notify_all()
