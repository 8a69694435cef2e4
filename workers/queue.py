"""The work queue between router and workers: one queue per level, at-least-once delivery.

:class:`WorkQueue` is the protocol; :class:`InProcessWorkQueue` the in-process implementation
(threads); the service provides a Redis Streams implementation of the same protocol.

Delivery contract:

* ``put(level_id, item)`` appends to the level's queue (FIFO).
* ``get(level_id, timeout)`` hands the oldest item to one worker (``None`` after ``timeout``
  seconds with nothing queued); the item stays *pending* until ``ack``.
* ``ack(item)`` after the result is published; ``nack(item)`` returns a pending item to the
  front of its level's queue (a worker switching level or shutting down never drops work).
* ``result(request_id, result)`` publishes a result; ``wait_result(request_id, timeout)``
  returns it (once) or ``None`` after ``timeout``.
* ``qsize(level_id)`` counts queued (not pending) items; ``pending(level_id)`` the taken but
  unacknowledged ones.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import replace
from typing import Protocol, runtime_checkable

from workers.messages import WorkItem, WorkResult

__all__ = ["InProcessWorkQueue", "WorkQueue"]


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


class InProcessWorkQueue:
    """Thread-safe in-process :class:`WorkQueue` (one deque per level)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queues: dict[str, deque[WorkItem]] = {}
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
            self._queues.setdefault(level_id, deque()).append(item.with_receipt(None))
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
            self._queues.setdefault(item.level, deque()).appendleft(back)
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
