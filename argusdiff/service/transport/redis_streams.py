"""The Redis Streams transport: the :class:`workers.queue.WorkQueue` protocol and the results across machines.

Layout under a namespace ``ns`` (default ``argusdiff``):

* ``ns:q:<level>`` — the level's stream of ``standard`` (and untiered) work, ``ns:q:<level>@interactive``
  and ``ns:q:<level>@batch`` those of the other SLO tiers; consumer group ``ns:workers``; one entry
  per work item (field ``item``: the item's JSON). A worker reads a level's streams highest-priority
  tier first (:data:`argusdiff.domain.TIER_PRIORITY`: one non-blocking pass in that order, then a
  blocking read of them all), so queued interactive work is taken before standard and batch work
  queued earlier, as the embedded queue and the simulator pull. Workers read with XREADGROUP, **ack after the result is
  stored** (XACK + XDEL). A dead worker's pending entries are re-queued by the control loop
  (XPENDING for that consumer → XCLAIM → XADD a copy with ``attempt + 1`` → XACK), and as a last
  resort any worker re-claims entries idle longer than ``claim_idle_s`` with XAUTOCLAIM.
* ``{ns:q:<level>}:w:<worker>`` (and ``…@interactive``, ``…@batch``) — a worker's own streams of
  the level, for a policy whose delivery is ``PER_WORKER`` (the item names the worker,
  ``meta["worker"]``): in the level's slot, so moving an entry between them and the level's
  streams is one atomic step on a cluster. The worker reads its own streams first, then the
  level's. An entry leaves them for the level's streams when the worker gives it back (nack), when
  it leaves the level (``release``) and when it dies (the control loop's ``requeue_consumer``: its
  pending entries there re-queued, its unread ones released), so accepted work never waits behind
  a worker that will not take it. ``{ns:q:<level>}:owners`` (a set) names the workers with such
  streams: a router adds the worker before it queues there, and the control loop's sweep releases
  the streams of the workers not serving the level (what a router queued with an older plan) and
  deletes those of workers gone from the plan once empty.
* ``ns:result:<request id>`` — the result JSON, with expiry (``result_ttl_s``): never an image's
  bytes (the claim check, :mod:`argusdiff.service.images`): the worker writes the image into the
  image store and the result names it (``image_ref``);
  ``ns:done`` — a capped stream of finished request ids the router listens on (a cascade
  deferral is published there too, its result carrying a ``handoff`` item; the router that sets
  ``ns:handoff:<request id>`` first asks its policy what follows);
* ``ns:req:<request id>`` — accepted requests, so a restarted router can still answer polls (and a
  vanished one tells a waiting router that Redis lost the work);
* ``ns:events:<router>`` — pub/sub channel of step events (progress, partial images) of the streamed
  items one router accepted (named in the item's ``meta["events"]``); ``ns:events`` for items that
  name none (workers and routers of an earlier version). A partial image travels as the key of
  its PNG in the image store (``ref``), never as bytes.

An edit's input image and mask go into the image store too (the router writes them when it
queues the item, :func:`claim_inputs`; the item names them in ``meta["edit_image_ref"]`` and
``meta["edit_mask_ref"]``), and a worker reads them back when it takes the item.

:class:`RedisWorkQueue` is the synchronous side (workers, control loop, tools);
:class:`AsyncRedisDispatch` the router's asyncio side. The plan, the deployment and the workers'
heartbeats are the control store's (:mod:`argusdiff.service.transport.redis_control`); :class:`RedisKeys`
names every key of both.
"""

from __future__ import annotations

import base64
import json
import logging
import random
import time
from dataclasses import replace
from typing import Any

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.retry import Retry as SyncRetry

