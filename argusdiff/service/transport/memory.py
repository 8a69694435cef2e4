"""Embedded mode's transport: in-process work queues (threads), results in bounded memory and the
control store, all in one process.

* :class:`TierQueue` — one level's queued items, a FIFO per SLO tier, taken highest-priority tier
  first (:data:`argusdiff.domain.TIER_PRIORITY`; the simulator pulls in the same order);
* :class:`InProcessQueue` — the :class:`~workers.queue.WorkQueue` delivery contract with threads;
  :class:`InProcessWorkQueue` adds a :class:`~argusdiff.service.transport.protocol.ResultStore`
  (workers without a router), :class:`LocalWorkQueue` hands results and step events to the
  router's dispatch (:class:`argusdiff.service.dispatch.LocalDispatch`) instead, and can cancel and
  migrate queued work;
* :class:`ResultMemory` — values kept for a ttl within a memory budget (the router's results);
* :class:`LocalControlStore` — the plan and worker heartbeats in memory.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from argusdiff.domain import TIER_PRIORITY, Plan, tier_rank
from argusdiff.service.transport.protocol import wait_result
from workers.messages import WorkItem, WorkResult
from workers.queue import WORKER_META

__all__ = [
    "ENTRY_OVERHEAD",
    "InProcessQueue",
    "InProcessWorkQueue",
    "LocalControlStore",
    "LocalWorkQueue",
    "ResultMemory",
    "TierQueue",
]


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


class InProcessQueue:
    """Thread-safe in-process :class:`~workers.queue.WorkQueue` without a result store (one
    :class:`TierQueue` per level, and one per worker and level for items that name their worker,
    delivery ``PER_WORKER``): what :class:`InProcessWorkQueue` and :class:`LocalWorkQueue` share."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        # a level's shared queue under its id, a worker's own queue of it under (level id, worker id)
        self._queues: dict[str | tuple[str, str], TierQueue] = {}
        self._pending: dict[str, WorkItem] = {}  # receipt -> item
        self._stopped: set[str] = set()  # request ids cancelled while a worker may run them
        self._seq = 0
        self.delivered = 0
        self.acked = 0
        self.requeued = 0

    def put(self, level_id: str, item: WorkItem) -> None:
        if item.level != level_id:
            item = replace(item, level=level_id)
        if not item.enqueue_s:
            item = replace(item, enqueue_s=time.time())
        worker = item.meta.get(WORKER_META)
        key: str | tuple[str, str] = (level_id, worker) if worker else level_id
        with self._cond:
            self._queues.setdefault(key, TierQueue()).append(item.with_receipt(None))
            self._cond.notify_all()

    def get(self, level_id: str, timeout: float | None = None, worker: str | None = None) -> WorkItem | None:
        """The next item of ``worker``'s own queue of the level (when given), else of the level's
        shared queue, highest-priority tier first in each."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._cond:
            while True:
                q = self._queues.get((level_id, worker)) if worker else None
                if not q:
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
            # to the level's shared queue, also from a worker's own: the worker is switching or leaving
            self._queues.setdefault(item.level, TierQueue()).appendleft(back)
            self.requeued += 1
            self._cond.notify_all()

    def qsize(self, level_id: str) -> int:
        """Queued items of the level: its shared queue and every worker's own queue of it."""
        with self._cond:
            return sum(
                len(q)
                for key, q in self._queues.items()
                if key == level_id or (isinstance(key, tuple) and key[0] == level_id)
            )

    def owners(self, level_id: str) -> set[str]:
        """The workers with their own queue of the level (delivery ``PER_WORKER``)."""
        with self._cond:
            return {k[1] for k in self._queues if isinstance(k, tuple) and k[0] == level_id}

    def forget_owner(self, level_id: str, worker: str) -> bool:
        """Drop ``worker``'s own queue of the level once empty; False: not empty."""
        with self._cond:
            q = self._queues.get((level_id, worker))
            if q:
                return False
            self._queues.pop((level_id, worker), None)
            return True

    def release(self, level_id: str, worker: str) -> int:
        """Move the items waiting in ``worker``'s own queue of the level to the level's shared
        queue (each at the back of its tier, in order); returns how many."""
        with self._cond:
            own = self._queues.pop((level_id, worker), None)
            if not own:
                return 0
            dst = self._queues.setdefault(level_id, TierQueue())
            moved = 0
            while own:
                dst.append(own.popleft())
                moved += 1
            self.requeued += moved
            self._cond.notify_all()
            return moved

    def pending(self, level_id: str) -> int:
        with self._cond:
            return sum(1 for item in self._pending.values() if item.level == level_id)

    def stop(self, request_ids: list[str]) -> None:
        """Cancel requests a worker may have taken: :meth:`cancelled` says so to the worker, whose
        run stops at its next step (:mod:`workers.cancel`); forgotten once their result is out."""
        with self._cond:
            self._stopped.update(request_ids)

    def cancelled(self, request_ids: list[str]) -> set[str]:
        """Which of ``request_ids`` were cancelled (:meth:`stop`)."""
        with self._cond:
            return self._stopped.intersection(request_ids)

    def _forget_stopped(self, request_id: str) -> None:
        with self._cond:
            self._stopped.discard(request_id)

    def wake(self) -> None:
        """Wake every blocked ``get`` (used when a worker is asked to stop or switch)."""
        with self._cond:
            self._cond.notify_all()


