"""Fair use between tenants: per-API-key request and image rate limits and a concurrent-request
quota, checked before a request is routed.

A tenant is an API key (``[service] api_keys``; without keys every client is one tenant,
``anonymous``). Its limits are ``[quotas.keys."<key>"]`` where set, else ``[quotas] default``:

* ``requests_per_minute`` and ``images_per_minute``: rate limits, each a GCRA (the generic cell
  rate algorithm, a token bucket stored as one number): a bucket of ``limit`` that refills at
  ``limit`` per minute, so a tenant may burst its minute's worth and then goes at the rate; a
  request of ``n`` images takes 1 request and ``n`` images;
* ``concurrent``: generations accepted and not finished (every image done, cancelled or lost).

A request over a limit gets 429 in OpenAI's shape, ``code: rate_limit_exceeded``, ``type`` the
limit's kind (``requests``, ``images``, ``concurrent_requests``) and ``param`` its name, with
``Retry-After``: when the bucket has room for it again (rate limits) or ``[service] retry_after_s``
(the concurrent quota). Nothing of a refused request is counted.

State lives in process memory (embedded mode, :class:`MemoryQuotaStore`) or in the deployment's
Redis (distributed mode, :class:`RedisQuotaStore`: one key per tenant and limit, updated by Lua
scripts on Redis's clock, so every router enforces one budget). A router that dies holding a
concurrent slot frees it when the slot's lease expires (the request's SLO + ``request_timeout_s``).
Tenants appear in Redis keys as a hash of their key, never the key itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from argusdiff.service.errors import ApiError

__all__ = ["ANONYMOUS", "Lease", "MemoryQuotaStore", "QuotaStore", "Quotas", "RedisQuotaStore", "gcra"]

ANONYMOUS = "anonymous"


def gcra(tat: float, now: float, cost: float, limit_per_min: float) -> tuple[bool, float, float]:
    """One GCRA step for a bucket of ``limit_per_min`` refilled at ``limit_per_min`` per minute:
    ``tat`` is the bucket's theoretical arrival time (0: full). Returns (allowed, new tat, seconds
    until it would be allowed)."""
    interval = 60.0 / limit_per_min
    burst = limit_per_min * interval  # = 60 s: a minute's worth may arrive at once
    new = max(tat, now) + cost * interval
    if new - now > burst + 1e-9:
        return False, tat, new - now - burst
    return True, new, 0.0


class QuotaStore(Protocol):
    async def take(self, tenant: str, costs: dict[str, tuple[float, float]]) -> tuple[str | None, float]:
        """Take ``cost`` from each named bucket ``{name: (cost, limit per minute)}`` of ``tenant``,
        all or none: (None, 0) when taken, else (the first bucket without room, seconds to wait)."""
        ...

    async def acquire(self, tenant: str, slot: str, limit: int, ttl_s: float) -> bool:
        """Hold one of ``limit`` concurrent slots of ``tenant`` as ``slot`` (freed by
        :meth:`release` or after ``ttl_s``)."""
        ...

    async def release(self, tenant: str, slot: str) -> None: ...

    async def held(self, tenant: str) -> int: ...


class MemoryQuotaStore:
    """Embedded mode: the buckets and slots in process memory."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._tat: dict[tuple[str, str], float] = {}
        self._slots: dict[str, dict[str, float]] = {}

    async def take(self, tenant: str, costs: dict[str, tuple[float, float]]) -> tuple[str | None, float]:
        with self._lock:
            now = self.clock()
            new = {}
            for name, (cost, limit) in costs.items():
                ok, tat, wait = gcra(self._tat.get((tenant, name), 0.0), now, cost, limit)
                if not ok:
                    return name, wait
                new[tenant, name] = tat
            self._tat.update(new)
            return None, 0.0

    async def acquire(self, tenant: str, slot: str, limit: int, ttl_s: float) -> bool:
        with self._lock:
            now = self.clock()
            slots = {s: t for s, t in self._slots.get(tenant, {}).items() if t > now}
            if len(slots) >= limit:
                self._slots[tenant] = slots
                return False
            slots[slot] = now + ttl_s
            self._slots[tenant] = slots
            return True

    async def release(self, tenant: str, slot: str) -> None:
        with self._lock:
            self._slots.get(tenant, {}).pop(slot, None)

    async def held(self, tenant: str) -> int:
        with self._lock:
            now = self.clock()
            return sum(1 for t in self._slots.get(tenant, {}).values() if t > now)


#: KEYS: the buckets; ARGV: n, then (cost, limit per minute) per bucket. Redis's clock.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local n = tonumber(ARGV[1])
local new = {}
for i = 1, n do
  local cost = tonumber(ARGV[2 * i])
  local limit = tonumber(ARGV[2 * i + 1])
  local interval = 60.0 / limit
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
  if tat < now then tat = now end
  local nt = tat + cost * interval
  if nt - now > 60.0 + 1e-9 then
    return {i, tostring(nt - now - 60.0)}
  end
  new[i] = nt
end
for i = 1, n do
  redis.call('SET', KEYS[i], tostring(new[i]), 'PX', math.ceil((new[i] - now) * 1000) + 1000)
end
return {0, '0'}
"""

#: KEYS[1]: the tenant's slots (sorted set: slot -> expiry); ARGV: slot, limit, ttl_s.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3]) * 1000) + 1000)
return 1
"""


