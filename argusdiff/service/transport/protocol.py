"""What the router, the control loop and the workers need of a transport, as typing protocols,
plus the pieces every implementation shares (the result wait, a result's summary).

* :class:`~workers.queue.WorkQueue` — one queue per level, at-least-once delivery (the workers'
  side: they import it from :mod:`workers.queue`, which never imports the service);
* :class:`ResultStore` — a worker publishes a result, a caller waits for it (once);
* :class:`ControlStore` — the published plan and each worker's heartbeat.

Implementations: :mod:`argusdiff.service.transport.memory` (embedded, one process) and
:mod:`argusdiff.service.transport.redis_streams` with :mod:`argusdiff.service.transport.redis_control`
(distributed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from argusdiff.domain import Plan
from workers.messages import WorkResult
from workers.queue import WorkQueue

__all__ = ["ControlStore", "ResultStore", "WorkQueue", "summarize", "wait_result"]


@runtime_checkable
class ResultStore(Protocol):
    """Where a worker's result waits for whoever asked for it."""

    def result(self, request_id: str, result: WorkResult) -> None: ...

    def wait_result(self, request_id: str, timeout: float | None = None) -> WorkResult | None:
        """The result of ``request_id`` (once), or ``None`` after ``timeout`` seconds."""
        ...


class ControlStore(Protocol):
    """What the control loop and the workers share: the plan in force and the workers' heartbeats
    (a worker whose heartbeat is older than its ttl is dead)."""

    def publish_plan(self, plan: Plan) -> None: ...

    def read_plan(self) -> Plan | None: ...

    def beat(self, worker_id: str, info: dict[str, Any], ttl_s: float) -> None: ...

    def leave(self, worker_id: str) -> None: ...

    def heartbeats(self) -> tuple[dict[str, dict[str, Any]], set[str]]:
        """(alive worker id -> last heartbeat info, dead worker ids not yet forgotten)."""
        ...

    def forget_worker(self, worker_id: str) -> None: ...


def wait_result(
    take: Callable[[], WorkResult | None],
    timeout: float | None,
    pause: Callable[[float | None], Any],
) -> WorkResult | None:
    """The one result wait of every :class:`ResultStore`: ``take()`` until it returns a result, or
    ``None`` once ``timeout`` seconds have passed (``None``: no limit; ``0``: one try). Between
    tries ``pause(remaining)`` waits (``remaining`` is ``None`` without a limit): a condition
    variable's ``wait`` in one process, a short sleep when polling Redis."""
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    while True:
        res = take()
        if res is not None:
            return res
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return None
        pause(remaining)


def summarize(result: WorkResult) -> dict[str, Any]:
    """What the router's bookkeeping needs of a finished item (no image)."""
    t = result.timings or {}
    return {
        "level": result.level,
        "ok": result.ok,
        "error_type": result.error_type,
        "cache_error": bool(result.cache_error) or result.error_type == "CacheUnavailable",
        "cache_hit": result.cache_hit,
        "lookup_s": float(t.get("cache_lookup_s", 0.0)),
        "fetch_s": float(t.get("latent_fetch_s", 0.0)),
        # the batch's execution (denoising and decoding): the measured latency the router learns
        "run_s": float(t.get("denoise_s", 0.0)) + float(t.get("decode_s", 0.0)),
        "finished_s": result.finished_s,
        "handoff": None if result.handoff is None else result.handoff.level,
    }
