"""The router's side of the queues: enqueue work, learn when results arrive, keep request
records, result and ``url`` images for their time to live.

* :class:`LocalDispatch` — embedded mode: a :class:`LocalWorkQueue` (the workers' in-process
  queue, plus results with expiry and a completion callback) shared with in-process workers.
* :class:`RedisDispatch` — distributed mode: :class:`~argusdiff.service.redis_queue.AsyncRedisDispatch`
  for the data path and a :class:`~argusdiff.service.redis_queue.RedisWorkQueue` for the control
  loop; a listener task follows the ``done`` stream and, after an outage, catches up by reading
  the result keys of everything still awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from argusdiff.service.errors import QueueUnavailable
from workers.executor import WorkItem, WorkResult
from workers.queue import InProcessWorkQueue

__all__ = ["Dispatch", "LocalDispatch", "LocalWorkQueue", "RedisDispatch", "TtlDict"]

log = logging.getLogger("argusdiff.service")


class TtlDict:
    """A dict whose entries expire ``ttl_s`` after insertion (one TTL for all: FIFO expiry)."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._data: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def _expire(self, now: float) -> None:
        while self._data:
            key, (expires, _) = next(iter(self._data.items()))
            if expires > now:
                break
            self._data.pop(key)

    def set(self, key: str, value: Any) -> None:
        now = self._clock()
        with self._lock:
            self._data.pop(key, None)
            self._data[key] = (now + self.ttl_s, value)
            self._expire(now)

    def get(self, key: str) -> Any:
        now = self._clock()
        with self._lock:
            self._expire(now)
            entry = self._data.get(key)
            return None if entry is None else entry[1]

    def __len__(self) -> int:
        with self._lock:
            self._expire(self._clock())
            return len(self._data)


class LocalWorkQueue(InProcessWorkQueue):
    """The workers' in-process queue with results kept for ``ttl_s`` (not popped) and a callback
    on every result, plus :meth:`migrate` for levels the plan no longer serves."""

    def __init__(self, ttl_s: float = 3600.0) -> None:
        super().__init__()
        self.results = TtlDict(ttl_s)
        self.on_result: Callable[[str, WorkResult], None] | None = None

    def result(self, request_id: str, result: WorkResult) -> None:
        self.results.set(request_id, result)
        with self._cond:
            self._cond.notify_all()
        cb = self.on_result
        if cb is not None:
            cb(request_id, result)

    def wait_result(self, request_id: str, timeout: float | None = None) -> WorkResult | None:
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._cond:
            while (res := self.results.get(request_id)) is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return res

    def migrate(self, from_level: str, to_level: str, limit: int = 10_000) -> int:
        with self._cond:
            src = self._queues.get(from_level)
            if not src:
                return 0
            dst = self._queues.setdefault(to_level, deque())
            moved = 0
            while src and moved < limit:
                item = src.popleft()
                dst.append(replace(item, level=to_level, meta={**item.meta, "migrated_from": from_level}))
                moved += 1
            self._cond.notify_all()
            return moved

    def pending_by_consumer(self, level_id: str) -> dict[str, int]:
        return {}

    def requeue_consumer(self, level_id: str, consumer: str) -> int:
        return 0


