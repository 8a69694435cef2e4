"""The service's worker: :class:`workers.loop.Worker` plus heartbeats, plan following and
resilience to an unreachable queue.

A :class:`ServiceWorker` runs wherever a GPU is (in the router's process in embedded mode, or as
``argusdiff worker --redis ...`` on any machine). It

* heartbeats every ``heartbeat_s`` into the :class:`~argusdiff.service.transport.protocol.ControlStore`
  (level, the level it is loading, items done) from its own thread, so a long model load or batch
  never makes it look dead;
* reads the published plan on each heartbeat and hands it to the worker loop, which switches
  level at the next batch boundary (no restart, nothing taken is dropped) and pushes the plan's
  cascade threshold into the running light-level executor (the heartbeat reports the threshold
  applied, ``threshold``);
* keeps going when the queue (Redis) fails: backs off (exponentially from
  :data:`RECONNECT_BASE_S` to :data:`RECONNECT_CAP_S`, each wait drawn from [w/2, w], "equal
  jitter", so the hundreds of workers that lost one Redis together do not all retry in the same
  instant), and once the queue answers again gives back whatever it had taken but not finished
  (its pending entries), so nothing waits for the long re-claim timeout.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from workers.loop import Worker
from workers.messages import LevelExecutor
from workers.progress import events_to

__all__ = ["ServiceWorker", "wait_until"]

log = logging.getLogger("argusdiff.worker")

LevelFactory = Callable[[str], LevelExecutor]  # e.g. workers.executor.ExecutorFactory

#: A worker whose queue failed waits about this long before it tries again (s), doubling per
#: failure up to :data:`RECONNECT_CAP_S`; each wait is drawn uniformly from [w/2, w].
RECONNECT_BASE_S = 0.1
RECONNECT_CAP_S = 5.0


class ServiceWorker:
    def __init__(
        self,
        worker_id: str,
        queue: Any,
        store: Any,
        executor_factory: LevelFactory,
        *,
        heartbeat_s: float = 1.0,
        ttl_s: float = 5.0,
        poll_s: float = 0.2,
        level_ids: tuple[str, ...] = (),
    ) -> None:
        self.worker_id = worker_id
        self.queue = queue
        self.store = store
        self.worker = Worker(
            worker_id, queue, executor_factory, poll_s=poll_s, levels=getattr(executor_factory, "levels", None)
        )
        self.heartbeat_s = heartbeat_s
        self.ttl_s = ttl_s
        self.level_ids = level_ids
        self.plan_version: int | None = None
        self.errors = 0
        self.started_s = time.time()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._rng = random.Random()  # each worker draws its own reconnect waits
        self._backoff_s = RECONNECT_BASE_S
        self._pause = self._stop.wait  # returns True when stopped

    @property
    def level(self) -> str | None:
        return self.worker.level

    # -- plan and heartbeat ----------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        w = self.worker
        target = w.target_level
        return {
            "level": w.level,
            "loading": target if target is not None and target != w.level else None,
            "resident": list(w.status().get("loaded_models") or []),
            "done": w.stats.processed,
            "failed": w.stats.failed,
            "cancelled": w.stats.cancelled,
            "plan_version": self.plan_version,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_s": self.started_s,
            "last_error": w.last_error,
            "threshold": self.applied_threshold(),
        }

    def applied_threshold(self) -> float | None:
        """The discriminator threshold the executor of the level served now applies (a cascade's
        light level; None for any other executor). The plan's ``thresholds`` reach it at the
        worker loop's next batch boundary, without a restart."""
        w = self.worker
        executor = getattr(w, "_executors", {}).get(w.level) if w.level is not None else None
        t = getattr(executor, "threshold", None)
        return float(t) if t is not None else None

    def heartbeat_once(self) -> None:
        """One heartbeat and plan read; store failures are counted, never fatal."""
        try:
            self.store.beat(self.worker_id, self.info(), self.ttl_s)
            read_for = getattr(self.store, "read_plan_for", None)  # Redis: this worker's slice only
            plan = read_for(self.worker_id) if read_for is not None else self.store.read_plan()
        except Exception as exc:  # the store (Redis) is down: keep serving with what we have
            self.errors += 1
            log.warning("worker %s: heartbeat failed: %s", self.worker_id, exc)
            return
        if plan is not None and plan.version != self.plan_version and self.worker_id in plan.assignment:
            # a worker the plan does not list yet stays idle until a plan includes it
            self.plan_version = plan.version
            self.worker.apply_plan(plan)

    def _heartbeat_loop(self) -> None:
        while not self._stop.is_set():
            self.heartbeat_once()
            self._stop.wait(self.heartbeat_s)

    # -- work ------------------------------------------------------------------------------

    def _give_back_pending(self) -> bool:
        """After a queue failure: re-queue entries this worker took but did not finish."""
        requeue = getattr(self.queue, "requeue_consumer", None)
        if requeue is None:
            return True
        try:
            for lv in self.level_ids:
                requeue(lv, getattr(self.queue, "consumer", self.worker_id))
            return True
        except Exception:
            return False

    def reconnect_wait(self) -> float:
        """The next wait before trying the queue again: jittered, doubling up to the cap."""
        wait = self._backoff_s * (0.5 + self._rng.random() / 2)
        self._backoff_s = min(RECONNECT_CAP_S, self._backoff_s * 2)
        return wait

    def step(self) -> int:
        try:
            done = self.worker.run_once()
        except Exception as exc:  # the queue failed mid-batch (e.g. Redis restarting)
            self.errors += 1
            log.warning("worker %s: queue unavailable: %s", self.worker_id, exc)
            while not self._pause(self.reconnect_wait()):
                if self._give_back_pending():
                    break
            return 0
        self._backoff_s = RECONNECT_BASE_S
        return done

    def run(self) -> None:
        """Run until :meth:`stop` (blocking)."""
        hb = threading.Thread(target=self._heartbeat_loop, name=f"hb-{self.worker_id}", daemon=True)
        hb.start()
        self._threads.append(hb)
        try:
            # step events of streamed requests go back through the queue (workers.progress)
            with events_to(getattr(self.queue, "publish_event", None)):
                while not self._stop.is_set():
                    self.step()
        finally:
            # leaving is best effort: the heartbeat expires anyway
            with contextlib.suppress(Exception):
                self.store.leave(self.worker_id)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name=f"svc-worker-{self.worker_id}", daemon=True)
        t.start()
        self._threads.append(t)
        return t

    def stop(self, timeout: float | None = 10.0) -> None:
        self._stop.set()
        self.worker.stop(timeout=0)  # sets its stop flag and wakes a blocked get
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until true or ``timeout`` (tests and tools, never the data path)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
