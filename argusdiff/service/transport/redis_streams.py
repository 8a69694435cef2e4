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

import asyncio
import base64
import contextlib
import json
import logging
import random
import secrets
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.retry import Retry as SyncRetry

from argusdiff.domain import TIER_PRIORITY, Tier, tier_rank
from argusdiff.service.errors import FencedOut, QueueUnavailable
from argusdiff.service.transport.protocol import summarize, wait_result
from argusdiff.service.transport.redis_client import async_client, control_prefix, is_cluster_client
from workers.messages import WorkItem, WorkResult
from workers.queue import WORKER_META

log = logging.getLogger("argusdiff.redis")

__all__ = ["AsyncRedisDispatch", "RedisKeys", "RedisWorkQueue", "decode", "redis_call", "sync_client"]

DONE_MAXLEN = 100_000
#: How often :meth:`RedisWorkQueue.wait_result` reads a result it waits for (tools and tests; the
#: router follows the ``done`` stream instead).
RESULT_POLL_S = 0.02


class RedisKeys:
    """Every key of a namespace: the work queue's, the results' and the control store's.

    Hash tags (a Redis Cluster puts keys with one tag in one slot): every control key starts with
    the namespace as a tag, ``{ns}:`` (:func:`~argusdiff.service.transport.redis_client.control_prefix`),
    and a level's streams (with their enqueue markers and re-queue fence) with a tag of the level's
    own, ``{ns:q:<level>}``, so a cluster shards the work by level and every atomic step touches one
    slot. ``namespace`` is the plain name (``[service] namespace``) or its tagged prefix."""

    def __init__(self, namespace: str = "argusdiff") -> None:
        self.name = namespace[1:-1] if namespace.startswith("{") and namespace.endswith("}") else namespace
        ns = self.ns = control_prefix(self.name)
        self.group = f"{self.name}:workers"  # the consumer group of every stream (a name, not a key)
        self.done = f"{ns}:done"
        self.plan = f"{ns}:plan"
        self.plan_channel = f"{ns}:plan-changed"
        self.workers = f"{ns}:workers"
        self.deployment = f"{ns}:deployment"
        self.events = f"{ns}:events"  # workers that name no router's channel publish here
        # many routers (argusdiff.service.leader): the lease, its fencing tokens, the plan's version,
        # the policy state published with it and the log of plan writes
        self.leader = f"{ns}:leader"
        self.leader_epoch = f"{ns}:leader:epoch"
        self.plan_version = f"{ns}:plan:version"
        self.plan_state = f"{ns}:plan:state"
        self.plan_log = f"{ns}:plan:log"
        # what a worker reads of a plan: its own entry (``plan:assign``, worker -> level JSON) and
        # the plan without the assignment (``plan:view``, see :func:`worker_view`)
        self.plan_assign = f"{ns}:plan:assign"
        self.plan_view = f"{ns}:plan:view"
        self.workers_beat = f"{ns}:workers:beat"  # worker id -> heartbeat expiry (ZSET)

    def quota(self, tenant: str, limit: str) -> str:
        """A tenant's rate-limit bucket or concurrent slots (:mod:`argusdiff.service.quotas`);
        ``tenant`` is a hash of its API key."""
        return f"{self.ns}:quota:{tenant}:{limit}"

    def cancel(self, request_id: str) -> str:
        """Set by a router that cancels ``request_id`` (``DELETE`` or a client gone); a worker skips
        the item when it takes it and stops a running batch whose requests all have one."""
        return f"{self.ns}:cancel:{request_id}"

    def handoff(self, request_id: str) -> str:
        """Set (NX) by the one router that decides a cascade hand-off of ``request_id``."""
        return f"{self.ns}:handoff:{request_id}"

    def level_tag(self, level_id: str) -> str:
        """The hash tag of ``level_id``'s keys: its streams, enqueue markers and re-queue fence."""
        return "{" + f"{self.name}:q:{level_id}" + "}"

    def stream(self, level_id: str, tier: str | None = None, worker: str | None = None) -> str:
        """The stream of ``level_id``'s work of ``tier`` (``standard``, no tier or an unknown one:
        the level's plain stream, so untiered traffic uses one stream per level); with ``worker``,
        that worker's own stream of it (delivery ``PER_WORKER``), in the level's slot."""
        name = TIER_PRIORITY[tier_rank(tier)]
        base = self.level_tag(level_id) if worker is None else f"{self.level_tag(level_id)}:w:{worker}"
        if name == Tier.STANDARD.value:
            return base
        return f"{base}@{name}"

    def enqueued(self, level_id: str, generation_id: str) -> str:
        """Cluster mode: set when a request's items were queued at ``level_id`` (a retried enqueue
        queues them once)."""
        return f"{self.level_tag(level_id)}:enq:{generation_id}"

    def owners(self, level_id: str) -> str:
        """The workers that have their own streams of ``level_id`` (a set, in the level's slot): a
        router adds the worker before it queues there, the control loop sweeps them."""
        return f"{self.level_tag(level_id)}:owners"

    def fence(self, level_id: str) -> str:
        """Cluster mode: the highest leader token that re-queued at ``level_id``."""
        return f"{self.level_tag(level_id)}:fence"

    def streams(self, level_id: str, worker: str | None = None) -> tuple[str, ...]:
        """Every stream of ``level_id`` (with ``worker``: that worker's own), in pull order
        (highest-priority tier first)."""
        return tuple(self.stream(level_id, tier, worker) for tier in TIER_PRIORITY)

    def item_stream(self, item: WorkItem) -> str:
        """The stream an item is queued on: its level's, of its tier, its worker's own when it
        names one (``meta["worker"]``)."""
        return self.stream(item.level, item.tier, item.meta.get(WORKER_META) or None)

    def result(self, request_id: str) -> str:
        return f"{self.ns}:result:{request_id}"

    def events_of(self, router: str) -> str:
        """The step-event channel of one router: a worker publishes a streamed item's events on the
        channel of the router that accepted it (``meta["events"]``), so no router receives the
        events of every stream."""
        return f"{self.ns}:events:{router}"

    def heartbeat(self, worker_id: str) -> str:
        return f"{self.ns}:hb:{worker_id}"

    def request(self, request_id: str) -> str:
        return f"{self.ns}:req:{request_id}"


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