from argusdiff.domain import TIER_PRIORITY, Tier, tier_rank
from argusdiff.service.errors import FencedOut, QueueUnavailable
from argusdiff.service.transport.protocol import summarize, wait_result
from argusdiff.service.transport.redis_client import is_cluster_client
from argusdiff.service.transport.redis_keys import RedisKeys
from argusdiff.service.transport.redis_scripts import (
    COMMITTED,
    FORGET_OWNER,
    READ_FIRST,
    RELEASE,
    REQUEUE,
    REQUEUE_BY_TOKEN,
)
from workers.messages import WorkItem, WorkResult
from workers.queue import WORKER_META

log = logging.getLogger("argusdiff.redis")

__all__ = ["RedisKeys", "RedisWorkQueue", "decode", "redis_call", "sync_client"]

DONE_MAXLEN = 100_000
#: How often :meth:`RedisWorkQueue.wait_result` reads a result it waits for (tools and tests; the
#: router follows the ``done`` stream instead).
RESULT_POLL_S = 0.02


#: The most bytes one step event may take on the wire: events carry keys, never images.
EVENT_MAX_BYTES = 4096


def event_to_json(request_id: str, event: dict[str, Any]) -> str:
    """A step event on the wire (a partial image as its key in the image store, ``ref``). Raises
    ValueError for one that carries image bytes or is larger than :data:`EVENT_MAX_BYTES`."""
    if "png" in event:
        raise ValueError("a step event on the wire carries its partial image's key, not its bytes")
    raw = json.dumps({"id": request_id, "event": event})
    if len(raw) > EVENT_MAX_BYTES:
        raise ValueError(f"a step event of {len(raw)} bytes is larger than {EVENT_MAX_BYTES}")
    return raw


def event_from_json(raw: str | bytes) -> tuple[str, dict[str, Any]]:
    msg = json.loads(raw)
    event = {k: v for k, v in dict(msg["event"]).items() if k not in ("png", "png_b64")}
    return str(msg["id"]), event


#: meta keys of an edit's inputs: inline (base64 PNG, as workers read them) -> their key in the store
INPUT_REFS = {"edit_image": "edit_image_ref", "edit_mask": "edit_mask_ref"}


def claim_inputs(item: WorkItem, images: Any) -> WorkItem:
    """``item`` as it goes into Redis: an edit's input image and mask written into the image
    store (:func:`argusdiff.service.images.input_id`), the item naming them instead."""
    inline = [k for k in INPUT_REFS if item.meta.get(k)]
    if not inline:
        return item
    if images is None:
        raise ValueError("the Redis transport carries no image bytes: it needs an image store for an edit's input")
    from argusdiff.service.images import input_id

    meta = dict(item.meta)
    for k in inline:
        key = input_id(item.request_id, "in" if k == "edit_image" else "mask")
        if meta.get(INPUT_REFS[k]) != key:
            images.put(key, base64.b64decode(meta[k]))
            meta[INPUT_REFS[k]] = key
        del meta[k]
    return replace(item, meta=meta)


def on_wire(item: WorkItem) -> WorkItem:
    """``item`` without the inputs a worker read back from the store (their keys stay)."""
    drop = [k for k, ref in INPUT_REFS.items() if item.meta.get(k) and item.meta.get(ref)]
    if not drop:
        return item
    return replace(item, meta={k: v for k, v in item.meta.items() if k not in drop})


#: How long a Redis clock reading stays good for enqueue deadlines (s): clocks drift apart slowly.
CLOCK_READING_S = 5.0


def sync_client(url: str | None, socket_timeout_s: float, who: str) -> Any:
    """A synchronous client (thread-safe connection pool) for ``url``: a ``RedisCluster`` when it
    is a cluster node (:mod:`argusdiff.service.transport.redis_client`)."""
    if url is None:
        raise ValueError(f"{who} needs a url or a client")
    from argusdiff.service.transport import redis_client

    return redis_client.sync_client(
        url,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=socket_timeout_s,
        health_check_interval=HEALTH_CHECK_S,
        retry=_reconnect(SyncRetry),
    )


#: A pooled connection idle this long is PINGed before use (a restarted Redis closed it).
HEALTH_CHECK_S = 5


