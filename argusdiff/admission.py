"""Admission: the mechanism applied after any policy's ``route``, the same in the service and the
simulator.

A policy decides *where* a request goes (level, worker) or drops it. Admission decides, after
that, whether the request enters the queue at all:

* **Definitely late** (TetriServe's test): the request cannot finish by its deadline at the level
  it may take, given the backlog there. The level's queue is pulled by its workers (FIFO, greedy
  batches of up to the plan's batch size ``b``), so the level's ``queued`` requests (in service
  included) spread evenly over its ``workers`` and the request lands behind the least loaded one,
  which holds ``q = queued // workers``. That worker has a batch of ``min(q, b)`` in service,
  counted whole (the router does not see batches start, so this is the bound for an in-service
  batch that just began), then the rest and the request itself in batches of ``b``::

      finish = now + latency(min(q, b)) + (q + 1 − min(q, b)) in batches of b   (q > 0)
      finish = now + latency(1)                                                 (q = 0: a free worker)

  With the profile's latencies this is the latest the request finishes when nothing else goes
  wrong (no model load, no overhead). A request with ``finish > arrival + deadline_factor × SLO``
  is refused at once.
* **Queue cap**: a level holding ``queue_cap × workers`` requests (queued or in service) refuses
  more, whatever the estimate says (a backstop for an estimate that is off).

The level a request "may take" is the level its policy chose: a policy that can move a request
(argus+ moves a request that would be late to a faster level) has done so in ``route``; admission
never re-routes, because the policy owns every routing decision. Such a policy returns its deadline
verdict with the assignment (:class:`~argusdiff.domain.DeadlineVerdict`, judged with
:mod:`argusdiff.deadline`'s finish estimate against the same deadline, ``arrival +
deadline_factor × SLO``): admission then takes the verdict as its test. It never refuses a request
the policy routed to be on time (neither the estimate above nor the cap second-guess it), and it
refuses one that no allowed path finishes in time. A level that no worker serves
(the request waits for the next plan) is judged by the cap only: nothing says when it will run.

A refusal carries ``retry_after_s``, the time until the backlog has drained enough for a request
arriving then to be admitted (no new arrivals assumed), so the service's ``Retry-After`` follows
the backlog instead of a constant.

The live router (:class:`argusdiff.service.router.Router`) and the simulator
(:class:`argusdiff.simulator.engine.Simulator`) both call :meth:`Admission.check` right after
``policy.route``. The backlog each passes is "requests routed to the level and not finished": the
router's in-flight count of the level, the simulator's queued requests of the workers serving it.
Pure: no I/O, no clock, no service imports.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from argusdiff.domain import ApproxLevel, DeadlineVerdict, Plan, Refusal
from argusdiff.errors import ConfigError

__all__ = ["ADMITTED", "Admission", "AdmissionConfig", "Decision", "serving_workers"]

ADMIT_REASON = Refusal.NONE
LATE = Refusal.LATE
CAPPED = Refusal.CAPPED


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """The mechanism's knobs (``[admission]`` in the configuration; ``SimConfig.admission``).

    ``enabled``: refuse at all. ``queue_cap``: most requests queued or in service per worker of a
    level (0: no cap). ``deadline_factor``: a request is definitely late when its estimated finish
    is after ``arrival + deadline_factor × SLO``. ``max_retry_after_s``: the largest
    ``Retry-After`` sent. ``time_scale``: multiplier on the profiled latencies in the estimate
    (1; the service's stand-in TEST MODE sets its ``stand_in_scale``, the speed its workers run at).
    """

    enabled: bool = True
    queue_cap: int = 64
    deadline_factor: float = 0.8
    max_retry_after_s: float = 60.0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"admission: enabled must be true or false, got {self.enabled!r}")
        if isinstance(self.queue_cap, bool) or not isinstance(self.queue_cap, int) or self.queue_cap < 0:
            raise ConfigError(f"admission: queue_cap must be an integer >= 0 (0: no cap), got {self.queue_cap!r}")
        for name in ("deadline_factor", "max_retry_after_s", "time_scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and v > 0):
                raise ConfigError(f"admission: {name} must be a positive number, got {v!r}")
        if self.max_retry_after_s < 1:
            raise ConfigError(f"admission: max_retry_after_s must be >= 1, got {self.max_retry_after_s!r}")

    def describe(self) -> str:
        if not self.enabled:
            return "off"
        cap = f"cap {self.queue_cap}/worker" if self.queue_cap else "no cap"
        return f"on (definitely late at {self.deadline_factor:g} x SLO, {cap})"


@dataclass(frozen=True, slots=True)
class Decision:
    """Admission's answer for one request: admitted, or refused with a reason and the seconds
    until a request like it would be admitted."""

    admitted: bool
    reason: Refusal = ADMIT_REASON  # a value (its text is the refusal's name for clients and metrics)
    retry_after_s: float = 0.0
    finish_s: float = math.nan  # estimated finish (nan: not estimated)


ADMITTED = Decision(True)


def serving_workers(
    plan: Plan, levels: Mapping[str, ApproxLevel], level_id: str, up: Collection[str] | None = None
) -> tuple[str, ...]:
    """The workers that serve ``level_id`` under ``plan`` (only those in ``up`` when given): the
    ones planned at it, else — for a level the plan gives no worker — the ones at an AC sibling
    that serves its queue too (:meth:`~argusdiff.domain.Plan.unserved_siblings`)."""
    own = tuple(w for w, lv in plan.assignment.items() if lv == level_id and (up is None or w in up))
    if own or level_id in plan.assignment.values():
        return own
    target = levels.get(level_id)
    if target is None:
        return ()
    out = []
    for w, lv in plan.assignment.items():
        if lv is None or (up is not None and w not in up):
            continue
        mine = levels.get(lv)
        if mine is not None and mine.shares_worker_with(target):
            out.append(w)
    return tuple(out)


def _finish_after(lat: tuple[float, ...], q: int) -> float:
    """Seconds until a request placed behind ``q`` requests of one worker finishes: the batch in
    service (``min(q, b)`` requests) counted whole, then the rest and the request in batches of
    ``b``; ``lat[k - 1]`` is ``latency(k)``."""
    b = len(lat)
    first = min(q, b)
    full, rest = divmod(q + 1 - first, b)
    return (lat[first - 1] if first else 0.0) + full * lat[-1] + (lat[rest - 1] if rest else 0.0)


def _most_admitted(lat: tuple[float, ...], workers: int, budget: float) -> int:
    """The largest ``queued`` with ``_finish_after(lat, queued // workers) <= budget`` (−1: none):
    ``_finish_after`` rises with ``q``, so a doubling then a bisection finds the last ``q`` that fits."""
    fits = lambda q: _finish_after(lat, q) <= budget + 1e-9  # noqa: E731
    if not fits(0):
        return -1
    hi = 1
    while fits(hi):
        if hi > 1 << 40:  # latencies of 0: nothing is ever late
            return (hi + 1) * workers - 1
        hi *= 2
    lo = hi // 2  # fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return (lo + 1) * workers - 1


class Admission:
    """Admission for one deployment: ``check`` is called once per request (per image) after the
    policy routed it. Holds nothing per request; caches the serving workers per plan."""

    def __init__(self, levels: Mapping[str, ApproxLevel], config: AdmissionConfig | None = None) -> None:
        self.levels = levels
        self.config = config or AdmissionConfig()
        self._plan: Plan | None = None
        self._serving: dict[str, tuple[str, ...]] = {}
        self._times: dict[str, tuple[float, ...]] = {}  # level -> latency(1..b) at the workers' speed

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def workers(self, plan: Plan, level_id: str, up: Collection[str] | None = None) -> tuple[str, ...]:
        """:func:`serving_workers`, cached per plan object; filtered by ``up`` when given."""
        self._for(plan)
        ws = self._serving.get(level_id)
        if ws is None:
            ws = self._serving[level_id] = serving_workers(plan, self.levels, level_id)
        if up is None:
            return ws
        return tuple(w for w in ws if w in up)

    def _for(self, plan: Plan) -> None:
        if self._plan is not plan:
            self._plan = plan
            self._serving = {}
            self._times = {}

    def check(
        self,
        level_id: str,
        *,
        plan: Plan,
        queued: int,
        workers: int,
        now_s: float,
        arrival_s: float,
        slo_s: float,
        verdict: DeadlineVerdict | None = None,
    ) -> Decision:
        """Admit or refuse one request routed to ``level_id``. ``queued``: requests routed to the
        level and not finished (in service included; for an ``n > 1`` request, its images already
        admitted count); ``workers``: workers serving the level now; ``verdict``: the policy's
        deadline judgement, when it gives one (the test then, see the module doc)."""
        cfg = self.config
        if not cfg.enabled:
            return ADMITTED
        if verdict is not None:
            if verdict.on_time:
                return Decision(True, ADMIT_REASON, 0.0, verdict.finish_s)
            # late on every allowed path: come back once the backlog has drained by the overrun
            return Decision(False, LATE, self._retry(verdict.finish_s - verdict.deadline_s), verdict.finish_s)
        lat = self._latencies(plan, level_id)
        if lat is None:
            return ADMITTED
        per_item = lat[-1] / len(lat)  # at full batches
        queued = max(0, int(queued))
        if workers <= 0:
            # no worker serves it yet (waits for the next plan): no estimate, the cap of one worker
            if cfg.queue_cap and queued >= cfg.queue_cap:
                return Decision(False, CAPPED, self._retry(per_item * (queued - cfg.queue_cap + 1)))
            return ADMITTED
        finish = now_s + _finish_after(lat, queued // workers)
        if finish > arrival_s + cfg.deadline_factor * slo_s + 1e-9:
            # retry once the backlog has drained to the most a request arriving then can wait behind
            fits = _most_admitted(lat, workers, cfg.deadline_factor * slo_s)
            if fits < 0:
                return Decision(False, LATE, self._retry(cfg.max_retry_after_s), finish)
            return Decision(False, LATE, self._retry((queued - fits) * per_item / workers), finish)
        cap = cfg.queue_cap * workers
        if cfg.queue_cap and queued >= cap:
            return Decision(False, CAPPED, self._retry((queued - cap + 1) * per_item / workers), finish)
        return Decision(True, ADMIT_REASON, 0.0, finish)

    def image_interval(self, level_id: str, *, plan: Plan, workers: int) -> float:
        """Seconds between two images finishing at ``level_id`` when ``workers`` serve it at full
        batches (0.0: unknown level or no worker): how fast its backlog drains."""
        lat = self._latencies(plan, level_id)
        if lat is None or workers <= 0:
            return 0.0
        return lat[-1] / len(lat) / workers

    def most_admitted(self, level_id: str, *, plan: Plan, workers: int, slo_s: float) -> int:
        """The largest backlog (``queued``) of ``level_id`` served by ``workers`` at which a request
        arriving now with ``slo_s`` passes the deadline test (−1: none does, the level is too slow
        for the SLO). Monitoring and tests read the bound here; :meth:`check` applies it."""
        lat = self._latencies(plan, level_id)
        if lat is None or workers <= 0:
            return -1
        return _most_admitted(lat, workers, self.config.deadline_factor * slo_s)

    def _latencies(self, plan: Plan, level_id: str) -> tuple[float, ...] | None:
        """``latency(1..b)`` of the level at the workers' speed (``b``: the plan's batch size);
        None for a level the profile does not know."""
        self._for(plan)
        lat = self._times.get(level_id)
        if lat is None:
            level = self.levels.get(level_id)
            if level is None:
                return None
            b = max(1, int(plan.batch_sizes.get(level_id, 1))) if plan.batch_sizes else 1
            # the measured latencies the plan was made with (argusdiff.latency), else the profile's
            scale = self.config.time_scale * plan.latency_scale.get(level_id, 1.0)
            lat = self._times[level_id] = tuple(level.latency(k) * scale for k in range(1, b + 1))
        return lat

    def _retry(self, seconds: float) -> float:
        if not math.isfinite(seconds):  # no serving worker frees up (every one down): the longest wait
            return self.config.max_retry_after_s
        return min(self.config.max_retry_after_s, max(1.0, math.ceil(max(0.0, seconds))))
