"""Micro-batching for the live data path: callers submit one item each and get a ``Future``; one
background thread runs the batch function on up to ``max_batch`` items, waiting at most
``max_wait_s`` after the first for more to arrive.

Used by the level classifier (:class:`classifiers.level.BatchedClassifier`) and by the router's
cache-similarity lookups (:class:`argusdiff.service.similarity.CacheSimilarity`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

__all__ = ["LruCache", "MicroBatcher"]

T = TypeVar("T")
R = TypeVar("R")


class MicroBatcher(Generic[T, R]):
    """``submit(item) -> Future[R]``; ``fn(items) -> results`` runs on the batcher's thread.

    When ``fn`` raises on a batch and ``retry_singly`` is set, each item is retried alone so one
    bad item cannot fail its batch-mates; otherwise every future of the batch gets the exception
    (for failures that are not about the item, e.g. a backend that is down). ``close()`` finishes
    what is queued and stops the thread; ``submit`` after it raises ``RuntimeError``.
    """

    def __init__(
        self,
        fn: Callable[[list[T]], Sequence[R]],
        *,
        max_batch: int = 32,
        max_wait_s: float = 0.005,
        retry_singly: bool = True,
        name: str = "micro-batcher",
        merge: bool = False,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        self.fn = fn
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.retry_singly = retry_singly
        self.name = name
        self._queue: queue.Queue[tuple[Any, Future] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self.batches = 0  # batches run (observability)
        self.items = 0  # items processed
        # merge: an item equal to one queued or running shares its future (one computation)
        self.merge = merge
        self._inflight: dict[Any, Future] = {}
        self.merged = 0  # submissions answered by an identical item's computation
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: T) -> Future:
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} is closed")
            if self.merge:
                same = self._inflight.get(item)
                if same is not None:
                    self.merged += 1
                    return same
                self._inflight[item] = fut
                fut.add_done_callback(lambda _f, key=item: self._done(key, _f))
            self._queue.put((item, fut))
        return fut

    def _done(self, item: Any, fut: Future) -> None:
        with self._lock:
            if self._inflight.get(item) is fut:
                del self._inflight[item]

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.max_wait_s
            stop = False
            while len(batch) < self.max_batch:
                remaining = deadline - time.monotonic()
                try:
                    item = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._process(batch)
            if stop:
                return

    def _process(self, batch: list[tuple[Any, Future]]) -> None:
        live = [(x, f) for x, f in batch if f.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            results = list(self.fn([x for x, _ in live]))
            if len(results) != len(live):
                raise RuntimeError(f"{self.name}: {len(results)} results for {len(live)} items")
        except Exception as exc:
            if not self.retry_singly:
                for _, f in live:
                    f.set_exception(exc)
            else:
                for x, f in live:
                    try:
                        f.set_result(self.fn([x])[0])
                    except Exception as one:
                        f.set_exception(one)
        else:
            for (_, f), r in zip(live, results, strict=True):
                f.set_result(r)
        self.batches += 1
        self.items += len(live)

    def close(self, timeout: float | None = 10.0) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join(timeout)


class LruCache(Generic[T, R]):
    """At most ``capacity`` values by key, the least recently used dropped first (thread-safe)."""

    def __init__(self, capacity: int) -> None:
        from collections import OrderedDict

        self.capacity = max(0, int(capacity))
        self._data: OrderedDict[T, R] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: T) -> R | None:
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: T, value: R) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)