class InProcessWorkQueue(InProcessQueue):
    """Thread-safe in-process :class:`~workers.queue.WorkQueue` and
    :class:`~argusdiff.service.transport.protocol.ResultStore`: results wait
    here until taken (workers without a router: tests, benchmarks, one-shot jobs)."""

    def __init__(self) -> None:
        super().__init__()
        self._results: dict[str, WorkResult] = {}

    def result(self, request_id: str, result: WorkResult) -> None:
        with self._cond:
            self._results[request_id] = result
            self._stopped.discard(request_id)
            self._cond.notify_all()

    def wait_result(self, request_id: str, timeout: float | None = None) -> WorkResult | None:
        with self._cond:
            return wait_result(lambda: self._results.pop(request_id, None), timeout, self._cond.wait)


class LocalWorkQueue(InProcessQueue):
    """The workers' in-process queue. Results and step events go to callbacks (the dispatch);
    nothing is kept here. :meth:`cancel` takes a queued item out; :meth:`migrate` moves a level's
    queue when the plan no longer serves it."""

    def __init__(self) -> None:
        super().__init__()
        self.on_result: Callable[[str, WorkResult], None] | None = None
        self.on_event: Callable[[str, dict], None] | None = None

    def result(self, request_id: str, result: WorkResult) -> None:
        if result.handoff is None:
            self._forget_stopped(request_id)
        cb = self.on_result
        if cb is not None:
            cb(request_id, result)

    def publish_event(self, request_id: str, event: dict) -> None:
        cb = self.on_event
        if cb is not None:
            cb(request_id, event)

    def cancel(self, request_id: str) -> bool:
        """Take a not-yet-started item out of whichever level's queue holds it."""
        with self._cond:
            for q in self._queues.values():
                for item in q:
                    if item.request_id == request_id:
                        q.remove(item)
                        return True
        return False

    def migrate(self, from_level: str, to_level: str, limit: int = 10_000) -> int:
        with self._cond:
            for key in [k for k in self._queues if isinstance(k, tuple) and k[0] == from_level]:
                self.release(from_level, key[1])  # the workers' own queues of it go too
            src = self._queues.get(from_level)
            if not src:
                return 0
            dst = self._queues.setdefault(to_level, TierQueue())
            moved = 0
            while src and moved < limit:
                item = src.popleft()
                dst.append(replace(item, level=to_level, meta={**item.meta, "migrated_from": from_level}))
                moved += 1
            self._cond.notify_all()
            return moved

    def pending_by_consumer(self, level_id: str) -> dict[str, int]:
        return {}

    def requeue_consumer(self, level_id: str, consumer: str, fence: tuple[str, str] | None = None) -> int:
        """A dead worker: the items waiting in its own queue of the level go to the shared queue
        (in one process nothing it took is pending elsewhere)."""
        return self.release(level_id, consumer)

    def drop_consumer(self, level_id: str, consumer: str) -> None:
        return None


#: What an entry costs in router memory beyond its image bytes (ids, timings, bookkeeping).
ENTRY_OVERHEAD = 1024


class ResultMemory:
    """Values kept for at most ``ttl_s`` and, all together, at most ``max_bytes`` (an entry counts
    its image bytes plus :data:`ENTRY_OVERHEAD`); the oldest are evicted first. Thread-safe."""

    def __init__(self, max_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = int(max_bytes)
        self.ttl_s = ttl_s
        self._clock = clock
        self._data: OrderedDict[str, tuple[float, int, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.evicted = 0

    @staticmethod
    def size_of(value: Any) -> int:
        png = getattr(value, "image_png", None)
        return ENTRY_OVERHEAD + (len(png) if png else 0)

    def _drop_oldest(self) -> None:
        _, (_, size, _) = self._data.popitem(last=False)
        self.bytes -= size

    def _expire(self, now: float) -> None:
        while self._data and next(iter(self._data.values()))[0] <= now:
            self._drop_oldest()

    def set(self, key: str, value: Any) -> None:
        size = self.size_of(value)
        now = self._clock()
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._data[key] = (now + self.ttl_s, size, value)
            self.bytes += size
            self._expire(now)
            while self.bytes > self.max_bytes and len(self._data) > 1:
                self._drop_oldest()
                self.evicted += 1

    def get(self, key: str) -> Any:
        with self._lock:
            self._expire(self._clock())
            entry = self._data.get(key)
            return None if entry is None else entry[2]

    def __len__(self) -> int:
        with self._lock:
            self._expire(self._clock())
            return len(self._data)


class LocalControlStore:
    """In-process store (embedded mode); thread-safe."""

    def __init__(self, clock=time.monotonic) -> None:
        self._lock = threading.Lock()
        self._plan: Plan | None = None
        self._beats: dict[str, tuple[float, float, dict[str, Any]]] = {}  # id -> (time, ttl, info)
        self._clock = clock

    def publish_plan(self, plan: Plan) -> None:
        with self._lock:
            self._plan = plan

    def read_plan(self) -> Plan | None:
        with self._lock:
            return self._plan

    def beat(self, worker_id: str, info: dict[str, Any], ttl_s: float) -> None:
        with self._lock:
            self._beats[worker_id] = (self._clock(), ttl_s, dict(info))

    def leave(self, worker_id: str) -> None:
        with self._lock:
            if worker_id in self._beats:
                self._beats[worker_id] = (float("-inf"), 0.0, self._beats[worker_id][2])

    def heartbeats(self) -> tuple[dict[str, dict[str, Any]], set[str]]:
        now = self._clock()
        with self._lock:
            alive = {w: info for w, (t, ttl, info) in self._beats.items() if now - t <= ttl}
            dead = set(self._beats) - set(alive)
        return alive, dead

    def forget_worker(self, worker_id: str) -> None:
        with self._lock:
            self._beats.pop(worker_id, None)