#: One non-blocking read of the first stream (KEYS, in pull order) that has an undelivered entry:
#: ``{stream, entry id, fields...}`` or nil. Atomic, so no other stream's entry is delivered.
_READ_FIRST = """
for i, key in ipairs(KEYS) do
  local res = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1, 'STREAMS', key, '>')
  if res then
    local entry = res[1][2][1]
    if entry then return {key, entry[1], entry[2]} end
  end
end
return nil
"""

#: The router's enqueue: a request's work items (one XADD per item, KEYS after the fixed ones), its
#: record and, for an ``Idempotency-Key``, the key's accepted value, in one atomic step that runs
#: only while Redis's clock is at or before ARGV[1] (ms; 0: no limit) -- a transaction that Redis
#: reads late (it was frozen, the router gave up and answered "not accepted") does nothing -- and only
#: once (a record already there: a retry of one that ran). ARGV[2]: the fixed keys (0 none, 1 the
#: record, 2 the record and the idempotency key); then the record's JSON and expiry (ms), the
#: reservation the idempotency key must still hold, its accepted value and expiry; then one item
#: JSON per stream key. Returns {'ok', entry ids...}, {'expired'}, {'exists'} or {'conflict'}.
_ENQUEUE = """
local limit = tonumber(ARGV[1])
if limit > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if now > limit then return {'expired'} end
end
local fixed = tonumber(ARGV[2])
if fixed >= 1 and redis.call('EXISTS', KEYS[1]) == 1 then return {'exists'} end
if fixed == 2 and redis.call('GET', KEYS[2]) ~= ARGV[5] then return {'conflict'} end
local out = {'ok'}
for i = fixed + 1, #KEYS do
  out[#out + 1] = redis.call('XADD', KEYS[i], '*', 'item', ARGV[7 + i - fixed])
end
if fixed >= 1 then redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4]) end
if fixed == 2 then redis.call('SET', KEYS[2], ARGV[6], 'PX', ARGV[7]) end
return out
"""

