"""The messages of the data path: :class:`WorkItem` in, :class:`WorkResult` out, and the
per-level :class:`LevelExecutor` protocol that turns one into the other.

``WorkItem`` and ``WorkResult`` are plain, JSON-serialisable records (``to_dict``/``from_dict``)
so any :class:`~workers.queue.WorkQueue` transport (in-process, Redis Streams) can carry them.
Times named ``*_s`` on the wall clock are ``time.time()`` seconds; durations are seconds.

This module depends on the standard library only: the router, the transports and every executor
import it, and it imports none of them (:mod:`workers.executor` builds the executors).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "TIMING_KEYS",
    "LevelExecutor",
    "WorkItem",
    "WorkResult",
    "handoff_item",
]

#: Per-request timings every result reports (seconds; 0.0 when a phase did not happen).
TIMING_KEYS = ("queue_wait_s", "cache_lookup_s", "latent_fetch_s", "denoise_s", "decode_s")


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One request queued for one level.

    An AC worker always does its own cache lookup at its level's K. ``receipt`` is the transport's
    delivery handle (e.g. a Redis stream entry id), set by ``WorkQueue.get`` and never serialised.
    """

    request_id: str
    prompt: str
    level: str
    seed: int | None = None
    deadline_s: float | None = None  # absolute wall-clock deadline (time.time())
    enqueue_s: float = 0.0  # wall-clock time the item was queued
    attempt: int = 0  # deliveries before this one (a re-claimed item has attempt >= 1)
    meta: Mapping[str, str] = field(default_factory=dict)  # e.g. tier, cascade hand-off origin
    receipt: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError("WorkItem.request_id must be a non-empty string")
        if not isinstance(self.prompt, str):
            raise ValueError("WorkItem.prompt must be a string")
        if not isinstance(self.level, str) or not self.level:
            raise ValueError("WorkItem.level must be a non-empty level id")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"WorkItem.seed must be an integer or None, got {self.seed!r}")

    @property
    def tier(self) -> str | None:
        """The request's SLO tier (``meta["tier"]``; None for untiered work): the work queues pull
        a level's queued items highest-priority tier first (:data:`argusdiff.domain.TIER_PRIORITY`)."""
        return self.meta.get("tier") or None

    def with_receipt(self, receipt: str | None) -> WorkItem:
        return replace(self, receipt=receipt)

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "prompt": self.prompt,
            "level": self.level,
            "seed": self.seed,
            "deadline_s": self.deadline_s,
            "enqueue_s": self.enqueue_s,
            "attempt": self.attempt,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, receipt: str | None = None) -> WorkItem:
        return cls(
            request_id=str(data["request_id"]),
            prompt=str(data["prompt"]),
            level=str(data["level"]),
            seed=None if data.get("seed") is None else int(data["seed"]),
            deadline_s=None if data.get("deadline_s") is None else float(data["deadline_s"]),
            enqueue_s=float(data.get("enqueue_s") or 0.0),
            attempt=int(data.get("attempt") or 0),
            meta={str(k): str(v) for k, v in (data.get("meta") or {}).items()},
            receipt=receipt,
        )


def handoff_item(item: WorkItem, heavy: str, confidence: float | None) -> WorkItem:
    """A cascade hand-off: ``item`` for the heavy level, with where it came from (its arrival,
    ``enqueue_s``, and deadline unchanged)."""
    return replace(
        item,
        level=heavy,
        attempt=0,
        receipt=None,
        meta={
            **item.meta,
            "deferred_from": item.level,
            "confidence": f"{confidence:.6f}" if confidence is not None else "",
        },
    )


