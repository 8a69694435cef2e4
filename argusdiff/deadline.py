"""One deadline and one finish-time estimate for routing and admission.

A request's **deadline** is ``arrival + deadline_factor × SLO`` (``[admission] deadline_factor``;
the router and the simulator put the factor in :attr:`RouteView.deadline_factor`, so a policy routes
to the deadline admission judges). A path's **finish estimate** on a worker is

    finish = max(now, busy_until[w]) + service time of the path

where ``busy_until`` is the data path's view of when the worker has finished its queued work
(:class:`argusdiff.policies.base.RouteView`), and the worker is the one of the path's serving workers
that frees first: the level's queue is pulled by its workers, so the first free one takes the
request (the simulator places it there, the service's workers pull it).

A policy that routes by deadline (argus+) returns its verdict with the assignment: a
:class:`DeadlineVerdict` of kind :class:`Timeliness` (on time on the drawn path, escalated to
another path that is on time, or late on every allowed path) and the estimate it judged by; an
escalated or a late request's assignment is :func:`moved_by_deadline`'s (argus+'s ladder and
unified routings alike). Admission (:mod:`argusdiff.admission`) takes that verdict as its test:
it never refuses a request the policy routed to be on time, and refuses a late one, i.e. one that
no allowed path finishes in time. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from argusdiff.domain import Assignment, DeadlineVerdict, Outcome, RouteReason, Timeliness

__all__ = ["DeadlineVerdict", "Timeliness", "deadline_s", "earliest_finish", "finish_s", "moved_by_deadline"]


def deadline_s(arrival_s: float, slo_s: float, factor: float = 1.0) -> float:
    """The deadline of a request that arrived at ``arrival_s`` with ``slo_s``."""
    return arrival_s + factor * slo_s


def finish_s(now_s: float, busy_until_s: float, service_s: float) -> float:
    """The estimated finish of a request of ``service_s`` on a worker busy until ``busy_until_s``."""
    return max(now_s, busy_until_s) + service_s


def earliest_finish(
    workers: Iterable[str], busy_until: Mapping[str, float], now_s: float, service_s: float
) -> tuple[str | None, float]:
    """The worker of ``workers`` that frees first and the request's finish estimate on it
    (``(None, inf)`` without a worker). Ties go to the first worker given."""
    best: str | None = None
    best_t = math.inf
    for w in workers:
        t = busy_until.get(w, now_s)
        t = t if t > now_s else now_s  # max(now_s, t), as max picks
        if t < best_t:
            best_t, best = t, w
            if t == now_s:
                break  # free now: no later worker frees earlier (ties go to the first)
    return best, best_t + service_s


def moved_by_deadline(
    kind: Timeliness,
    level: str,
    worker: str | None,
    optimal_level: str | None,
    finish: float,
    deadline: float,
    *,
    to: str = "another path",
) -> Assignment:
    """The assignment of a request that would finish late on its drawn path, with its verdict:
    :attr:`Timeliness.ESCALATED`, moved to ``level``, which finishes it in time (``to``: where, in
    words, e.g. "a faster level"); :attr:`Timeliness.LATE`, late on every path, served best effort
    at ``level``. ``finish``: the estimate at ``level``; ``deadline``: the request's."""
    verdict = DeadlineVerdict(kind, finish, deadline)
    if kind is Timeliness.ESCALATED:
        return Assignment(
            level=level,
            worker=worker,
            optimal_level=optimal_level,
            reason=f"deadline: moved to {to}",
            verdict=verdict,
            outcome=Outcome.ESCALATED,
            cause=RouteReason.DEADLINE_MOVED,
        )
    if kind is not Timeliness.LATE:
        raise ValueError(f"moved_by_deadline: {kind!r} is not a move (ESCALATED or LATE)")
    return Assignment(
        level=level,
        worker=worker,
        optimal_level=optimal_level,
        best_effort=True,
        reason="deadline cannot be met",
        verdict=verdict,
        cause=RouteReason.DEADLINE_LATE,
    )