#: Cluster mode, one level's part of an enqueue (its keys share the level's slot): KEYS[1] the
#: request's marker at this level (set for ARGV[1] ms; 0: no marker, a hand-off), then one stream per
#: item (ARGV[2...]: their JSON). A marker already there means a retry of a part that ran:
#: {'exists'}; else {'ok', entry ids...}.
_ENQUEUE_LEVEL = """
if ARGV[1] ~= '0' then
  if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists'} end
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
end
local out = {'ok'}
for i = 2, #KEYS do
  out[#out + 1] = redis.call('XADD', KEYS[i], '*', 'item', ARGV[i])
end
return out
"""

#: Cluster mode, a worker's check of an item it took: {whether the request's record exists, the
#: control slot's clock in ms} (KEYS[1]: the record).
_COMMITTED = """
local t = redis.call('TIME')
return {redis.call('EXISTS', KEYS[1]), tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
"""

# A cascade hand-off's claim: the first router to set it decides; the same router may claim it
# again (its first decision failed to reach Redis and it retries), no other can.
_CLAIM_HANDOFF = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end
return 0
"""

#: Redis's clock (ms) on the node of KEYS[1] (the control slot's, on a cluster).
_CLOCK = """
local t = redis.call('TIME')
return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

#: How long a Redis clock reading stays good for enqueue deadlines (s): clocks drift apart slowly.
CLOCK_READING_S = 5.0

#: Re-queue entries pending at a dead consumer, fenced: only while KEYS[2] (the leader lease) holds
#: ARGV[3] ('' : no fence), and only the entries still pending at that consumer (a worker's
#: XAUTOCLAIM may have taken one meanwhile). KEYS[1]: the stream, KEYS[3] (optional, in its slot) the
#: stream the copies go to (a worker's own stream's go to the level's); ARGV[1] group, ARGV[2] consumer,
#: then (entry id, the copy's item JSON, '' for a deleted entry: acked only) pairs. Returns the
#: number of copies queued, or -1 when the fence refused.
_REQUEUE = """
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[3] then return -1 end
local moved = 0
for i = 4, #ARGV, 2 do
  local held = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if #held > 0 then
    if ARGV[i + 1] ~= '' then
      redis.call('XADD', KEYS[3] or KEYS[1], '*', 'item', ARGV[i + 1])
      moved = moved + 1
    end
    redis.call('XACK', KEYS[1], ARGV[1], ARGV[i])
    redis.call('XDEL', KEYS[1], ARGV[i])
  end
end
return moved
"""

#: Cluster mode: the re-queue of :data:`_REQUEUE`, fenced by the level's own copy of the highest
#: leader token that re-queued there (KEYS[2], in the level's slot; ARGV[3] this leader's token, ''
#: none): a token below it is refused (-1), so once a newer leader has acted at a level a stale one
#: cannot; before it, the pending check alone keeps an item from being queued twice.
_REQUEUE_BY_TOKEN = """
if ARGV[3] ~= '' then
  if tonumber(ARGV[3]) < tonumber(redis.call('GET', KEYS[2]) or '0') then return -1 end
  redis.call('SET', KEYS[2], ARGV[3])
end
local moved = 0
for i = 4, #ARGV, 2 do
  local held = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if #held > 0 then
    if ARGV[i + 1] ~= '' then
      redis.call('XADD', KEYS[3] or KEYS[1], '*', 'item', ARGV[i + 1])
      moved = moved + 1
    end
    redis.call('XACK', KEYS[1], ARGV[1], ARGV[i])
    redis.call('XDEL', KEYS[1], ARGV[i])
  end
end
return moved
"""

