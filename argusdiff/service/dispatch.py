"""The router's side of the queues: enqueue work, follow it until its result is delivered, keep
results within a memory budget, put images in the image store, and end every wait.

Every accepted work item has a :class:`Delivery` here until its result arrives. What happens to
the result depends on who wants it:

* a client is waiting (``wait``, a synchronous OpenAI call, a stream): a ``b64_json`` image goes to
  it (and into the bounded memory for a repeat poll); a ``url`` image is first written to the
  image store (:mod:`argusdiff.service.images`), the client gets its URL;
* nobody is waiting (``wait: false``, a wait that timed out): the image goes to the image store,
  so a poll finds it until ``result_ttl_s``;
* the client went away (:meth:`Dispatch.cancel`): the item is taken out of its queue if no worker
  has started it (:attr:`Dispatch.on_forget` does the bookkeeping), else its result is dropped.

Results in router memory (:class:`~argusdiff.service.transport.memory.ResultMemory`) are bounded by
``[service] result_memory_mb`` (oldest evicted first). In Redis mode no image passes through Redis
(the claim check, :mod:`argusdiff.service.images`): a worker writes each image into the image store
in the requested format and its result in ``ns:result:<id>`` names it; the router reads the image
from the store when it answers (``b64_json``, a stream's partial and final images) or hands out its
URL, and the store keeps it until ``result_ttl_s``.

Waits end with the result, with :class:`~argusdiff.service.errors.WorkLost` when the work is known
lost (Redis mode: its request record vanished, e.g. Redis restarted without AOF), and with
:class:`~argusdiff.service.errors.ShuttingDown` at the end of a shutdown's drain.

* :class:`LocalDispatch` — embedded mode: a
  :class:`~argusdiff.service.transport.memory.LocalWorkQueue` shared with in-process
  workers; results and step events come back by callbacks from the worker threads.
* :class:`RedisDispatch` — distributed mode: a listener task follows the ``done`` stream (and
  re-reads what is awaited every 2 s, or after an outage); step events arrive on a pub/sub channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from argusdiff.service.errors import QueueUnavailable, ShuttingDown, WorkLost
from argusdiff.service.images import ImageStore, encode, image_id
from argusdiff.service.transport.guard import current_guard
from argusdiff.service.transport.memory import LocalWorkQueue, ResultMemory
from argusdiff.service.transport.protocol import summarize
from workers.cancel import CANCELLED
from workers.messages import WorkItem, WorkResult

__all__ = ["Delivery", "Dispatch", "LocalDispatch", "RedisDispatch", "jittered"]

log = logging.getLogger("argusdiff.service")


#: How many carried-out cascade hand-offs a router remembers (a catch-up reads a light result again
#: only until its heavy run replaces it, seconds later; this covers far more than that).
HANDOFFS_REMEMBERED = 65536


def jittered(backoff_s: float) -> float:
    """A reconnect wait drawn uniformly from [backoff/2, backoff] ("equal jitter"), so that the
    routers and workers that lost Redis together do not all retry in the same instant."""
    return backoff_s * (0.5 + random.random() / 2)


async def stop_task(task: asyncio.Task | None, timeout_s: float = 5.0) -> None:
    """Cancel ``task`` and wait for it to end, at most ``timeout_s``. The cancellation is repeated:
    a client library whose read timeout fires in the same instant as the cancel can turn the
    ``CancelledError`` into a timeout it retries (redis-py's cluster client does), and a single
    ``cancel()`` is then lost. A task that still runs after the wait is left behind with a warning
    rather than hanging the shutdown."""
    if task is None or task.done():
        return
    deadline = time.monotonic() + timeout_s
    while not task.done():
        task.cancel()
        left = deadline - time.monotonic()
        if left <= 0:
            log.warning("task %s did not stop within %.0f s of its cancellation", task.get_name(), timeout_s)
            return
        await asyncio.wait({task}, timeout=min(0.25, left))
    if not task.cancelled() and task.exception() is not None:
        log.debug("task %s ended with %r", task.get_name(), task.exception())


@dataclass(slots=True)
class Delivery:
    """This router's view of one accepted work item, until its result is delivered."""

    gid: str = ""
    level: str = ""
    response_format: str = "b64_json"
    output_format: str = "png"
    compression: int | None = None
    future: asyncio.Future | None = None  # a client is waiting
    events: asyncio.Queue | None = None  # a client streams: step events, then the result
    abandoned: bool = False  # the client went away: drop the result
    queued: bool = False  # the enqueue succeeded
    keep: bool = False  # sent with an Idempotency-Key: a retry may ask again, keep the image
    entry: str | None = None  # the transport's handle to take it out of its queue
    prompt: str = ""


class Dispatch:
    """Base: deliveries, waits, results in memory and the image store; the transport is the subclass's."""

    mode = "embedded"

    def __init__(self, *, result_ttl_s: float = 3600.0, memory_bytes: int = 256 << 20, images: Any = None) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.result_ttl_s = result_ttl_s
        self.results = ResultMemory(memory_bytes, result_ttl_s)
        self.images: ImageStore | None = images
        self.healthy = True
        self._deliveries: dict[str, Delivery] = {}
        self._tasks: set[asyncio.Task] = set()
        self._sweeper: asyncio.Task | None = None
        # bookkeeping hook for EVERY finished item, awaited or not (event-loop thread)
        self.on_done: Callable[[str, dict], None] | None = None
        # a served image of this router with its prompt (the drift loop samples them)
        self.on_served: Callable[[str, WorkResult], None] | None = None
        # bookkeeping hook for items that will never finish: (request ids, "cancelled" | "lost")
        self.on_forget: Callable[[list[str], str], None] | None = None
        # the policy's decision on a cascade hand-off (event-loop thread): (the item to queue, None)
        # when the heavy level redoes it, (None, final result) when the light image is kept or the
        # request dropped; unset: the heavy level redoes every hand-off
        self.on_handoff: Callable[[str, WorkResult], tuple[WorkItem | None, WorkResult | None]] | None = None
        # a failed transport operation outside a request (the results listener's)
        self.on_error: Callable[[], None] | None = None

    @property
    def queue(self) -> Any:  # the synchronous WorkQueue (control loop, in-process workers)
        raise NotImplementedError

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        if self.images is not None:
            self._sweeper = asyncio.create_task(self._sweep_images(), name="argusdiff-image-sweep")

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        self.end_waits(ShuttingDown("the router stopped"))
        if self._tasks:  # image stores in flight: bounded by the store's own timeouts
            await asyncio.wait(list(self._tasks), timeout=10)
        for task in self._tasks:
            task.cancel()
        close = getattr(self.images, "close", None)
        if callable(close):
            close()

    async def _sweep_images(self) -> None:
        period = max(1.0, min(300.0, self.result_ttl_s / 10))
        while True:
            await asyncio.sleep(period)
            try:
                n = await asyncio.to_thread(self.images.sweep, self.result_ttl_s)  # type: ignore[union-attr]
                if n:
                    log.info("image store: %d expired images deleted", n)
            except Exception as exc:
                log.warning("image store sweep failed: %s", exc)

    # -- deliveries ------------------------------------------------------------------------

    def expect(self, request_ids: Iterable[str]) -> list[asyncio.Future]:
        """A client waits for these items (call before they are enqueued)."""
        assert self.loop is not None, "dispatch not started"
        futs = []
        for rid in request_ids:
            d = self._deliveries.setdefault(rid, Delivery())
            if d.future is None or d.future.done():
                d.future = self.loop.create_future()
            futs.append(d.future)
        return futs

    def events(self, request_id: str) -> asyncio.Queue:
        """The step events of an awaited item, then ``("result", WorkResult)`` or ``("error", exc)``."""
        d = self._deliveries.setdefault(request_id, Delivery())
        if d.events is None:
            d.events = asyncio.Queue()
        return d.events

    def forget(self, request_ids: Iterable[str]) -> None:
        """Never accepted (the enqueue failed): no delivery."""
        for rid in request_ids:
            self._deliveries.pop(rid, None)

    def detach(self, request_ids: Iterable[str]) -> None:
        """The client stopped waiting but the work stays: its images go to the image store."""
        for rid in request_ids:
            d = self._deliveries.get(rid)
            if d is not None:
                d.future = None
                d.events = None

    async def wait(self, request_ids: list[str], timeout: float) -> list[WorkResult]:
        """The results in order. Raises ``TimeoutError`` (the work stays queued, its images will be
        kept), :class:`WorkLost` or :class:`ShuttingDown`."""
        futs = self.expect(request_ids)
        try:
            done = await asyncio.wait_for(asyncio.gather(*(asyncio.shield(f) for f in futs)), timeout)
        except (TimeoutError, WorkLost, ShuttingDown):
            self.detach(request_ids)
            raise
        return list(done)

    async def cancel(self, request_ids: Iterable[str]) -> tuple[list[str], list[str]]:
        """Cancel the items (the client went away, or ``DELETE``): each is taken out of its queue
        where no worker has started it (reported to :attr:`on_forget`); the others are stopped
        where they run (the worker's denoising loop stops at its next step, see
        :mod:`workers.cancel`) and their results are dropped. Items this router does not follow
        (another router's, in Redis mode) are stopped through the transport all the same. A client
        still waiting for one gets its cancelled result. Returns (taken out, stopped)."""
        removed, stopping = [], []
        for rid in request_ids:
            d = self._deliveries.get(rid)
            if d is None:
                stopping.append(rid)
                continue
            self._resolve(d, WorkResult(request_id=rid, level=d.level, error="cancelled", error_type=CANCELLED))
            d.abandoned, d.future, d.events = True, None, None
            taken = False
            if d.queued:
                try:
                    taken = await self._unqueue(rid, d)
                except Exception as exc:  # the transport is down: stopped below, or dropped when it comes
                    log.warning("cannot take %s out of its queue: %s", rid, exc)
            if taken:
                self._deliveries.pop(rid, None)
                removed.append(rid)
            else:
                stopping.append(rid)
        if stopping:
            try:
                await self._stop(stopping)
            except Exception as exc:  # their results are dropped when they come
                log.warning("cannot stop %d running images: %s", len(stopping), exc)
        if removed and self.on_forget is not None:
            self.on_forget(removed, "cancelled")
        return removed, stopping

    def waiting(self) -> int:
        """Items a client is waiting for."""
        return sum(1 for d in self._deliveries.values() if d.future is not None and not d.future.done())

    def end_waits(self, exc: Exception) -> int:
        """End every wait with ``exc`` (shutdown); the work goes on and its images will be kept."""
        n = 0
        for d in self._deliveries.values():
            if d.future is not None and not d.future.done():
                self._resolve(d, exc=exc)
                n += 1
            d.future, d.events = None, None
        return n

    def _lost(self, request_ids: list[str], why: str) -> None:
        for rid in request_ids:
            d = self._deliveries.pop(rid, None)
            if d is not None:
                self._resolve(d, exc=WorkLost(why))
        if request_ids and self.on_forget is not None:
            self.on_forget(request_ids, "lost")

    @staticmethod
    def _resolve(d: Delivery, result: WorkResult | None = None, exc: Exception | None = None) -> None:
        fut = d.future
        if fut is not None and not fut.done():
            if exc is not None:
                fut.set_exception(exc)
                fut.exception()  # retrieved: a wait that already ended must not log it
            else:
                fut.set_result(result)
        if d.events is not None:
            d.events.put_nowait(("error", exc) if exc is not None else ("result", result))

    def _track(self, items: list[WorkItem], record: dict) -> list[Delivery]:
        out = []
        for item in items:
            d = self._deliveries.setdefault(item.request_id, Delivery())
            d.gid = str(record.get("id", ""))
            d.level = item.level
            d.response_format = str(record.get("response_format", "b64_json"))
            d.output_format = str(record.get("output_format") or "png")
            d.compression = record.get("output_compression")
            d.keep = current_guard() is not None
            d.prompt = item.prompt
            out.append(d)
        return out

    def _event(self, request_id: str, event: dict) -> None:
        """A step event from a worker (event-loop thread): to the client that streams it."""
        d = self._deliveries.get(request_id)
        if d is not None and d.future is not None and not d.abandoned:
            self.events(request_id).put_nowait(("event", event))

    def _arrived(self, request_id: str, result: WorkResult) -> None:
        """A finished item's result (event-loop thread)."""
        d = self._deliveries.pop(request_id, None)
        if d is None:  # not ours (another router's, or accepted before a restart)
            self._untracked(request_id, result)
            return
        if self.on_served is not None and result.ok:
            try:
                self.on_served(d.prompt, result)
            except Exception:  # an observer must never break delivery
                log.exception("result observer failed")
        if d.abandoned:
            self._spawn(self._discard(request_id, result))
            return
        live = d.future is not None and not d.future.done()
        if result.ok and result.image_png is not None and (d.response_format == "url" or not live or d.keep):
            self._spawn(self._keep(request_id, result, d))
            return
        self.results.set(request_id, result)
        if result.image_png is not None:  # delivered: no copy of the image stays in the queue
            self._spawn(self._rewrite(request_id, replace(result, image_png=None, image_ref="")))
        self._resolve(d, result)

    async def _keep(self, request_id: str, result: WorkResult, d: Delivery) -> None:
        """Into the image store (in the requested format); memory and Redis keep the reference."""
        kept = result
        if self.images is not None:
            key = image_id(request_id, d.output_format)
            png = result.image_png or b""
            try:
                await asyncio.to_thread(self._store, key, png, d.output_format, d.compression)
                kept = replace(result, image_png=None, image_ref=key)
            except Exception as exc:  # keep it in memory (bounded) instead
                log.warning("image store %s failed, %s stays in memory: %s", self.images.description, key, exc)
        self.results.set(request_id, kept)
        if kept is not result:
            await self._rewrite(request_id, kept)
        self._resolve(d, kept)

    def _store(self, key: str, png: bytes, output_format: str, compression: int | None) -> None:
        assert self.images is not None
        self.images.put(key, encode(png, output_format, compression))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _decide_handoff(self, request_id: str, result: WorkResult) -> tuple[WorkItem | None, WorkResult | None]:
        assert result.handoff is not None
        if self.on_handoff is None:
            return result.handoff, None
        try:
            return self.on_handoff(request_id, result)
        except Exception:  # a failed decision must not lose the request: the heavy level redoes it
            log.exception("cascade hand-off decision failed")
            return result.handoff, None

    def _requeued(self, request_id: str, item: WorkItem, entry: str | None = None) -> None:
        d = self._deliveries.get(request_id)
        if d is not None:
            d.level, d.entry = item.level, entry

    def _done(self, request_id: str, summary: dict) -> None:
        if self.on_done is not None:
            try:
                self.on_done(request_id, summary)
            except Exception:  # bookkeeping must never break delivery
                log.exception("result hook failed")

    # -- transport (subclasses) ----------------------------------------------------------------

    def _untracked(self, request_id: str, result: WorkResult) -> None:
        """A result of an item this router does not follow."""

    async def _rewrite(self, request_id: str, result: WorkResult) -> None:
        """Replace the transport's copy of a result (e.g. without its image)."""

    async def _discard(self, request_id: str, result: WorkResult | None = None) -> None:
        """Delete the transport's copy of an abandoned item's result (and its stored image)."""

    async def _unqueue(self, request_id: str, d: Delivery) -> bool:
        """Take a queued item out if no worker has started it."""
        return False

    async def _stop(self, request_ids: list[str]) -> None:
        """Tell the workers that these items are cancelled (skip them, or stop running them)."""

    async def mark_record(self, request_id: str, fields: dict[str, Any]) -> dict | None:
        """Add ``fields`` to the request's record (e.g. ``status: cancelled``); None when it is gone."""
        raise NotImplementedError

    async def enqueue(self, items: list[WorkItem], record: tuple[str, dict, float]) -> None:
        raise NotImplementedError

    async def fetch_results(self, request_ids: list[str], record: dict | None = None) -> dict[str, WorkResult]:
        """The finished results among ``request_ids`` (of the generation ``record``, if given)."""
        raise NotImplementedError

    async def get_record(self, request_id: str) -> dict | None:
        raise NotImplementedError

    async def ping(self) -> bool:
        return True


class LocalDispatch(Dispatch):
    mode = "embedded"

    def __init__(self, ttl_s: float = 3600.0, *, memory_bytes: int = 256 << 20, images: Any = None) -> None:
        super().__init__(result_ttl_s=ttl_s, memory_bytes=memory_bytes, images=images)
        self._queue = LocalWorkQueue()
        self._records = ResultMemory(max(1 << 20, memory_bytes // 4), ttl_s)  # ~1 KiB a record
        self._queue.on_result = self._from_worker_thread
        self._queue.on_event = self._event_from_worker_thread

    @property
    def queue(self) -> LocalWorkQueue:
        return self._queue

    def _call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop shutting down
                loop.call_soon_threadsafe(fn, *args)

    def _from_worker_thread(self, request_id: str, result: WorkResult) -> None:
        self._call_soon(self._finished, request_id, result)

    def _event_from_worker_thread(self, request_id: str, event: dict) -> None:
        self._call_soon(self._event, request_id, event)

    def _finished(self, request_id: str, result: WorkResult) -> None:
        if result.handoff is not None:
            item, final = self._decide_handoff(request_id, result)
            if item is not None:
                self._queue.put(item.level, item)
                self._requeued(request_id, item)
                return
            assert final is not None
            result = final
        self._done(request_id, summarize(result))
        self._arrived(request_id, result)

    def _untracked(self, request_id: str, result: WorkResult) -> None:
        self.results.set(request_id, result)

    async def _unqueue(self, request_id: str, d: Delivery) -> bool:
        return self._queue.cancel(request_id)

    async def _stop(self, request_ids: list[str]) -> None:
        self._queue.stop(request_ids)

    async def mark_record(self, request_id: str, fields: dict[str, Any]) -> dict | None:
        record = self._records.get(request_id)
        if record is None:
            return None
        record = {**record, **fields}
        self._records.set(request_id, record)
        return record

    async def enqueue(self, items: list[WorkItem], record: tuple[str, dict, float]) -> None:
        rid, data, _ttl = record
        deliveries = self._track(items, data)
        self._records.set(rid, data)
        for item, d in zip(items, deliveries, strict=True):
            self._queue.put(item.level, item)
            d.queued = True

    async def fetch_results(self, request_ids: list[str], record: dict | None = None) -> dict[str, WorkResult]:
        out = {}
        for i, rid in enumerate(request_ids):
            res = self.results.get(rid)
            if res is None and record is not None and rid not in self._deliveries:
                res = self._evicted(rid, record, i)
            if res is not None:
                out[rid] = res
        return out

    def _evicted(self, request_id: str, record: dict, index: int) -> WorkResult:
        """A finished result no longer in memory: only its image may remain, in the image store
        (a kept image; a delivered one is gone)."""
        levels = record.get("levels") or []
        return WorkResult(
            request_id=request_id,
            level=str(levels[index]) if index < len(levels) else "unknown",
            image_ref=image_id(request_id, str(record.get("output_format") or "png")),
        )

    async def get_record(self, request_id: str) -> dict | None:
        return self._records.get(request_id)


class RedisDispatch(Dispatch):
    mode = "redis"

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "argusdiff",
        result_ttl_s: float = 3600.0,
        memory_bytes: int = 256 << 20,
        images: Any = None,
        min_record_ttl_s: float = 0.0,
    ) -> None:
        super().__init__(result_ttl_s=result_ttl_s, memory_bytes=memory_bytes, images=images)
        from argusdiff.service.transport.redis_dispatch import AsyncRedisDispatch
        from argusdiff.service.transport.redis_streams import RedisWorkQueue

        self.url = url
        self.aio = AsyncRedisDispatch(url, namespace=namespace, images=images)
        self._queue = RedisWorkQueue(
            url, namespace=namespace, consumer="control", result_ttl_s=result_ttl_s, images=images
        )
        self.min_record_ttl_s = min_record_ttl_s  # records outlive every wait: a missing one means lost work
        self._listener: asyncio.Task | None = None
        self._subscriber: asyncio.Task | None = None
        self._last_id = "$"
        self._closing = False
        #: cascade hand-offs read but not yet carried out (Redis failed between the claim and the
        #: re-queue): request id -> the light result, or None where the result was not read yet
        self._handoffs_pending: dict[str, WorkResult | None] = {}
        #: hand-offs this router carried out (newest last, bounded): a catch-up that reads the light
        #: result again before the heavy one replaces it must not decide it twice
        self._handoffs_carried: OrderedDict[str, None] = OrderedDict()

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
        self._subscriber = asyncio.create_task(self._follow_events(), name="argusdiff-events")

    async def close(self) -> None:
        self._closing = True  # the loops end at their next turn even where a cancel is swallowed
        for task in (self._listener, self._subscriber):
            await stop_task(task)
        await super().close()
        await self.aio.close()

    async def _catch_up(self) -> None:
        """Read the results of everything followed (a notification lost in an outage or a trim),
        and end the waits of work whose request record is gone (Redis lost its data)."""
        await self._retry_handoffs()
        followed = [rid for rid, d in self._deliveries.items() if d.queued]
        missing = []
        for i in range(0, len(followed), 500):
            chunk = followed[i : i + 500]
            found = await self.aio.fetch_results(chunk)
            for rid, res in found.items():
                if res.handoff is not None:  # a hand-off whose notification was missed
                    await self._handoff(rid, res)
                else:
                    self._arrived(rid, res)
            missing.extend(rid for rid in chunk if rid not in found)
        gids = sorted({d.gid for rid in missing if (d := self._deliveries.get(rid)) is not None and d.gid})
        if not gids:
            return
        present = await self.aio.records_exist(gids)
        gone = {g for g, ok in zip(gids, present, strict=True) if not ok}
        lost = [rid for rid in missing if (d := self._deliveries.get(rid)) is not None and d.gid in gone]
        if lost:
            log.warning("%d accepted images were lost by the queue (its records are gone: was Redis restarted "
                        "without AOF?)", len(lost))  # fmt: skip
            self._lost(lost, "the queue lost this request (Redis restarted without persistence?); retry it")

    async def _listen(self) -> None:
        """Follow the ``done`` stream. Its blocking read times out a socket timeout after the block
        (a frozen Redis), so ``healthy`` turns false within about ``block_ms`` + 2 s of a freeze
        or an outage, and true again at the first ping that answers."""
        backoff = 0.05
        last_sweep = time.monotonic()
        while not self._closing:
            try:
                if not self.healthy:
                    await self.aio.r.ping()
                    self.healthy = True
                    log.info("redis is reachable again")
                    await self._catch_up()
                self._last_id, done = await self.aio.read_done(self._last_id, block_ms=self.aio.block_ms)
                backoff = 0.05
                handoffs = [rid for rid, summary in done if summary.get("handoff")]
                for rid, summary in done:
                    if not summary.get("handoff"):
                        self._done(rid, summary)
                wanted = [rid for rid, summary in done if rid in self._deliveries and not summary.get("handoff")]
                if wanted:
                    for rid, res in (await self.aio.fetch_results(wanted)).items():
                        self._arrived(rid, res)
                if handoffs:
                    self._handoffs_pending.update(dict.fromkeys(handoffs))
                    await self._retry_handoffs()
                if time.monotonic() - last_sweep > 2.0:
                    last_sweep = time.monotonic()
                    await self._catch_up()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.healthy:
                    log.warning("redis unavailable: %s", exc)
                    if self.on_error is not None:
                        self.on_error()
                self.healthy = False
                await asyncio.sleep(jittered(backoff))
                backoff = min(1.0, backoff * 2)

    async def _follow_events(self) -> None:
        """Step events of streamed items (pub/sub: a router that is not listening misses them)."""
        backoff = 0.05
        while not self._closing:
            try:
                async for request_id, event in self.aio.events():
                    backoff = 0.05
                    self._event(request_id, event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("event subscription interrupted: %s", exc)
            await asyncio.sleep(jittered(backoff))
            backoff = min(1.0, backoff * 2)

    async def _retry_handoffs(self) -> None:
        """Carry out the hand-offs read and not yet done, oldest first. One that Redis fails stays
        pending with those after it (the error goes up: the listener marks Redis unhealthy and
        comes back here when it answers), so a claimed hand-off is never dropped by an outage."""
        while self._handoffs_pending:
            rid, res = next(iter(self._handoffs_pending.items()))
            if res is None:
                unread = [r for r, v in self._handoffs_pending.items() if v is None]
                found = await self.aio.fetch_results(unread)
                for r in unread:  # a result gone (expired, or taken by the claimant) has no hand-off
                    if r in found:
                        self._handoffs_pending[r] = found[r]
                    else:
                        del self._handoffs_pending[r]
                continue
            await self._handoff(rid, res)
            self._handoffs_pending.pop(rid, None)

    async def _handoff(self, request_id: str, result: WorkResult) -> None:
        """A cascade hand-off (see :attr:`Dispatch.on_handoff`); every router reads it, the first to
        claim it decides (an item re-queued here, or the final result published as a worker's)."""
        if result.handoff is None or request_id in self._handoffs_carried:
            return
        if not await self.aio.claim_handoff(request_id, self.result_ttl_s):
            return
        item, final = self._decide_handoff(request_id, result)
        if item is not None:
            entries = await self.aio.enqueue([item], deadline=False)  # a late run only delays it
            self._requeued(request_id, item, entries[0] if entries else None)
        elif final is not None:
            await self.aio.publish_result(request_id, final, self.result_ttl_s)
        self._handoffs_carried[request_id] = None
        if len(self._handoffs_carried) > HANDOFFS_REMEMBERED:
            self._handoffs_carried.popitem(last=False)

    async def ping(self) -> bool:
        ok = await self.aio.ping()
        if not ok:
            self.healthy = False
        return ok

    async def enqueue(self, items: list[WorkItem], record: tuple[str, dict, float]) -> None:
        rid, data, ttl = record
        deliveries = self._track(items, data)
        try:
            entries = await self.aio.enqueue(items, (rid, data, max(ttl, self.min_record_ttl_s)))
        except QueueUnavailable:
            self.healthy = False
            raise
        for d, entry in zip(deliveries, entries, strict=True):
            d.entry, d.queued = entry, True

    async def _unqueue(self, request_id: str, d: Delivery) -> bool:
        return d.entry is not None and await self.aio.cancel(d.level, d.entry)

    async def _stop(self, request_ids: list[str]) -> None:
        await self.aio.request_cancel(request_ids, self.result_ttl_s)

    async def mark_record(self, request_id: str, fields: dict[str, Any]) -> dict | None:
        return await self.aio.update_record(request_id, fields)

    async def _rewrite(self, request_id: str, result: WorkResult) -> None:
        try:
            await self.aio.replace_result(request_id, result)
        except QueueUnavailable as exc:  # it expires with its TTL anyway
            log.debug("cannot rewrite the result of %s: %s", request_id, exc)

    async def _discard(self, request_id: str, result: WorkResult | None = None) -> None:
        try:
            await self.aio.delete_result(request_id)
        except QueueUnavailable as exc:
            log.debug("cannot delete the result of %s: %s", request_id, exc)
        if result is not None and result.image_ref and self.images is not None:
            try:  # nobody will ask for it (else the sweep deletes it after result_ttl_s)
                await asyncio.to_thread(self.images.delete, result.image_ref)
            except Exception as exc:
                log.debug("cannot delete the image of %s: %s", request_id, exc)

    async def fetch_results(self, request_ids: list[str], record: dict | None = None) -> dict[str, WorkResult]:
        out = {rid: res for rid in request_ids if (res := self.results.get(rid)) is not None}
        rest = [rid for rid in request_ids if rid not in out]
        if rest:
            out.update(await self.aio.fetch_results(rest))
        return out

    async def get_record(self, request_id: str) -> dict | None:
        return await self.aio.get_record(request_id)