class Dispatch:
    """Base: futures of awaited request ids, resolved by the transport."""

    mode = "embedded"

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._waiters: dict[str, asyncio.Future] = {}
        self.healthy = True
        # bookkeeping hook for EVERY finished item, awaited or not (event-loop thread)
        self.on_done: Callable[[str, dict], None] | None = None

    @property
    def queue(self) -> Any:  # the synchronous WorkQueue (control loop, in-process workers)
        raise NotImplementedError

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()

    async def close(self) -> None:
        for fut in self._waiters.values():
            if not fut.done():
                fut.cancel()
        self._waiters.clear()

    def expect(self, request_ids: Iterable[str]) -> list[asyncio.Future]:
        assert self.loop is not None, "dispatch not started"
        futs = []
        for rid in request_ids:
            fut = self._waiters.get(rid)
            if fut is None:
                fut = self._waiters[rid] = self.loop.create_future()
            futs.append(fut)
        return futs

    def forget(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self._waiters.pop(rid, None)

    def _done(self, request_id: str, summary: dict) -> None:
        if self.on_done is not None:
            try:
                self.on_done(request_id, summary)
            except Exception:  # bookkeeping must never break delivery
                log.exception("result hook failed")

    def _resolve(self, request_id: str, result: WorkResult) -> None:
        fut = self._waiters.pop(request_id, None)
        if fut is not None and not fut.done():
            fut.set_result(result)

    async def enqueue(self, items: list[WorkItem], record: tuple[str, dict, float]) -> None:
        raise NotImplementedError

    async def fetch_results(self, request_ids: list[str]) -> dict[str, WorkResult]:
        raise NotImplementedError

    async def get_record(self, request_id: str) -> dict | None:
        raise NotImplementedError

    async def put_image(self, image_id: str, png: bytes, ttl_s: float) -> None:
        raise NotImplementedError

    async def get_image(self, image_id: str) -> bytes | None:
        raise NotImplementedError

    async def ping(self) -> bool:
        return True


class LocalDispatch(Dispatch):
    mode = "embedded"

    def __init__(self, ttl_s: float = 3600.0) -> None:
        super().__init__()
        self._queue = LocalWorkQueue(ttl_s)
        self._records = TtlDict(ttl_s)
        self._images = TtlDict(ttl_s)
        self._queue.on_result = self._from_worker_thread

    @property
    def queue(self) -> LocalWorkQueue:
        return self._queue

    def _from_worker_thread(self, request_id: str, result: WorkResult) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop shutting down
                loop.call_soon_threadsafe(self._finished, request_id, result)

    def _finished(self, request_id: str, result: WorkResult) -> None:
        from argusdiff.service.redis_queue import summarize

        self._done(request_id, summarize(result))
        self._resolve(request_id, result)

    async def enqueue(self, items: list[WorkItem], record: tuple[str, dict, float]) -> None:
        rid, data, _ttl = record
        self._records.set(rid, data)
        for item in items:
            self._queue.put(item.level, item)

    async def fetch_results(self, request_ids: list[str]) -> dict[str, WorkResult]:
        out = {}
        for rid in request_ids:
            res = self._queue.results.get(rid)
            if res is not None:
                out[rid] = res
        return out

    async def get_record(self, request_id: str) -> dict | None:
        return self._records.get(request_id)

    async def put_image(self, image_id: str, png: bytes, ttl_s: float) -> None:
        self._images.set(image_id, png)

    async def get_image(self, image_id: str) -> bytes | None:
        return self._images.get(image_id)


class RedisDispatch(Dispatch):
    mode = "redis"

    def __init__(self, url: str, *, namespace: str = "argusdiff", result_ttl_s: float = 3600.0) -> None:
        super().__init__()
        from argusdiff.service.redis_queue import AsyncRedisDispatch, RedisWorkQueue

        self.url = url
        self.aio = AsyncRedisDispatch(url, namespace=namespace)
        self._queue = RedisWorkQueue(url, namespace=namespace, consumer="control", result_ttl_s=result_ttl_s)
        self._listener: asyncio.Task | None = None
        self._last_id = "$"

    @property
    def queue(self):
        return self._queue

    async def start(self) -> None:
        await super().start()
        try:
            self._last_id = await self.aio.last_done_id()
        except QueueUnavailable:
            self.healthy = False
            self._last_id = "0-0"
        self._listener = asyncio.create_task(self._listen(), name="argusdiff-results")

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
        await super().close()
        await self.aio.close()

    async def _catch_up(self) -> None:
        waiting = list(self._waiters)
        for i in range(0, len(waiting), 500):
            found = await self.aio.fetch_results(waiting[i : i + 500])
            for rid, res in found.items():
                self._resolve(rid, res)

    async def _listen(self) -> None:
        backoff = 0.05
        last_sweep = time.monotonic()
        while True:
            try:
                if not self.healthy:
                    await self.aio.r.ping()
                    self.healthy = True
                    log.info("redis is reachable again")
                    await self._catch_up()
                self._last_id, done = await self.aio.read_done(self._last_id, block_ms=500)
                backoff = 0.05
                for rid, summary in done:
                    self._done(rid, summary)
                wanted = [rid for rid, _ in done if rid in self._waiters]
                if wanted:
                    for rid, res in (await self.aio.fetch_results(wanted)).items():
                        self._resolve(rid, res)
                if time.monotonic() - last_sweep > 2.0:  # belt and braces: a notification lost in a trim
                    last_sweep = time.monotonic()
                    await self._catch_up()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.healthy:
                    log.warning("redis unavailable: %s", exc)
                self.healthy = False
                await asyncio.sleep(backoff)
                backoff = min(1.0, backoff * 2)

    async def ping(self) -> bool:
        ok = await self.aio.ping()
        if not ok:
            self.healthy = False
        return ok

    async def enqueue(self, items: list[WorkItem], record: tuple[str, dict, float]) -> None:
        try:
            await self.aio.enqueue(items, record)
        except QueueUnavailable:
            self.healthy = False
            raise

    async def fetch_results(self, request_ids: list[str]) -> dict[str, WorkResult]:
        return await self.aio.fetch_results(request_ids)

    async def get_record(self, request_id: str) -> dict | None:
        return await self.aio.get_record(request_id)

    async def put_image(self, image_id: str, png: bytes, ttl_s: float) -> None:
        await self.aio.put_image(image_id, png, ttl_s)

    async def get_image(self, image_id: str) -> bytes | None:
        return await self.aio.get_image(image_id)
