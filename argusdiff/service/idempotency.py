"""``Idempotency-Key`` on the generation endpoints: a retry gets the original result.

A client that sends ``Idempotency-Key: <key>`` (1–255 visible ASCII characters) with
``POST /v1/images/generations`` or ``POST /v1/argusdiff/generations`` and retries with the same
key and body — after a timeout, a dropped connection, or a router that died — through any
router, gets the generation its first attempt started: never a second generation, never a lost
one. The header follows the IETF draft "The Idempotency-Key HTTP Header Field"
(draft-ietf-httpapi-idempotency-key-header): the same key with a different body is 422
``idempotency_key_reused``; a retry while the first attempt is still being accepted is 409
``idempotency_key_in_use`` with ``Retry-After``.

How (Redis; key ``ns:idem:<sha256 of endpoint, API key, Idempotency-Key>``):

1. ``SET NX`` a *reservation* naming this router (expiry ``RESERVE_S``).
2. The router routes the request as usual; its enqueue transaction (``WATCH`` the key, check the
   reservation is still ours, ``MULTI``: the work items, the request record, and the key's final
   value with the generation id, expiring with the results after ``result_ttl_s``) makes
   acceptance and the key one atomic step: a router killed before it leaves only a reservation
   (nothing queued), one killed after leaves an accepted generation the retry is answered from.
3. A retry that finds an accepted key waits for (or reads) that generation's results. One that
   finds a reservation waits briefly for it to resolve; a reservation held by a router whose
   heartbeat expired (it died mid-request) is taken over with a compare-and-set.
4. A request that is not accepted (429 overloaded, 503) gives its reservation back, so the retry
   is routed afresh.

Embedded mode keeps the same states in process memory.

The official ``openai`` client retries on its own, but sends no key; pass one per logical request
so that its retries (and yours) are idempotent::

    client.images.generate(prompt=..., extra_headers={"Idempotency-Key": str(uuid.uuid4())})
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from argusdiff.service.errors import ApiError, QueueUnavailable
from argusdiff.service.router import Submission
from argusdiff.service.transport.guard import EnqueueGuard, IdempotencyConflict, current_guard, guarding

__all__ = ["HEADER", "EnqueueGuard", "IdempotencyConflict", "IdempotentSubmit", "Replayed", "current_guard"]

HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 255
RESERVE_S = 30.0  # a reservation outlives any live router's submit by far
WAIT_RESERVED_S = 5.0  # how long a retry waits for another router's reservation to resolve


@dataclass(frozen=True, slots=True)
class Replayed(Submission):
    """A retried request: the generation its first attempt started (and its stored record)."""

    record_data: dict = field(default_factory=dict)


def _fingerprint(spec: Any) -> str:
    data = dataclasses.asdict(spec)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _parse_key(raw: str) -> str:
    if not raw or len(raw) > MAX_KEY_CHARS or not all(33 <= ord(c) <= 126 for c in raw):
        raise ApiError(
            400,
            f"{HEADER} must be 1-{MAX_KEY_CHARS} visible ASCII characters (e.g. a UUID)",
            param=HEADER,
            code="invalid_header",
        )
    return raw


@dataclass(slots=True)
class _LocalEntry:
    value: dict
    expires: float


@dataclass(slots=True)
class _LocalKeys:
    """Embedded mode: the same states in memory (one process is the whole deployment)."""

    entries: dict[str, _LocalEntry] = field(default_factory=dict)

    def get(self, key: str) -> dict | None:
        e = self.entries.get(key)
        if e is None or e.expires <= time.monotonic():
            self.entries.pop(key, None)
            return None
        return e.value

    def set(self, key: str, value: dict, ttl_s: float, nx: bool = False) -> bool:
        if nx and self.get(key) is not None:
            return False
        if len(self.entries) > 10_000:  # drop expired ones now and then
            now = time.monotonic()
            for k in [k for k, e in self.entries.items() if e.expires <= now]:
                del self.entries[k]
        self.entries[key] = _LocalEntry(value, time.monotonic() + ttl_s)
        return True

    def delete_if(self, key: str, value: dict) -> None:
        if self.get(key) == value:
            self.entries.pop(key, None)


# KEYS: key. ARGV: expected value. Deletes the key only while it holds our reservation.
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
# KEYS: key. ARGV: expected, new value, ttl ms. Compare-and-set (taking over a dead router's reservation).
_SWAP = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end "
    "return 0"
)


class IdempotentSubmit:
    """``submit(request, spec, endpoint)`` and ``wait(sub, timeout)`` for the API handlers: the
    router's own when no key is sent; see the module doc when one is."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.router = service.router
        self.dispatch = service.dispatch
        self.ttl_s = float(service.config.result_ttl_s)
        control = service.control
        self.router_id = getattr(control, "router_id", "local")
        self.bus = getattr(control, "bus", None)
        self.redis = None
        if self.dispatch.mode == "redis":
            self.redis = service.dispatch.queue.r
            self.ns = service.dispatch.queue.keys.ns
            self._release = self.redis.register_script(_RELEASE)
            self._swap = self.redis.register_script(_SWAP)
        self.local = _LocalKeys()
        self.replays = 0
        self._keyed: dict[str, float] = {}  # generation ids accepted with a key (-> expiry)

    # -- the key store (Redis or memory) --------------------------------------------------------

    def _key(self, endpoint: str, auth: str, key: str) -> str:
        digest = hashlib.sha256(f"{endpoint}\0{auth}\0{key}".encode()).hexdigest()
        return f"{self.ns}:idem:{digest}" if self.redis is not None else digest

    async def _get(self, key: str) -> tuple[dict | None, str | None]:
        if self.redis is None:
            value = self.local.get(key)
            return value, None
        raw = await self._io(self.redis.get, key)
        if raw is None:
            return None, None
        text = raw.decode() if isinstance(raw, bytes) else raw
        return json.loads(text), text

    async def _io(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except Exception as exc:
            raise self._unavailable() from exc

    def _unavailable(self) -> ApiError:
        """The 503 of a key or record Redis could not answer for: nothing new was accepted, and a
        retry with the same key finds the generation its first attempt started, if any."""
        return ApiError(
            503,
            f"the idempotency store (redis) is unavailable; retry shortly with the same {HEADER}",
            type="server_busy",
            code="queue_unavailable",
            headers={"Retry-After": str(self.service.config.retry_after_s)},
        )

    async def _reserve(self, key: str, value: dict) -> str | None:
        """Our reservation's stored text when we got the key, else None."""
        if self.redis is None:
            return "local" if self.local.set(key, value, RESERVE_S, nx=True) else None
        text = json.dumps(value)
        ok = await self._io(self.redis.set, key, text, nx=True, px=int(RESERVE_S * 1000))
        return text if ok else None

    async def _give_back(self, key: str, value: dict, text: str) -> None:
        if self.redis is None:
            self.local.delete_if(key, value)
            return
        with contextlib.suppress(Exception):  # else the reservation expires on its own
            await asyncio.to_thread(self._release, keys=[key], args=[text])

    def _router_alive(self, router_id: str) -> bool:
        if router_id == self.router_id or self.bus is None:
            return True
        return router_id in self.bus.routers()

    # -- submit and wait ------------------------------------------------------------------------

    async def submit(self, request: Any, spec: Any, endpoint: str) -> Any:
        raw = request.headers.get(HEADER.lower())
        if raw is None:
            return await self.router.submit(spec)
        idem = _parse_key(raw)
        # keys are per API key where keys are checked; without authentication every client shares one scope
        auth = request.headers.get("authorization", "") if self.service.config.api_keys else ""
        auth = hashlib.sha256(auth.encode()).hexdigest()
        key = self._key(endpoint, auth, idem)
        fp = _fingerprint(spec)
        deadline = time.monotonic() + WAIT_RESERVED_S
        while True:
            mine = {"state": "reserved", "router": self.router_id, "fp": fp, "ts": time.time()}
            text = await self._reserve(key, mine)
            if text is not None:
                return await self._first(key, mine, text, spec, fp)
            found, found_text = await self._get(key)
            if found is None:
                continue  # expired or given back meanwhile: reserve again
            if found.get("fp") != fp:
                raise ApiError(
                    422,
                    f"this {HEADER} was used with a different request body; use a new key for a new request",
                    param=HEADER,
                    code="idempotency_key_reused",
                )
            if found.get("state") == "accepted":
                sub = await self._replay(found["gid"], spec)
                if sub is not None:
                    return sub
                await self._give_back(key, found, found_text or "")  # its record expired: start afresh
                continue
            # reserved by another attempt: it resolves in milliseconds unless its router died
            holder = str(found.get("router"))
            if self.redis is not None and found_text is not None and not await self._io(self._router_alive, holder):
                mine_text = json.dumps(mine)
                swapped = await self._io(self._swap, keys=[key], args=[found_text, mine_text, int(RESERVE_S * 1000)])
                if swapped:
                    return await self._first(key, mine, mine_text, spec, fp)
                continue
            if time.monotonic() >= deadline:
                raise ApiError(
                    409,
                    f"a request with this {HEADER} is still being accepted; retry shortly",
                    type="invalid_request_error",
                    param=HEADER,
                    code="idempotency_key_in_use",
                    headers={"Retry-After": "1"},
                )
            await asyncio.sleep(0.02)

    async def _first(self, key: str, mine: dict, text: str, spec: Any, fp: str) -> Any:
        """This attempt holds the reservation: route it; the enqueue makes the key final (Redis)
        and keeps the images for a retry (the dispatch reads the guard too)."""
        guard = EnqueueGuard(key=key, reservation=text, fingerprint=fp, router=self.router_id, ttl_s=self.ttl_s)
        try:
            with guarding(guard):
                sub = await self.router.submit(spec)
        except ApiError:
            if guard.conflict:
                raise ApiError(
                    409,
                    f"another router took over this {HEADER}; retry to get its result",
                    param=HEADER,
                    code="idempotency_key_in_use",
                    headers={"Retry-After": "1"},
                ) from None
            await self._give_back(key, mine, text)
            raise
        except BaseException:
            await self._give_back(key, mine, text)
            raise
        if self.redis is None:
            self.local.set(key, {"state": "accepted", "gid": sub.id, "fp": fp, "router": self.router_id}, self.ttl_s)
        self._remember(sub.id)
        return sub

    def _remember(self, gid: str) -> None:
        now = time.monotonic()
        self._keyed[gid] = now + self.ttl_s
        while self._keyed:  # oldest first: drop the expired
            first, expires = next(iter(self._keyed.items()))
            if expires > now and len(self._keyed) <= 100_000:
                break
            del self._keyed[first]

    def keyed(self, sub: Any) -> bool:
        """Whether ``sub`` came with an Idempotency-Key (its client will retry for it: a dropped
        connection must not cancel its work)."""
        return isinstance(sub, Replayed) or sub.id in self._keyed

    async def _replay(self, gid: str, spec: Any) -> Replayed | None:
        try:
            record = await self.dispatch.get_record(gid)
        except QueueUnavailable as exc:
            raise self._unavailable() from exc
        if record is None:
            return None
        self.replays += 1
        return Replayed(
            record_data=record,
            id=record["id"],
            created=int(record["created"]),
            request_ids=tuple(record["request_ids"]),
            levels=tuple(record.get("levels") or ()),
            optimal_levels=tuple(record.get("optimal_levels") or (None,) * len(record["request_ids"])),
            deadline_s=float(record.get("deadline_s", 0.0)),
            spec=spec,
            arrival_s=float(record.get("arrival_s", record["created"])),
        )

    async def wait(self, sub: Any, timeout: float) -> list[Any]:
        """The results of ``sub`` in order (``TimeoutError``: the work stays queued)."""
        if not isinstance(sub, Replayed):
            return await self.router.wait(sub, timeout)
        # awaited first (the dispatch then tells finished from unknown), then what is already done
        ids = list(sub.request_ids)
        futs = dict(zip(ids, self.dispatch.expect(ids), strict=True))
        deadline = time.monotonic() + timeout
        while True:
            open_ids = [rid for rid, f in futs.items() if not f.done()]
            try:
                found = await self.dispatch.fetch_results(open_ids, sub.record_data) if open_ids else {}
            except QueueUnavailable:  # the work stays accepted: its result comes later, or the next read finds it
                found = {}
            for rid, res in found.items():
                if not futs[rid].done():  # else the results listener delivered it during the read
                    futs[rid].set_result(res)
            self.dispatch.forget(list(found))
            left = deadline - time.monotonic()
            pending = [f for f in futs.values() if not f.done()]
            if not pending:
                return [futs[rid].result() for rid in ids]
            if left <= 0:
                self.dispatch.detach(ids)
                raise TimeoutError
            # a result arrives through the dispatch; look again now and then (a notification lost)
            await asyncio.wait([asyncio.shield(f) for f in pending], timeout=min(1.0, left))

    async def prime_stream(self, sub: Any) -> None:
        """A streamed retry of a finished generation: its result goes to the stream at once."""
        if not isinstance(sub, Replayed):
            return
        rid = sub.request_ids[0]
        events = self.dispatch.events(rid)
        try:
            found = await self.dispatch.fetch_results([rid], sub.record_data)
        except QueueUnavailable as exc:
            raise self._unavailable() from exc
        res = found.get(rid)
        if res is None:
            return  # still running: its result comes to the stream as for the first attempt
        images = getattr(self.dispatch, "images", None)
        if res.ok and res.image_png is None and res.image_ref and images is not None:
            from argusdiff.service.images import read_image

            # the kept image, already in the requested format (the stream re-encodes any format PIL reads)
            data = await asyncio.to_thread(read_image, images, res.image_ref)
            res = dataclasses.replace(res, image_png=data) if data is not None else res
        events.put_nowait(("result", res))