def _reconnect(cls):
    """Retry a command once more on a new connection when its connection was closed (a restarted
    Redis leaves every pooled connection dead), after a jittered backoff so many clients do not
    reconnect in step. Never on a timeout: a command that timed out may still run."""
    return cls(ExponentialWithJitterBackoff(base=0.05, cap=1.0), 2, supported_errors=(RedisConnectionError,))


def redis_call(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with every Redis or socket failure raised as :class:`QueueUnavailable`."""
    try:
        return fn(*args, **kwargs)
    except ResponseError as exc:
        raise QueueUnavailable(f"redis: {exc}") from exc
    except (RedisError, OSError) as exc:
        raise QueueUnavailable(f"redis unavailable: {exc}") from exc


def decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entry_ref(item: WorkItem, entry_id: str) -> str:
    """How the router names a queued entry for :meth:`AsyncRedisDispatch.cancel`: the stream entry
    id, prefixed with ``<tier>@`` when the item is on its tier's own stream, and with
    ``<worker>#`` when it is on a worker's own stream."""
    tier = TIER_PRIORITY[tier_rank(item.tier)]
    ref = entry_id if tier == Tier.STANDARD.value else f"{tier}@{entry_id}"
    worker = item.meta.get(WORKER_META)
    return f"{worker}#{ref}" if worker else ref


def _item_from_entry(level_id: str, entry_id: Any, fields: dict, worker: str | None = None) -> WorkItem:
    """The item of a stream entry; its receipt names the level, and the worker whose own stream
    held it (``<level>|<worker>#<entry id>``; ``<level>|<entry id>`` on the level's streams)."""
    raw = fields.get(b"item") or fields.get("item")
    data = json.loads(raw)
    ref = decode(entry_id) if worker is None else f"{worker}#{decode(entry_id)}"
    return WorkItem.from_dict(data, receipt=f"{level_id}|{ref}")


class RedisWorkQueue:
    """Synchronous Redis Streams :class:`~workers.queue.WorkQueue` (thread-safe: redis-py pools)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        client: redis.Redis | None = None,
        namespace: str = "argusdiff",
        consumer: str = "router",
        result_ttl_s: float = 3600.0,
        claim_idle_s: float = 300.0,
        socket_timeout_s: float = 5.0,
        cancel_poll_s: float = 0.1,
        images: Any = None,
        image_retry_s: float = 10.0,
    ) -> None:
        self.r = client if client is not None else sync_client(url, socket_timeout_s, "RedisWorkQueue")
        #: the image store (:mod:`argusdiff.service.images`) that holds what Redis names: results'
        #: images, partial images and edits' inputs; a result with an image and no store is refused
        self.images = images
        self.image_retry_s = image_retry_s  # a failing image store is retried this long, then the item given back
        self.cancel_poll_s = cancel_poll_s  # a running batch reads its cancel keys at most this often
        self._cancel_seen: dict[tuple[str, ...], tuple[float, set[str]]] = {}
        self.keys = RedisKeys(namespace)
        self.consumer = consumer
        self.result_ttl_ms = int(result_ttl_s * 1000)
        self.claim_idle_ms = int(claim_idle_s * 1000)
        self._groups: set[str] = set()
        self._last_autoclaim: dict[str, float] = {}
        self.cluster = is_cluster_client(self.r)  # a Redis Cluster: every atomic step within one slot
        self._requeue_script = self.r.register_script(REQUEUE_BY_TOKEN if self.cluster else REQUEUE)
        self._committed_script = self.r.register_script(COMMITTED)
        self._release_script = self.r.register_script(RELEASE)
        self._forget_owner_script = self.r.register_script(FORGET_OWNER)
        self._taken: dict[str, dict[str, str]] = {}  # request id -> the meta of the item taken

    # -- helpers ---------------------------------------------------------------------------

    def _ensure_group(self, level_id: str, tier: str | None = None, worker: str | None = None) -> str:
        stream = self.keys.stream(level_id, tier, worker)
        if stream not in self._groups:
            try:
                self.r.xgroup_create(stream, self.keys.group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._groups.add(stream)
        return stream

    def _ensure_groups(self, level_id: str, worker: str | None = None) -> tuple[str, ...]:
        """Every stream of ``level_id`` (with ``worker``: its own; pull order), each with the workers' group."""
        return tuple(self._ensure_group(level_id, tier, worker) for tier in TIER_PRIORITY)

    def _call(self, fn, *args, **kwargs):
        try:
            return redis_call(fn, *args, **kwargs)
        except QueueUnavailable as exc:
            if "NOGROUP" in str(exc):  # the server lost its data (restart without persistence)
                self._groups.clear()
            raise

    def ping(self) -> bool:
        try:
            return bool(self.r.ping())
        except (RedisError, OSError):
            return False

    # -- WorkQueue protocol ----------------------------------------------------------------

    def put(self, level_id: str, item: WorkItem) -> None:
        if item.level != level_id:
            item = replace(item, level=level_id)
        if not item.enqueue_s:
            item = replace(item, enqueue_s=time.time())

        item = claim_inputs(item, self.images)

        def _put():
            worker = item.meta.get(WORKER_META) or None
            stream = self._ensure_group(level_id, item.tier, worker)
            if worker is not None:  # known to the control loop's sweep before it is queued there
                self.r.sadd(self.keys.owners(level_id), worker)
            self.r.xadd(stream, {"item": json.dumps(item.to_dict())})

        self._call(_put)

    def get(self, level_id: str, timeout: float | None = None, worker: str | None = None) -> WorkItem | None:
        """The oldest undelivered item of the level's highest-priority tier that has one (a long
        idle delivery re-claimed first), from ``worker``'s own streams of the level first (when
        given), then the level's; else wait up to ``timeout`` for the first to arrive."""

        def _get():
            streams = self._ensure_groups(level_id)
            own: dict[str, str] = {}
            if worker is not None:
                mine = self._ensure_groups(level_id, worker)
                own = dict.fromkeys(mine, worker)
                streams = (*mine, *streams)
            now = time.monotonic()
            if now - self._last_autoclaim.get(level_id, 0.0) > 1.0:
                self._last_autoclaim[level_id] = now
                for stream in streams:
                    res = self.r.xautoclaim(
                        stream, self.keys.group, self.consumer, min_idle_time=self.claim_idle_ms, start_id="0-0",
                        count=1,
                    )  # fmt: skip
                    claimed = res[1] if len(res) > 1 else []
                    for entry_id, fields in claimed:
                        if fields:
                            item = _item_from_entry(level_id, entry_id, fields, own.get(stream))
                            return replace(item, attempt=item.attempt + 1)
            first = self.r.eval(READ_FIRST, len(streams), *streams, self.keys.group, self.consumer)
            if first:
                stream, entry_id, flat = first
                fields = {flat[k]: flat[k + 1] for k in range(0, len(flat), 2)}
                return _item_from_entry(level_id, entry_id, fields, own.get(decode(stream)))
            block = None if timeout is None else max(1, int(timeout * 1000))
            res = self.r.xreadgroup(self.keys.group, self.consumer, dict.fromkeys(streams, ">"), count=1,
                                    block=block or 0)  # fmt: skip
            got = [
                _item_from_entry(level_id, entry_id, fields, own.get(decode(stream)))
                for stream, entries in res or []
                for entry_id, fields in entries
                if fields
            ]
            if not got:
                return None
            got.sort(key=lambda it: tier_rank(it.tier))
            for extra in got[1:]:  # arrived in the same instant on another tier's stream: queued again
                self._give_back(extra, attempt=extra.attempt)
            return got[0]

        item = self._call(_get)
        if item is None:
            return None
        if item.meta.get("accept_by") and not self._call(self._accepted, item):
            log.info("dropped %s: its request was never accepted (the router answered 503)", item.request_id)
            self.ack(item)
            return None
        if len(self._taken) > 4096:  # items that never finished here
            self._taken.clear()
        self._taken[item.request_id] = dict(item.meta)
        return self._read_inputs(item)

    def _accepted(self, item: WorkItem) -> bool:
        """Cluster mode: whether ``item``'s request was accepted. The router queues a request's
        items level by level, then writes its record (the commit) only while the control slot's
        clock is at or before ``meta["accept_by"]``; so a record there means accepted, and no
        record once that clock has passed it means never (the router answered 503). In between
        (the router is between its steps: milliseconds) the worker waits for the answer."""
        record = self.keys.request(str(item.meta.get("accept_record") or item.meta.get("group") or item.request_id))
        accept_by = float(item.meta["accept_by"])
        while True:
            exists, now_ms = self._committed_script(keys=[record])
            if int(exists):
                return True
            if float(now_ms) > accept_by:
                return False
            time.sleep(min(2.0, (accept_by - float(now_ms)) / 1000 + 0.005))

    def _read_inputs(self, item: WorkItem) -> WorkItem:
        """An edit's input image and mask, read back from the image store into the item (only in
        this process: the item goes back into Redis without them, :func:`on_wire`)."""
        refs = {k: item.meta[ref] for k, ref in INPUT_REFS.items() if item.meta.get(ref) and not item.meta.get(k)}
        if not refs:
            return item
        from argusdiff.service.images import read_image

        meta = dict(item.meta)
        for k, key in refs.items():
            data = self._with_store(read_image, self.images, key) if self.images is not None else None
            if data is None:  # gone (expired): the edit fails, as one with a broken image would
                meta[k] = "missing"
            else:
                meta[k] = base64.b64encode(data).decode("ascii")
        return replace(item, meta=meta)

    def _with_store(self, fn, *args):
        """``fn(*args)`` on the image store, retried with jittered waits for :attr:`image_retry_s`;
        then :class:`QueueUnavailable` (the worker gives the items it holds back, to be redone)."""
        deadline = time.monotonic() + self.image_retry_s
        wait = 0.1
        while True:
            try:
                return fn(*args)
            except Exception as exc:
                if time.monotonic() + wait > deadline:
                    raise QueueUnavailable(f"image store unavailable: {exc}") from exc
                time.sleep(wait * (0.5 + random.random() / 2))
                wait = min(2.0, wait * 2)

    def _claim_result(self, request_id: str, result: WorkResult) -> WorkResult:
        """``result`` as it goes into Redis: its image written into the image store in the format
        the request asked for (``meta["output_format"]``), the result naming it (``image_ref``)."""
        if result.handoff is not None:
            result = replace(result, handoff=on_wire(result.handoff))
        if result.image_png is None:
            return result
        if self.images is None:
            raise ValueError("the Redis transport carries no image bytes: give RedisWorkQueue an image store")
        from argusdiff.service.images import encode, image_id

        meta = self._taken.get(request_id, {})
        fmt = meta.get("output_format") or "png"
        compression = int(meta["output_compression"]) if meta.get("output_compression") else None
        data = encode(result.image_png, fmt, compression)
        key = image_id(request_id, fmt)
        self._with_store(self.images.put, key, data)
        return replace(result, image_png=None, image_ref=key)

    def _receipt(self, item: WorkItem) -> tuple[str, str] | None:
        """(the stream an item was taken from, its entry id), from its receipt."""
        if not item.receipt or "|" not in item.receipt:
            return None
        level_id, ref = item.receipt.split("|", 1)
        worker, _, entry_id = ref.rpartition("#")
        return self.keys.stream(level_id, item.tier, worker or None), entry_id

    def ack(self, item: WorkItem) -> None:
        self._taken.pop(item.request_id, None)
        rec = self._receipt(item)
        if rec is None:
            return
        stream, entry_id = rec

        def _ack():
            pipe = self.r.pipeline(transaction=True)
            pipe.xack(stream, self.keys.group, entry_id)
            pipe.xdel(stream, entry_id)
            pipe.execute()

        self._call(_ack)

    def nack(self, item: WorkItem) -> None:
        """Give an item back: a copy is queued again (at the end of its tier's stream) and the
        delivery acked."""
        self._give_back(item, attempt=item.attempt + 1)

    def _give_back(self, item: WorkItem, *, attempt: int) -> None:
        rec = self._receipt(item)
        if rec is None:
            return
        stream, entry_id = rec
        back = on_wire(replace(item, attempt=attempt, receipt=None))
        # back on the level's stream of its tier, also from a worker's own (same slot): the worker
        # gives it back because it is switching or leaving
        shared = self.keys.stream(item.receipt.split("|", 1)[0], item.tier) if item.receipt else stream

        def _nack():
            pipe = self.r.pipeline(transaction=True)
            pipe.xadd(shared, {"item": json.dumps(back.to_dict())})
            pipe.xack(stream, self.keys.group, entry_id)
            pipe.xdel(stream, entry_id)
            pipe.execute()

        self._call(_nack)

    def result(self, request_id: str, result: WorkResult) -> None:
        """Store ``result`` (its image in the image store first: :meth:`_claim_result`) and
        announce it on ``ns:done``."""
        result = self._claim_result(request_id, result)

        def _result():
            pipe = self.r.pipeline(transaction=True)
            pipe.set(self.keys.result(request_id), json.dumps(result.to_dict()), px=self.result_ttl_ms)
            pipe.xadd(
                self.keys.done,
                {"id": request_id, "summary": json.dumps(summarize(result))},
                maxlen=DONE_MAXLEN,
                approximate=True,
            )
            pipe.execute()

        self._call(_result)

    def cancelled(self, request_ids: list[str]) -> set[str]:
        """Which of ``request_ids`` a router cancelled (their ``ns:cancel:<id>`` keys exist). A running
        batch asks after every step: the answer read within ``cancel_poll_s`` is reused."""
        ids = tuple(request_ids)
        if not ids:
            return set()
        now = time.monotonic()
        seen = self._cancel_seen.get(ids)
        if seen is not None and now - seen[0] < self.cancel_poll_s:
            return seen[1]
        found = self._call(self.r.mget, [self.keys.cancel(rid) for rid in ids])
        gone = {rid for rid, v in zip(ids, found, strict=True) if v is not None}
        if len(self._cancel_seen) > 64:
            self._cancel_seen.clear()
        self._cancel_seen[ids] = (now, gone)
        return gone

    def publish_event(self, request_id: str, event: dict[str, Any]) -> None:
        """A step event of a streamed item, for the router that streams it (best effort): on that
        router's channel when the item named one, else on the shared ``ns:events``. A partial
        image goes into the image store first; the event carries its key (``ref``)."""
        meta = self._taken.get(request_id, {})
        channel = meta.get("events") or self.keys.events
        if event.get("png") is not None:
            if self.images is None:
                raise ValueError("the Redis transport carries no image bytes: a partial image needs an image store")
            from argusdiff.service.images import partial_id

            key = partial_id(request_id, int(event.get("step") or 0))
            self.images.put(key, event["png"])  # once: a partial image is worth no retry
            event = {**{k: v for k, v in event.items() if k != "png"}, "ref": key}
        self._call(self.r.publish, channel, event_to_json(request_id, event))

    def fetch_result(self, request_id: str) -> WorkResult | None:
        """The stored result (its image read back from the image store, when it has one)."""
        raw = self._call(self.r.get, self.keys.result(request_id))
        if raw is None:
            return None
        res = WorkResult.from_dict(json.loads(raw))
        if res.image_ref and self.images is not None:
            from argusdiff.service.images import read_image

            res = replace(res, image_png=read_image(self.images, res.image_ref))
        return res

    def wait_result(self, request_id: str, timeout: float | None = None) -> WorkResult | None:
        """The stored result of ``request_id``, polled every :data:`RESULT_POLL_S` until ``timeout``."""
        return wait_result(lambda: self.fetch_result(request_id), timeout, lambda _remaining: time.sleep(RESULT_POLL_S))

    def qsize(self, level_id: str) -> int:
        """Entries not yet delivered to any worker (the group's lag), over the level's streams."""

        def _lag(stream: str) -> int:
            for g in self.r.xinfo_groups(stream):
                name = decode(g.get("name", g.get(b"name", b"")))
                if name == self.keys.group:
                    lag = g.get("lag", g.get(b"lag"))
                    if lag is None:  # lag unknown after deletions: count the entries after the last delivery
                        last = decode(g.get("last-delivered-id", "0-0"))
                        return len(self.r.xrange(stream, min=f"({last}", max="+"))
                    return int(lag)
            return 0

        return self._call(lambda: sum(_lag(stream) for stream in self._ensure_groups(level_id)))

    def pending(self, level_id: str) -> int:
        def _pending():
            return sum(
                int(self.r.xpending(stream, self.keys.group)["pending"]) for stream in self._ensure_groups(level_id)
            )

        return self._call(_pending)

    # -- control-path operations -----------------------------------------------------------

    def pending_by_consumer(self, level_id: str) -> dict[str, int]:
        def _p():
            out: dict[str, int] = {}
            for stream in self._ensure_groups(level_id):
                info = self.r.xpending(stream, self.keys.group)
                for c in info.get("consumers") or []:
                    name = decode(c["name"])
                    out[name] = out.get(name, 0) + int(c["pending"])
            return out

        return self._call(_p)

    def requeue_consumer(self, level_id: str, consumer: str, fence: tuple[str, str] | None = None) -> int:
        """Re-queue every entry pending at ``consumer`` (a dead worker): a fresh copy any worker can
        read, the old delivery acked. Returns the number re-queued.

        ``fence`` = (lease key, holder): each step runs only while the lease key holds that value
        (the leader's ``router|token``), so a stale leader and the new one never both re-queue an
        item; a refused step raises :class:`~argusdiff.service.errors.FencedOut`. On a cluster the
        lease (control slot) is read first and each step is fenced by the token, in the level's
        slot (:data:`REQUEUE_BY_TOKEN`)."""

        def _requeue():
            moved = 0
            for stream in self._ensure_groups(level_id):
                moved += _requeue_stream(stream)
            # a worker's own streams of the level (delivery PER_WORKER): what it took, to the level's
            # streams, then what waits there unread
            if self.r.exists(*self.keys.streams(level_id, consumer)):
                for tier in TIER_PRIORITY:
                    own = self._ensure_group(level_id, tier, consumer)
                    moved += _requeue_stream(own, self.keys.stream(level_id, tier))
                moved += self._release(level_id, consumer)
            return moved

        def _requeue_stream(stream: str, dest: str | None = None) -> int:
            moved = 0
            seen: set[str] = set()
            while True:
                rows = self.r.xpending_range(stream, self.keys.group, "-", "+", 100, consumername=consumer)
                ids = [decode(r["message_id"]) for r in rows if decode(r["message_id"]) not in seen]
                if not ids:
                    return moved
                seen.update(ids)
                pipe = self.r.pipeline(transaction=False)
                for entry_id in ids:
                    pipe.xrange(stream, min=entry_id, max=entry_id, count=1)
                args: list[Any] = [self.keys.group, consumer, fence[1] if fence else ""]
                for entry_id, found in zip(ids, pipe.execute(), strict=True):
                    copy = ""
                    if found and found[0][1]:
                        item = _item_from_entry(level_id, entry_id, found[0][1])
                        copy = json.dumps(replace(item, attempt=item.attempt + 1, receipt=None).to_dict())
                    args += [entry_id, copy]
                if self.cluster:  # the lease is in the control slot: checked first, then the level's token fence
                    if fence and decode(self.r.get(fence[0]) or b"") != fence[1]:
                        raise FencedOut(f"re-queue of {consumer}'s items refused: the lease is no longer {fence[1]!r}")
                    args[2] = fence[1].rsplit("|", 1)[-1] if fence else ""
                    keys = [stream, self.keys.fence(level_id)]
                    res = int(self._requeue_script(keys=[*keys, dest] if dest else keys, args=args))
                else:
                    lease = fence[0] if fence else stream
                    res = int(self._requeue_script(keys=[stream, lease, dest] if dest else [stream, lease], args=args))
                if res < 0:
                    raise FencedOut(f"re-queue of {consumer}'s items refused: the lease is no longer {fence[1]!r}")
                moved += res

        return self._call(_requeue)

    def _release(self, level_id: str, worker: str, batch: int = 500) -> int:
        moved = 0
        for tier in TIER_PRIORITY:
            own, shared = self.keys.stream(level_id, tier, worker), self.keys.stream(level_id, tier)
            while True:
                n = int(self._release_script(keys=[own, shared], args=[self.keys.group, self.consumer, batch]))
                moved += n
                if n < batch:
                    break
        return moved

    def release(self, level_id: str, worker: str) -> int:
        """Move the entries waiting unread in ``worker``'s own streams of the level to the level's
        streams (each to its tier's), atomically per batch (:data:`RELEASE`): the worker left the
        level. Entries it already took stay with it (acked, or given back by ``nack``)."""
        return self._call(self._release, level_id, worker)

    def owners(self, level_id: str) -> set[str]:
        """The workers that have (had) their own streams of the level (delivery ``PER_WORKER``)."""
        return {decode(w) for w in self._call(self.r.smembers, self.keys.owners(level_id))}

    def forget_owner(self, level_id: str, worker: str) -> bool:
        """Delete ``worker``'s own streams of the level once empty with nothing pending (a worker
        that left the cluster; after :meth:`release`), so they do not pile up; False: not empty."""
        keys = [*self.keys.streams(level_id, worker), self.keys.owners(level_id)]
        ok = bool(self._call(self._forget_owner_script, keys=keys, args=[self.keys.group, worker]))
        if ok:
            self._groups.difference_update(keys)
        return ok

    def drop_consumer(self, level_id: str, consumer: str) -> None:
        """Forget a dead worker's consumer in ``level_id``'s group (after :meth:`requeue_consumer`),
        so the group's consumer list does not grow with every worker that ever ran."""
        for stream in self._ensure_groups(level_id):
            self._call(self.r.xgroup_delconsumer, stream, self.keys.group, consumer)

    def migrate(self, from_level: str, to_level: str, limit: int = 10_000) -> int:
        """Move undelivered items of ``from_level`` (no longer served by any worker) to ``to_level``."""

        def _migrate():
            moved = 0
            for tier in TIER_PRIORITY:  # each tier's stream to the same tier's at the new level
                if moved >= limit:
                    break
                moved += _migrate_tier(tier, limit - moved)
            return moved

        def _migrate_tier(tier: str, limit: int) -> int:
            src = self._ensure_group(from_level, tier)
            dst = self._ensure_group(to_level, tier)
            res = self.r.xreadgroup(self.keys.group, self.consumer, {src: ">"}, count=limit)
            moved = 0
            for _stream, entries in res or []:
                pipe = self.r.pipeline(transaction=True)
                # on a cluster the two levels' streams are in two slots: queued there first, then
                # taken out here (a failure between leaves a copy in both: at least once)
                out = self.r.pipeline(transaction=True) if self.cluster else pipe
                ids = []
                for entry_id, fields in entries:
                    ids.append(entry_id)
                    if fields:
                        item = _item_from_entry(from_level, entry_id, fields)
                        meta = {**item.meta, "migrated_from": from_level}
                        moved_item = replace(item, level=to_level, receipt=None, meta=meta)
                        pipe.xadd(dst, {"item": json.dumps(moved_item.to_dict())})
                        moved += 1
                if ids:
                    if out is not pipe and len(pipe):
                        pipe.execute()
                    out.xack(src, self.keys.group, *ids)
                    out.xdel(src, *ids)
                    out.execute()
            return moved

        return self._call(_migrate)