#: Release a worker's own stream (KEYS[1]) to the level's stream of the same tier (KEYS[2], same
#: slot): up to ARGV[3] entries no consumer has taken yet are read by the releasing consumer
#: (ARGV[2], group ARGV[1]), queued on KEYS[2] and deleted from KEYS[1], in one atomic step (an entry
#: is in exactly one of the two). Returns the number moved.
_RELEASE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
-- a stream a router recreated after it was forgotten has no group yet: every entry is unread
pcall(redis.call, 'XGROUP', 'CREATE', KEYS[1], ARGV[1], '0')
local res = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', tonumber(ARGV[3]), 'STREAMS', KEYS[1], '>')
local moved = 0
if res then
  for _, entry in ipairs(res[1][2]) do
    local f = entry[2]
    if f then
      for j = 1, #f, 2 do
        if f[j] == 'item' then
          redis.call('XADD', KEYS[2], '*', 'item', f[j + 1])
          moved = moved + 1
        end
      end
    end
    redis.call('XACK', KEYS[1], ARGV[1], entry[1])
    redis.call('XDEL', KEYS[1], entry[1])
  end
end
return moved
"""

#: Forget a worker's own streams of a level (KEYS[1..n-1]) once they are empty and nothing is
#: pending there, and take it off the level's owners (KEYS[n], ARGV[2] the worker): 1 when done.
_FORGET_OWNER = """
for i = 1, #KEYS - 1 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    if redis.call('XLEN', KEYS[i]) > 0 then return 0 end
    local ok, p = pcall(redis.call, 'XPENDING', KEYS[i], ARGV[1])
    if ok and tonumber(p[1]) > 0 then return 0 end
  end
end
for i = 1, #KEYS - 1 do redis.call('DEL', KEYS[i]) end
redis.call('SREM', KEYS[#KEYS], ARGV[2])
return 1
"""

#: Delete a stream entry only if no consumer has it pending (no worker took it): 1 when deleted.
_CANCEL_QUEUED = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #pending > 0 then return 0 end
return redis.call('XDEL', KEYS[1], ARGV[2])
"""


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
        self._requeue_script = self.r.register_script(_REQUEUE_BY_TOKEN if self.cluster else _REQUEUE)
        self._committed_script = self.r.register_script(_COMMITTED)
        self._release_script = self.r.register_script(_RELEASE)
        self._forget_owner_script = self.r.register_script(_FORGET_OWNER)
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
            first = self.r.eval(_READ_FIRST, len(streams), *streams, self.keys.group, self.consumer)
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
        slot (:data:`_REQUEUE_BY_TOKEN`)."""

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
        streams (each to its tier's), atomically per batch (:data:`_RELEASE`): the worker left the
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
        self._enqueue = self.r.register_script(_ENQUEUE)
        self._enqueue_level = self.r.register_script(_ENQUEUE_LEVEL)
        self._clock_script = self.r.register_script(_CLOCK)
        self._claim_handoff_script = self.r.register_script(_CLAIM_HANDOFF)
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

        For a request sent with an ``Idempotency-Key`` (:func:`argusdiff.service.idempotency.current_guard`)
        the step also turns the key's reservation into the accepted generation id, and runs only
        while the reservation is still ours; else nothing is queued and
        :class:`~argusdiff.service.idempotency.IdempotencyConflict` is raised.

        On a Redis Cluster the levels' streams and the record are in different slots, so one step
        cannot hold them: :meth:`_enqueue_by_slot` queues the items level by level, then writes the
        record under the same deadline, and that write is the acceptance (workers run an item only
        once its request's record exists, :meth:`RedisWorkQueue._accepted`)."""
        from argusdiff.service.idempotency import current_guard

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
        from argusdiff.service.idempotency import IdempotencyConflict

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
        record (and the idempotency key) is written in the control slot by :data:`_ENQUEUE`, only
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
        res = await self._do(self.r.eval(_CANCEL_QUEUED, 1, stream, self.keys.group, entry_id))
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
