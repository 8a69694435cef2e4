"""Cancelling running work: a denoising loop stops at its next step when every request of its
batch was cancelled, and the worker is free at once.

The transport says which requests are cancelled (``cancelled(request_ids) -> set``: the embedded
queue's set of stopped ids, or the Redis cancel keys a router sets); :class:`workers.loop.Worker`
binds that check to its thread (:func:`cancels_from`) while it runs a batch, so executors and
pipelines need no transport of their own (as :mod:`workers.progress` does for step events).

An executor makes a :class:`CancelWatch` for its batch and hands it to
:func:`workers.pipelines.generate` / :func:`~workers.pipelines.resume`; the pipeline asks
:meth:`CancelWatch.requested` after every step (``callback_on_step_end``, which every diffusers
pipeline calls, UNet or transformer) and, once it says yes, sets the pipeline's ``interrupt`` flag:
diffusers skips the remaining steps, nothing is decoded, and :class:`Cancelled` carries how many
steps ran. The transport is asked after every step; one that pays a round trip per question (Redis) answers
from what it read within its own ``cancel_poll_s``.

A batch stops only when all its requests are cancelled: a request cancelled in a batch with others
still wanted runs to the end and its result is dropped by the router.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from workers.errors import WorkerError
from workers.messages import TIMING_KEYS, WorkItem, WorkResult

__all__ = [
    "CANCELLED",
    "CancelCheck",
    "CancelWatch",
    "Cancelled",
    "cancelled_result",
    "cancels_from",
    "current_check",
]

#: ``error_type`` of the result of a cancelled request (the router counts it as ``cancelled``)
CANCELLED = "Cancelled"

CancelCheck = Callable[[Sequence[str]], set[str]]

_local = threading.local()


class Cancelled(WorkerError):
    """Every request of the batch was cancelled; the run stopped after ``steps`` denoising steps
    (``unet_calls`` forward calls of the denoising network)."""

    def __init__(self, message: str = "cancelled", *, steps: int = 0, unet_calls: int = 0) -> None:
        super().__init__(message)
        self.steps = steps
        self.unet_calls = unet_calls


@contextlib.contextmanager
def cancels_from(check: CancelCheck | None) -> Iterator[None]:
    """Bind the cancel check of this thread (a worker's queue's ``cancelled``)."""
    prev = getattr(_local, "check", None)
    _local.check = check
    try:
        yield
    finally:
        _local.check = prev


def current_check() -> CancelCheck | None:
    return getattr(_local, "check", None)


class CancelWatch:
    """Whether every request of one running batch has been cancelled (see the module doc)."""

    def __init__(self, items: Sequence[WorkItem]) -> None:
        self.check = current_check()
        self.ids = tuple(item.request_id for item in items)
        self._stop = False
        self.checks = 0

    @property
    def active(self) -> bool:
        return self.check is not None and bool(self.ids)

    def requested(self) -> bool:
        """True once every request of the batch is cancelled (a failing transport never stops a run)."""
        if self._stop or not self.active:
            return self._stop
        self.checks += 1
        try:
            gone = self.check(self.ids)  # type: ignore[misc]
        except Exception:  # a transport hiccup: keep running (the result is dropped if cancelled)
            return False
        self._stop = set(self.ids) <= set(gone)
        return self._stop


def cancelled_result(item: WorkItem, exc: Cancelled | None = None, **timings: float) -> WorkResult:
    """The result of a cancelled request: no image, ``error_type`` :data:`CANCELLED`, and the
    denoising calls it cost before it stopped (0: stopped before it started)."""
    return WorkResult(
        request_id=item.request_id,
        level=item.level,
        error=str(exc) if exc is not None else "cancelled before it started",
        error_type=CANCELLED,
        timings={k: float(timings.get(k, 0.0)) for k in TIMING_KEYS},
        requested_level=item.level,
        seed=item.seed,
        unet_calls=exc.unet_calls if exc is not None else 0,
        finished_s=time.time(),
    )