@dataclass(frozen=True, slots=True)
class WorkResult:
    """The outcome of one :class:`WorkItem`: a PNG image or an error, never both.

    ``level`` is the level that produced the image (for a cascade that deferred, the heavy level);
    ``requested_level`` the level the item was queued for. ``timings`` holds :data:`TIMING_KEYS`
    (plus optional extras such as ``judge_s``). ``k_used`` is the number of denoising steps skipped
    thanks to a cached latent (0 on a miss or for non-AC levels).
    """

    request_id: str
    level: str
    image_png: bytes | None = None
    error: str | None = None
    error_type: str | None = None  # class name of the error, e.g. "CacheUnavailable"
    timings: Mapping[str, float] = field(default_factory=dict)
    cache_hit: bool = False
    k_used: int = 0
    worker_id: str | None = None
    requested_level: str | None = None
    seed: int | None = None
    confidence: float | None = None  # cascade: the discriminator's confidence in the light image
    deferred: bool = False  # cascade: the light image was rejected and the heavy level redid it
    unet_calls: int = 0  # denoising network evaluations spent on this request
    finished_s: float = 0.0
    cache_error: str | None = None  # the cache failed (CacheUnavailable); the request ran without it
    # router side: the image left image_png: its id in the image store, or "" when it was
    # delivered to the client that waited and is not kept
    image_ref: str | None = None
    # cascade: the light image was rejected and this item asks the heavy level to redo the request;
    # the result is not final: the router's policy decides (``route_heavy``: redo, drop, or keep
    # the light image, which ``image_png`` carries)
    handoff: WorkItem | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and (self.image_png is not None or self.image_ref is not None)

    @property
    def total_s(self) -> float:
        return float(sum(self.timings.get(k, 0.0) for k in TIMING_KEYS))

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "level": self.level,
            "image_png": None if self.image_png is None else base64.b64encode(self.image_png).decode("ascii"),
            "error": self.error,
            "error_type": self.error_type,
            "timings": dict(self.timings),
            "cache_hit": self.cache_hit,
            "k_used": self.k_used,
            "worker_id": self.worker_id,
            "requested_level": self.requested_level,
            "seed": self.seed,
            "confidence": self.confidence,
            "deferred": self.deferred,
            "unet_calls": self.unet_calls,
            "finished_s": self.finished_s,
            "cache_error": self.cache_error,
            "image_ref": self.image_ref,
            "handoff": None if self.handoff is None else self.handoff.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkResult:
        png = data.get("image_png")
        return cls(
            request_id=str(data["request_id"]),
            level=str(data["level"]),
            image_png=None if png is None else base64.b64decode(png),
            error=data.get("error"),
            error_type=data.get("error_type"),
            timings={str(k): float(v) for k, v in (data.get("timings") or {}).items()},
            cache_hit=bool(data.get("cache_hit", False)),
            k_used=int(data.get("k_used") or 0),
            worker_id=data.get("worker_id"),
            requested_level=data.get("requested_level"),
            seed=None if data.get("seed") is None else int(data["seed"]),
            confidence=None if data.get("confidence") is None else float(data["confidence"]),
            deferred=bool(data.get("deferred", False)),
            unet_calls=int(data.get("unet_calls") or 0),
            finished_s=float(data.get("finished_s") or 0.0),
            cache_error=data.get("cache_error"),
            image_ref=data.get("image_ref"),
            handoff=None if not data.get("handoff") else WorkItem.from_dict(data["handoff"]),
        )

    @classmethod
    def failure(
        cls, item: WorkItem, exc: BaseException, *, worker_id: str | None = None, **timings: float
    ) -> WorkResult:
        return cls(
            request_id=item.request_id,
            level=item.level,
            error=str(exc) or exc.__class__.__name__,
            error_type=exc.__class__.__name__,
            timings={k: float(timings.get(k, 0.0)) for k in TIMING_KEYS},
            worker_id=worker_id,
            requested_level=item.level,
            seed=item.seed,
        )


@runtime_checkable
class LevelExecutor(Protocol):
    """Runs requests of one level on one loaded model (``model`` is its registry name)."""

    level_id: str
    model: str

    def run(self, items: Sequence[WorkItem]) -> list[WorkResult]:
        """Execute a batch (all of this level); one result per item, in order. Per-item failures
        come back as error results; only a broken model raises."""
        ...
