"""The router's asyncio side of the Redis Streams transport (:mod:`argusdiff.service.transport.redis_streams`
holds the layout and the synchronous side): enqueue a request's items in one atomic step, listen for
results and step events, cancel, and answer for requests a restarted router accepted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.exceptions import RedisError, ResponseError

from argusdiff.service.errors import QueueUnavailable
from argusdiff.service.transport.guard import IdempotencyConflict, current_guard
from argusdiff.service.transport.protocol import summarize
from argusdiff.service.transport.redis_client import async_client, is_cluster_client
from argusdiff.service.transport.redis_scripts import CANCEL_QUEUED, CLAIM_HANDOFF, CLOCK, ENQUEUE, ENQUEUE_LEVEL
from argusdiff.service.transport.redis_streams import (
    CLOCK_READING_S,
    DONE_MAXLEN,
    HEALTH_CHECK_S,
    INPUT_REFS,
    RedisKeys,
    _entry_ref,
    _reconnect,
    claim_inputs,
    decode,
    event_from_json,
)
from workers.messages import WorkItem, WorkResult
from workers.queue import WORKER_META

__all__ = ["AsyncRedisDispatch"]


class AsyncRedisDispatch:
    """The router's asyncio side: enqueue, listen for finished requests, store request records
    and url images. Every failure becomes :class:`QueueUnavailable`."""

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "argusdiff",
        socket_timeout_s: float = 2.0,
        block_ms: int = 500,
        images: Any = None,
    ) -> None:
        self.socket_timeout_s = socket_timeout_s
        self.images = images  # where an edit's inputs go before its items are queued (claim check)
        self.r = async_client(
            url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            health_check_interval=HEALTH_CHECK_S,
            retry=_reconnect(AsyncRetry),
        )
        # a second pool for the blocking XREAD so it never starves the data path; its reads time out
        # a socket timeout after the block ends, so a frozen Redis turns the router unhealthy
        self.block_ms = block_ms
        self.listen_r = async_client(
            url,
            socket_timeout=block_ms / 1000 + socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            retry=_reconnect(AsyncRetry),
        )
        # pub/sub waits as long as no event comes (a restart ends it with a connection error); on a
        # cluster too it is one connection to the node of the URL (a PUBLISH reaches every node)
        self.events_r = aioredis.Redis.from_url(url, socket_timeout=None, socket_connect_timeout=socket_timeout_s)
        self.cluster = is_cluster_client(self.r)
        self.keys = RedisKeys(namespace)
        #: this router's step-event channel, named in the streamed items it queues
        self.events_channel = self.keys.events_of(secrets.token_hex(8))
        self._groups: set[str] = set()
        self._enqueue = self.r.register_script(ENQUEUE)
        self._enqueue_level = self.r.register_script(ENQUEUE_LEVEL)
        self._clock_script = self.r.register_script(CLOCK)
        self._claim_handoff_script = self.r.register_script(CLAIM_HANDOFF)
        #: this router's name on the hand-offs it claims
        self.claimant = secrets.token_hex(8)
        self._clock: tuple[float, float] | None = None  # (Redis's clock in ms, time.monotonic() when read)
        #: an enqueue that Redis has not run this long after it was sent never runs (s)
        self.accept_window_s = 0.75 * socket_timeout_s

    async def _ensure_group(self, level_id: str, tier: str | None = None, worker: str | None = None) -> str:
        stream = self.keys.stream(level_id, tier, worker)
        if stream not in self._groups:
            try:
                await self.r.xgroup_create(stream, self.keys.group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._groups.add(stream)
        return stream

    async def ping(self) -> bool:
        try:
            return bool(await self.r.ping())
        except (RedisError, OSError):
            return False

    async def redis_clock_ms(self) -> tuple[float, float]:
        """A reading of Redis's clock: (its time in ms, ``time.monotonic()`` when the reply came),
        read again when older than :data:`CLOCK_READING_S`."""
        now = time.monotonic()
        if self._clock is None or now - self._clock[1] > CLOCK_READING_S:
            ms = await self._clock_script(keys=[self.keys.leader])  # the control slot's node
            self._clock = (float(ms), time.monotonic())
        return self._clock

    async def enqueue(
        self, items: Iterable[WorkItem], record: tuple[str, dict, float] | None = None, *, deadline: bool = True
    ) -> list[str | None]:
        """Queue items atomically, with the request's record (id, JSON, ttl) in the same step;
        returns each item's stream entry id (None for every item when the step had already run:
        a retry after a lost connection).

        With ``deadline`` the step runs only if Redis reads it within :attr:`accept_window_s` of its
        sending, measured on Redis's clock (read at most :data:`CLOCK_READING_S` before), so an
        enqueue that raised :class:`QueueUnavailable` never runs later: a refusal is true.

        For a request sent with an ``Idempotency-Key`` (:func:`argusdiff.service.transport.guard.current_guard`)
        the step also turns the key's reservation into the accepted generation id, and runs only
        while the reservation is still ours; else nothing is queued and
        :class:`~argusdiff.service.transport.guard.IdempotencyConflict` is raised.

        On a Redis Cluster the levels' streams and the record are in different slots, so one step
        cannot hold them: :meth:`_enqueue_by_slot` queues the items level by level, then writes the
        record under the same deadline, and that write is the acceptance (workers run an item only
        once its request's record exists, :meth:`RedisWorkQueue._accepted`)."""
        guard = current_guard() if record is not None else None
        items = list(items)
        if any(k in item.meta for item in items for k in INPUT_REFS):
            try:
                items = await asyncio.to_thread(lambda: [claim_inputs(item, self.images) for item in items])
            except Exception as exc:  # the image store failed: nothing was queued
                raise QueueUnavailable(f"image store unavailable: {exc}") from exc
        try:
            for item in items:
                worker = item.meta.get(WORKER_META) or None
                await self._ensure_group(item.level, item.tier, worker)
                if worker is not None:  # known to the control loop's sweep before it is queued there
                    await self.r.sadd(self.keys.owners(item.level), worker)
            limit = 0
            if deadline:
                clock_ms, read_at = await self.redis_clock_ms()
                # Redis's clock when it reads the step is at least clock_ms + (send - read_at): a
                # step read later than the window after its sending is refused
                limit = int(clock_ms + (time.monotonic() - read_at + self.accept_window_s) * 1000)
            if self.cluster:
                return await self._enqueue_by_slot(items, record, guard, limit)
            keys: list[str] = []
            args: list[Any] = [limit, 0, "", 0, "", "", 0]
            if record is not None:
                rid, data, ttl = record
                keys.append(self.keys.request(rid))
                args[1:4] = [1, json.dumps(data), max(1, int(ttl * 1000))]
                if guard is not None:
                    keys.append(guard.key)
                    args[1] = 2
                    args[4:7] = [guard.reservation, guard.accepted(rid), max(1, int(guard.ttl_s * 1000))]
            keys.extend(self.keys.item_stream(item) for item in items)
            args.extend(json.dumps(self._reply_here(item).to_dict()) for item in items)
            reply = await self._enqueue(keys=keys, args=args)
        except ResponseError as exc:
            if "NOGROUP" in str(exc):
                self._groups.clear()
            raise QueueUnavailable(f"redis: {exc}") from exc
        except (RedisError, OSError) as exc:
            self._groups.clear()
            self._clock = None
            raise QueueUnavailable(f"redis unavailable: {exc}") from exc
        return self._outcome(decode(reply[0]), items, [decode(r) for r in reply[1:]], guard)

    def _outcome(self, status: str, items: list[WorkItem], entries: list[str | None], guard: Any) -> list[str | None]:
        if status == "ok":
            return [None if e is None else _entry_ref(item, e) for item, e in zip(items, entries, strict=True)]
        if status == "exists":
            return [None] * len(items)
        if status == "conflict":
            assert guard is not None
            guard.conflict = True
            raise IdempotencyConflict("the idempotency key's reservation is no longer ours")
        self._clock = None
        raise QueueUnavailable("redis read the enqueue too late; it was not run")

    async def _enqueue_by_slot(
        self, items: list[WorkItem], record: tuple[str, dict, float] | None, guard: Any, limit: int
    ) -> list[str | None]:
        """The cluster's enqueue. What "accepted" means for a request whose images go to several
        levels (several slots): its record was written. Each level's items are queued first (one
        script per level, in that level's slot, made idempotent by a marker), each naming the
        deadline of the acceptance (``meta["accept_by"]``, on the control slot's clock); then the
        record (and the idempotency key) is written in the control slot by :data:`ENQUEUE`, only
        while that clock is at or before the deadline. A 503 is therefore true however far the
        steps got: without the record no worker runs the items (they are dropped when taken), and
        the record cannot appear after the deadline. A hand-off (no record) is queued at once."""
        if record is not None and limit:
            accept = {"accept_by": str(limit), "accept_record": record[0]}
            items = [replace(item, meta={**item.meta, **accept}) for item in items]
        gid = record[0] if record is not None else ""
        ttl_ms = max(1, int(record[2] * 1000)) if record is not None else 0
        levels: dict[str, list[int]] = {}
        for i, item in enumerate(items):
            levels.setdefault(item.level, []).append(i)

        async def level_part(level: str, idx: list[int]) -> tuple[str, list[str]]:
            keys = [self.keys.enqueued(level, gid or "-")]
            keys += [self.keys.item_stream(items[i]) for i in idx]
            args = [ttl_ms if gid else 0, *(json.dumps(self._reply_here(items[i]).to_dict()) for i in idx)]
            reply = await self._enqueue_level(keys=keys, args=args)
            return decode(reply[0]), [decode(r) for r in reply[1:]]

        parts = await asyncio.gather(*(level_part(lv, idx) for lv, idx in levels.items()))
        entries: list[str | None] = [None] * len(items)
        for (status, ids), idx in zip(parts, levels.values(), strict=True):
            if status == "ok":
                for i, e in zip(idx, ids, strict=True):
                    entries[i] = e
        if record is None:
            return self._outcome("ok", items, entries, guard)
        rid, data, _ttl = record
        keys = [self.keys.request(rid)]
        args: list[Any] = [limit, 1, json.dumps(data), ttl_ms, "", "", 0]
        if guard is not None:
            keys.append(guard.key)
            args[1] = 2
            args[4:7] = [guard.reservation, guard.accepted(rid), max(1, int(guard.ttl_s * 1000))]
        reply = await self._enqueue(keys=keys, args=args)
        return self._outcome(decode(reply[0]), items, entries, guard)

    def _reply_here(self, item: WorkItem) -> WorkItem:
        """A streamed item names this router's event channel, unless it names one already (a
        cascade hand-off another router re-queues keeps the accepting router's)."""
        if not item.meta.get("stream") or item.meta.get("events"):
            return item
        return replace(item, meta={**item.meta, "events": self.events_channel})

    async def _do(self, coro):
        try:
            return await coro
        except (RedisError, OSError) as exc:
            raise QueueUnavailable(f"redis unavailable: {exc}") from exc

    async def fetch_results(self, request_ids: list[str]) -> dict[str, WorkResult]:
        if not request_ids:
            return {}
        raws = await self._do(self.r.mget([self.keys.result(r) for r in request_ids]))
        return {rid: WorkResult.from_dict(json.loads(raw)) for rid, raw in zip(request_ids, raws, strict=True) if raw}

    async def read_done(self, last_id: str, block_ms: int = 1000) -> tuple[str, list[tuple[str, dict]]]:
        """Finished requests after ``last_id``: (new last id, [(request id, summary)])."""
        res = await self._do(self.listen_r.xread({self.keys.done: last_id}, count=1000, block=block_ms))
        done: list[tuple[str, dict]] = []
        for _stream, entries in res or []:
            for entry_id, fields in entries:
                last_id = decode(entry_id)
                raw = fields.get(b"summary") or fields.get("summary")
                done.append((decode(fields.get(b"id") or fields.get("id")), json.loads(raw) if raw else {}))
        return last_id, done

    async def last_done_id(self) -> str:
        rows = await self._do(self.r.xrevrange(self.keys.done, count=1))
        return decode(rows[0][0]) if rows else "0-0"

    async def get_record(self, request_id: str) -> dict | None:
        raw = await self._do(self.r.get(self.keys.request(request_id)))
        return None if raw is None else json.loads(raw)

    async def records_exist(self, request_ids: list[str]) -> list[bool]:
        pipe = self.r.pipeline(transaction=False)
        for rid in request_ids:
            pipe.exists(self.keys.request(rid))
        return [bool(x) for x in await self._do(pipe.execute())]

    async def replace_result(self, request_id: str, result: WorkResult) -> None:
        """Rewrite a stored result (e.g. without its image), keeping its expiry; never re-creates one."""
        if result.image_png is not None:
            raise ValueError("the Redis transport carries no image bytes")
        await self._do(self.r.set(self.keys.result(request_id), json.dumps(result.to_dict()), xx=True, keepttl=True))

    async def claim_handoff(self, request_id: str, ttl_s: float) -> bool:
        """Whether this router decides the cascade hand-off of ``request_id``: the first claim wins,
        and the winner's own claim again is granted (a retry after its decision failed to reach Redis)."""
        key = self.keys.handoff(request_id)
        ttl_ms = max(1, int(ttl_s * 1000))
        return bool(await self._do(self._claim_handoff_script(keys=[key], args=[self.claimant, ttl_ms])))

    async def publish_result(self, request_id: str, result: WorkResult, ttl_s: float) -> None:
        """A final result the router made (a cascade hand-off kept or dropped), as a worker's (it
        names its image in the image store, as the worker's light result did)."""
        if result.image_png is not None:
            raise ValueError("the Redis transport carries no image bytes")
        pipe = self.r.pipeline(transaction=True)
        pipe.set(self.keys.result(request_id), json.dumps(result.to_dict()), px=max(1, int(ttl_s * 1000)))
        pipe.xadd(
            self.keys.done,
            {"id": request_id, "summary": json.dumps(summarize(result))},
            maxlen=DONE_MAXLEN,
            approximate=True,
        )
        await self._do(pipe.execute())

    async def delete_result(self, request_id: str) -> None:
        await self._do(self.r.delete(self.keys.result(request_id)))

    async def cancel(self, level_id: str, entry_id: str) -> bool:
        """Delete a queued item that no worker has taken; False when one has (or it is gone).
        ``entry_id`` is what :meth:`enqueue` returned (``<tier>@<id>`` off the plain stream,
        ``<worker>#…`` on a worker's own stream)."""
        worker, _, entry_id = entry_id.rpartition("#")
        tier, _, entry_id = entry_id.rpartition("@")
        stream = self.keys.stream(level_id, tier or None, worker or None)
        res = await self._do(self.r.eval(CANCEL_QUEUED, 1, stream, self.keys.group, entry_id))
        return bool(res)

    async def request_cancel(self, request_ids: list[str], ttl_s: float) -> None:
        """Cancel ``request_ids`` wherever they are: a worker skips them when it takes them, and
        stops a running batch whose requests are all cancelled (``ns:cancel:<id>``, expiring with
        the results)."""
        if not request_ids:
            return
        pipe = self.r.pipeline(transaction=False)
        for rid in request_ids:
            pipe.set(self.keys.cancel(rid), "1", px=max(1, int(ttl_s * 1000)))
        await self._do(pipe.execute())

    async def update_record(self, request_id: str, fields: dict[str, Any]) -> dict | None:
        """Add ``fields`` to an accepted request's record, keeping its expiry; None when it is gone."""
        key = self.keys.request(request_id)
        raw = await self._do(self.r.get(key))
        if raw is None:
            return None
        data = {**json.loads(raw), **fields}
        await self._do(self.r.set(key, json.dumps(data), xx=True, keepttl=True))
        return data

    async def events(self):
        """Step events of streamed items: ``(request id, event)`` while subscribed."""
        pubsub = self.events_r.pubsub(ignore_subscribe_messages=True)
        try:
            # its own channel, and the shared one that workers of an earlier version publish on
            await pubsub.subscribe(self.events_channel, self.keys.events)
            async for msg in pubsub.listen():
                if msg.get("type") == "message":
                    try:
                        yield event_from_json(msg["data"])
                    except (ValueError, KeyError, TypeError):
                        continue
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()

    async def close(self) -> None:
        for client in (self.r, self.listen_r, self.events_r):
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()
