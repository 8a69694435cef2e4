"""The worker loop: take work for this worker's level from the :class:`~workers.queue.WorkQueue`,
run it at the planned batch size, publish one result per request, and follow plan changes.

* A worker serves one level at a time (ARGUS: a worker's approximation level is set by the
  plan). :meth:`Worker.set_level` / :meth:`Worker.apply_plan` take effect at the next batch
  boundary: the batch in hand finishes on the old level, requests still queued for the old level
  stay in its queue for the workers that keep it, and the executor (and model, if it differs) for
  the new level is built before the next ``get``. Nothing queued is dropped.
* A batch is the first item (blocking up to ``poll_s``) plus whatever else is already queued,
  up to the batch size.
* Approximate caching: the levels of one model differ only in the K a request resumes at, so a
  worker at one of them also serves the queues of its *sibling* AC levels (same model and N,
  :meth:`ApproxLevel.shares_worker_with`) that the plan gives no worker of their own — e.g.
  NIRVANA's plan puts every worker at K = 0 and routes each prompt to the K its cache similarity
  allows. The worker takes from its own queue and those in turn, never a model switch.
* Per-worker delivery (a policy whose source queues each request on one worker, e.g. Proteus):
  the router puts such an item on this worker's own queue of the level (``meta["worker"]``); the
  worker takes from its own queue first, then the level's shared one. When it leaves a level (a
  plan change, or :meth:`Worker.stop`) it releases its own queue of that level to the shared one
  (``WorkQueue.release``), so nothing waits behind a worker that will not take it.
* Requests are never dropped for lateness here (admission is the router's job); a result of an
  item with a deadline carries ``timings["late_s"]`` (0 when on time).
* Failures never lose a request: an executor error becomes an error result for each item of the
  batch (``error_type`` names it). A cascade deferral is published like a result, carrying the
  light image and a ``handoff`` item for the heavy level: the router's policy decides
  (``route_heavy``, the same call the simulator makes) whether the heavy level redoes it.
* :meth:`Worker.stop` finishes the batch in hand; items taken but not started are returned to
  the queue (``nack``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from argusdiff import tracing
from workers.adapters import run_batch
from workers.cancel import CANCELLED, Cancelled, cancelled_result, cancels_from
from workers.edits import run_with_edits
from workers.messages import LevelExecutor, WorkItem, WorkResult
from workers.queue import WorkQueue

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("argusdiff.workers")


@dataclass(slots=True)
class WorkerStats:
    batches: int = 0
    processed: int = 0
    failed: int = 0
    handed_off: int = 0
    cancelled: int = 0  # requests cancelled before they started or stopped mid-run
    switches: int = 0
    busy_s: float = 0.0
    switch_s: list[float] = field(default_factory=list)  # time to build each new level's executor


class Worker:
    """One GPU worker. ``executor_factory(level_id)`` builds (and loads) a level's executor."""

    def __init__(
        self,
        worker_id: str,
        queue: WorkQueue,
        executor_factory: Callable[[str], LevelExecutor],
        *,
        level: str | None = None,
        batch_size: int = 1,
        poll_s: float = 0.2,
        on_result: Callable[[WorkResult], None] | None = None,
        levels: Mapping[str, Any] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.worker_id = worker_id
        self.queue = queue
        self.executor_factory = executor_factory
        self.poll_s = poll_s
        self.on_result = on_result
        self.stats = WorkerStats()
        self._lock = threading.Lock()
        self._target_level = level
        self._target_batch = batch_size
        self._level: str | None = None
        self._batch = batch_size
        self._executors: dict[str, LevelExecutor] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.plan_version: int | None = None
        self.last_error: str | None = None
        self._thresholds: dict[str, float] = {}  # cascade light level -> planned threshold
        self.levels = dict(levels or {})  # level id -> ApproxLevel, to find AC siblings
        self._siblings: tuple[str, ...] = ()  # unserved AC levels of this worker's model
        self._turn = 0

    # -- control path ------------------------------------------------------------------------
    @property
    def level(self) -> str | None:
        """The level the worker is serving now (the target applies at the next batch)."""
        return self._level

    @property
    def target_level(self) -> str | None:
        return self._target_level

    def set_level(self, level_id: str | None, batch_size: int | None = None) -> None:
        """Serve ``level_id`` (None: idle) from the next batch on."""
        with self._lock:
            self._target_level = level_id
            if batch_size is not None:
                if batch_size < 1:
                    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
                self._target_batch = batch_size

    def apply_plan(self, plan: Any) -> None:
        """Follow a :class:`argusdiff.domain.Plan`: this worker's level, that level's batch size and,
        for a cascade light level, its discriminator threshold."""
        level = plan.assignment.get(self.worker_id)
        batch = plan.batch_sizes.get(level) if level is not None else None
        thresholds = getattr(plan, "thresholds", None) or {}
        siblings = plan.unserved_siblings(self.levels, level)
        with self._lock:
            self._thresholds = dict(thresholds)
            dropped = [lv for lv in self._siblings if lv not in siblings and lv != level]
            self._siblings = siblings
        self._release(dropped)
        self.plan_version = plan.version
        self.set_level(level, batch)

    @property
    def sibling_levels(self) -> tuple[str, ...]:
        """The unserved AC levels this worker also takes work for (see the module doc)."""
        return self._siblings

    def status(self) -> dict[str, Any]:
        ex = self._executors.get(self._level) if self._level else None
        registry = getattr(ex, "registry", None)
        return {
            "worker_id": self.worker_id,
            "level": self._level,
            "target_level": self._target_level,
            "batch_size": self._batch,
            "model": getattr(ex, "model", None),
            "plan_version": self.plan_version,
            "loaded_models": list(registry.loaded()) if registry is not None else [],
            "load_times_s": dict(registry.load_times) if registry is not None else {},
            "processed": self.stats.processed,
            "failed": self.stats.failed,
            "handed_off": self.stats.handed_off,
            "cancelled": self.stats.cancelled,
            "switches": self.stats.switches,
            "busy_s": self.stats.busy_s,
            "last_error": self.last_error,
        }

    def _sync_target(self) -> bool:
        """Adopt the target level; False when idle or the executor could not be built."""
        with self._lock:
            target, batch = self._target_level, self._target_batch
        self._batch = batch
        if target != self._level:
            if target is not None and target not in self._executors:
                t0 = time.perf_counter()
                try:
                    executor = self.executor_factory(target)
                    # Load the model now, so the switch cost is paid before taking work.
                    getattr(executor, "loaded", None)
                except Exception as exc:
                    self.last_error = f"cannot serve level {target!r}: {exc}"
                    log.error("worker %s: %s", self.worker_id, self.last_error)
                    with self._lock:
                        if self._target_level == target:
                            self._target_level = self._level
                    return self._level is not None
                self._executors = {target: executor}  # one level's executor at a time
                self.stats.switch_s.append(time.perf_counter() - t0)
            old, self._level = self._level, target
            self.stats.switches += 1
            if old is not None:
                self._release([old])
        if self._level is not None:
            with self._lock:
                t = self._thresholds.get(self._level)
            executor = self._executors.get(self._level)
            set_threshold = getattr(executor, "set_threshold", None)
            if t is not None and set_threshold is not None and getattr(executor, "threshold", None) != t:
                set_threshold(t)
        return self._level is not None

    def _release(self, levels: list[str]) -> None:
        """This worker's own queues of ``levels`` (it no longer serves them) go to the levels'
        shared queues (``WorkQueue.release``; a transport without per-worker queues has none)."""
        release = getattr(self.queue, "release", None)
        if release is None:
            return
        for lv in levels:
            try:
                n = release(lv, self.worker_id)
            except Exception as exc:  # the control loop re-queues them if this worker dies
                log.warning("worker %s: cannot release its queue of %s: %s", self.worker_id, lv, exc)
                continue
            if n:
                log.info("worker %s: %d item(s) of its own queue of %s released to the level", self.worker_id, n, lv)

    # -- data path ---------------------------------------------------------------------------
    def _take_batch(self, level: str, timeout: float | None = None) -> list[WorkItem]:
        first = self.queue.get(level, timeout=self.poll_s if timeout is None else timeout, worker=self.worker_id)
        if first is None:
            return []
        batch = [first]
        while len(batch) < self._batch:
            nxt = self.queue.get(level, timeout=0, worker=self.worker_id)
            if nxt is None:
                break
            batch.append(nxt)
        return batch

    def _publish(self, item: WorkItem, result: WorkResult) -> None:
        result = replace(result, worker_id=self.worker_id)
        if item.deadline_s is not None:
            finished = result.finished_s or time.time()
            # how late the request finished (0 when on time): SLO accounting, never a drop
            result = replace(result, timings={**result.timings, "late_s": max(0.0, finished - item.deadline_s)})
        if item.meta.get("deferred_from") and result.error is None:
            result = replace(result, deferred=True)  # the heavy level's redo of a cascade deferral
        self.queue.result(item.request_id, result)
        if result.handoff is not None:
            # Cascade: the light image was rejected; the router's policy decides what follows
            self.stats.handed_off += 1
        elif result.error_type == CANCELLED:
            self.stats.cancelled += 1
        elif result.error is not None:
            self.stats.failed += 1
        else:
            self.stats.processed += 1
        if self.on_result is not None and result.handoff is None:
            self.on_result(result)
        self.queue.ack(item)

    def run_once(self) -> int:
        """Take and run at most one batch; returns the number of requests handled."""
        if not self._sync_target():
            self._stop.wait(self.poll_s)
            return 0
        level = self._level
        assert level is not None
        level, items = self._next_batch(level)
        if not items:
            return 0
        if self._stop.is_set():
            for item in items:
                self.queue.nack(item)
            return 0
        try:
            executor = self._executor_for(level)
        except Exception as exc:
            log.error("worker %s: cannot serve sibling level %s: %s", self.worker_id, level, exc)
            for item in items:
                self.queue.nack(item)
            return 0
        check = getattr(self.queue, "cancelled", None)
        if check is not None:  # cancelled while queued (a cancel that missed the queue entry)
            items = self._skip_cancelled(items, check)
            if not items:
                return 0
        t0 = time.perf_counter()
        started = time.time()
        # the log lines about this batch carry its requests' ids (argusdiff.tracing)
        token = tracing.REQUEST_ID.set(",".join(i.meta.get(tracing.META_REQUEST_ID) or i.request_id for i in items))
        try:
            log.debug("worker %s: batch of %d at %s", self.worker_id, len(items), level)
            with cancels_from(check):
                results = run_batch(executor, items, run_with_edits)
            if len(results) != len(items):
                raise RuntimeError(f"executor returned {len(results)} results for {len(items)} requests")
        except Cancelled as exc:  # an executor that does not answer per request: the whole batch
            results = [cancelled_result(item, exc) for item in items]
        except Exception as exc:
            log.exception("worker %s: batch of %d on %s failed", self.worker_id, len(items), level)
            self.last_error = f"{type(exc).__name__}: {exc}"
            results = [WorkResult.failure(item, exc, worker_id=self.worker_id) for item in items]
        finally:
            tracing.REQUEST_ID.reset(token)
        self.stats.busy_s += time.perf_counter() - t0
        if tracing.enabled():
            self._trace(items, results, started, time.time())
        self.stats.batches += 1
        for item, result in zip(items, results, strict=True):
            self._publish(item, result)
        return len(items)

    def _trace(self, items: list[WorkItem], results: list[WorkResult], started: float, ended: float) -> None:
        """One span per item under its request's span: queue wait, then the phases the executor
        measured (cache lookup with the latent fetch, denoise, decode), laid end to end from the
        batch's start."""
        for item, result in zip(items, results, strict=True):
            t = result.timings
            phases = [("queue wait", item.enqueue_s or started, started)]
            at = started
            for name, dur in (("cache lookup", t.get("cache_lookup_s", 0.0) + t.get("latent_fetch_s", 0.0)),
                              ("denoise", t.get("denoise_s", 0.0)), ("decode", t.get("decode_s", 0.0))):  # fmt: skip
                if dur > 0:
                    phases.append((name, at, at + dur))
                    at += dur
            tracing.record_work(
                item.meta, phases, start_s=item.enqueue_s or started, end_s=ended,
                **{"argusdiff.level": result.level, "argusdiff.worker": self.worker_id or "",
                   "argusdiff.cache_hit": result.cache_hit, "argusdiff.k_used": result.k_used,
                   "argusdiff.error": result.error_type or ""},
            )  # fmt: skip

    def _skip_cancelled(self, items: list[WorkItem], check: Any) -> list[WorkItem]:
        """``items`` without the cancelled ones, whose (imageless) results are published at once."""
        try:
            gone = check([item.request_id for item in items])
        except Exception:  # the transport hiccuped: run them (a cancelled result is dropped)
            return items
        for item in items:
            if item.request_id in gone:
                self._publish(item, cancelled_result(item))
        return [item for item in items if item.request_id not in gone]

    def _next_batch(self, level: str) -> tuple[str, list[WorkItem]]:
        """The next batch: from this worker's level, or, with AC siblings, from its level and
        theirs in turn (none waits behind another's backlog), blocking on its own level last."""
        with self._lock:
            siblings = self._siblings
        if not siblings:
            return level, self._take_batch(level)
        order = (level, *siblings)
        self._turn = (self._turn + 1) % len(order)
        for j in range(len(order)):
            lv = order[(self._turn + j) % len(order)]
            items = self._take_batch(lv, timeout=0)
            if items:
                return lv, items
        return level, self._take_batch(level)

    def _executor_for(self, level: str) -> LevelExecutor:
        executor = self._executors.get(level)
        if executor is None:  # a sibling: same model, built once and kept while it stays one
            executor = self._executors[level] = self.executor_factory(level)
        return executor

    def run_forever(self) -> None:
        while not self._stop.is_set():
            self.run_once()

    def drain(self, max_batches: int = 1_000_000) -> int:
        """Run batches until this worker's queue is empty (tests, one-shot jobs)."""
        done = 0
        idle = 0
        for _ in range(max_batches):
            n = self.run_once()
            idle = idle + 1 if n == 0 else 0
            # what is left may wait in other workers' own queues (delivery PER_WORKER): not ours
            if n == 0 and (self._level is None or self.queue.qsize(self._level) == 0 or idle >= 3):
                break
            done += n
        return done

    def start(self) -> Worker:
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self.run_forever, name=f"worker-{self.worker_id}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        self._stop.set()
        wake = getattr(self.queue, "wake", None)
        if wake is not None:
            wake()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._level is not None:
            self._release([self._level, *self._siblings])
