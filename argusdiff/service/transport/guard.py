"""The enqueue guard of an idempotent request: what the transport's enqueue must check and write
for it, and the slot the layer above fills in for the request being submitted.

The HTTP layer (:class:`argusdiff.service.idempotency.IdempotentSubmit`) reserves the
``Idempotency-Key``, makes an :class:`EnqueueGuard` and submits the request inside
:func:`guarding`; the Redis enqueue (:mod:`argusdiff.service.transport.redis_dispatch`) and the
dispatch read it with :func:`current_guard`. The transport defines what it needs and the layer
above hands it over, so nothing in ``transport/`` imports the HTTP layer.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator
from dataclasses import dataclass

from argusdiff.service.errors import QueueUnavailable

__all__ = ["EnqueueGuard", "IdempotencyConflict", "current_guard", "guarding"]


class IdempotencyConflict(QueueUnavailable):
    """The reservation changed under an enqueue (another router took it over): nothing was
    queued. A :class:`QueueUnavailable` so the router undoes its bookkeeping as for any refused
    enqueue; :class:`~argusdiff.service.idempotency.IdempotentSubmit` answers it as 409."""


@dataclass(slots=True)
class EnqueueGuard:
    """What the enqueue transaction checks and writes for an idempotent request (Redis)."""

    key: str
    reservation: str  # the value we reserved the key with
    fingerprint: str
    router: str
    ttl_s: float
    conflict: bool = False

    def accepted(self, gid: str) -> str:
        return json.dumps({"state": "accepted", "gid": gid, "fp": self.fingerprint, "router": self.router})


_GUARD: contextvars.ContextVar[EnqueueGuard | None] = contextvars.ContextVar("argusdiff_enqueue_guard", default=None)


def current_guard() -> EnqueueGuard | None:
    """The guard of the request being submitted in this task (None: not an idempotent request)."""
    return _GUARD.get()


@contextlib.contextmanager
def guarding(guard: EnqueueGuard) -> Iterator[EnqueueGuard]:
    """Submit inside this block: the enqueues it runs (in this task) carry ``guard``."""
    token = _GUARD.set(guard)
    try:
        yield guard
    finally:
        _GUARD.reset(token)