class RedisQuotaStore:
    """Distributed mode: one budget for every router, in the deployment's Redis (see the module
    doc). ``keys`` names the keys (:class:`argusdiff.service.transport.redis_streams.RedisKeys`)."""

    def __init__(self, client: Any, keys: Any) -> None:
        self.r = client
        self.keys = keys

    async def take(self, tenant: str, costs: dict[str, tuple[float, float]]) -> tuple[str | None, float]:
        names = list(costs)
        argv: list[Any] = [len(names)]
        for name in names:
            argv.extend(costs[name])
        which, wait = await self.r.eval(_TAKE, len(names), *(self.keys.quota(tenant, n) for n in names), *argv)
        which = int(which)
        return (None, 0.0) if which == 0 else (names[which - 1], float(wait))

    async def acquire(self, tenant: str, slot: str, limit: int, ttl_s: float) -> bool:
        return bool(await self.r.eval(_ACQUIRE, 1, self.keys.quota(tenant, "concurrent"), slot, limit, ttl_s))

    async def release(self, tenant: str, slot: str) -> None:
        await self.r.zrem(self.keys.quota(tenant, "concurrent"), slot)

    async def held(self, tenant: str) -> int:
        now = time.time()
        return int(await self.r.zcount(self.keys.quota(tenant, "concurrent"), now, "+inf"))


_KINDS = {"requests_per_minute": "requests", "images_per_minute": "images", "concurrent": "concurrent_requests"}


@dataclass(slots=True)
class Lease:
    """A concurrent slot held by one generation (or nothing to release)."""

    quotas: Quotas | None = None
    tenant: str = ""
    slot: str = ""
    released: bool = False

    async def release(self) -> None:
        if self.quotas is None or self.released:
            return
        self.released = True
        await self.quotas.store.release(self.tenant, self.slot)

    def release_soon(self) -> None:
        """Release from synchronous code on the event loop (the router's bookkeeping)."""
        if self.quotas is not None and not self.released:
            task = asyncio.ensure_future(self.release())
            self.quotas.tasks.add(task)
            task.add_done_callback(self.quotas.tasks.discard)


class Quotas:
    """The ``[quotas]`` of a deployment over a store; :meth:`admit` before a request is routed."""

    def __init__(self, config: Any, store: QuotaStore, *, retry_after_s: float, lease_s: float) -> None:
        self.config = config
        self.store = store
        self.retry_after_s = retry_after_s
        self.lease_s = lease_s
        self.tasks: set[asyncio.Task] = set()
        self.refused: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        cfg = self.config
        return any(_limited(lim) for lim in (cfg.default, *cfg.keys.values()))

    def limits(self, key: str | None) -> Any:
        return self.config.keys.get(key, self.config.default) if key is not None else self.config.default

    @staticmethod
    def tenant(key: str | None) -> str:
        """How a key appears in the store (a hash; ``anonymous`` without authentication)."""
        if key is None:
            return ANONYMOUS
        return hashlib.sha256(key.encode()).hexdigest()[:24]

    async def admit(self, key: str | None, images: int, slot: str) -> Lease:
        """Take one request and ``images`` images from the tenant's rate limits and hold one of its
        concurrent slots as ``slot``; 429 (nothing taken) when a limit is reached."""
        lim = self.limits(key)
        if not _limited(lim):
            return Lease()
        if lim.images_per_minute is not None and images > lim.images_per_minute:
            raise ApiError(400, f"'n': {images} images is more than this API key's images_per_minute "
                           f"({lim.images_per_minute}): ask for fewer", param="n", code="invalid_value")  # fmt: skip
        tenant = self.tenant(key)
        if lim.concurrent is not None and not await self.store.acquire(tenant, slot, lim.concurrent, self.lease_s):
            raise self._refuse("concurrent", lim.concurrent, self.retry_after_s)
        costs = {
            name: (cost, float(limit))
            for name, cost, limit in (
                ("requests_per_minute", 1.0, lim.requests_per_minute),
                ("images_per_minute", float(images), lim.images_per_minute),
            )
            if limit is not None
        }
        if costs:
            which, wait = await self.store.take(tenant, costs)
            if which is not None:
                if lim.concurrent is not None:
                    await self.store.release(tenant, slot)
                raise self._refuse(which, getattr(lim, which), wait)
        if lim.concurrent is None:
            return Lease()
        return Lease(self, tenant, slot)

    def _refuse(self, name: str, limit: float, wait_s: float) -> ApiError:
        self.refused[name] = self.refused.get(name, 0) + 1
        what = name.replace("_", " ")
        retry = max(1, math.ceil(wait_s))
        if name == "concurrent":
            message = f"rate limit reached: {limit:g} concurrent requests (this API key's quota); retry in {retry} s"
        else:
            message = f"rate limit reached: {limit:g} {what} (this API key's quota); retry in {retry} s"
        return ApiError(429, message, type=_KINDS[name], param=name, code="rate_limit_exceeded",
                        headers={"Retry-After": str(retry)})  # fmt: skip


def _limited(lim: Any) -> bool:
    return any(getattr(lim, f) is not None for f in ("requests_per_minute", "images_per_minute", "concurrent"))
