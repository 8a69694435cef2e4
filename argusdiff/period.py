"""What the data path observes in one control period, going up to the control path: one immutable
:class:`PeriodStats`, built by one :class:`PeriodAccumulator`, and the one builder of the
:class:`argusdiff.domain.ClusterStats` a policy plans on (:func:`cluster_stats`).

The live router counts its requests with an accumulator and the control loop takes a period's
value from it; under several routers each adds its counts to the cluster's (``PeriodStats.counts``
through Redis, :class:`argusdiff.service.cluster.ClusterBus`), so the leader plans on every
router's arrivals, affinity, tier mix and cache lookups; its ``latency_scale`` pools every router's
measurements (their heartbeats, :class:`argusdiff.service.cluster.ClusterRouterView`). The
simulator counts with the same accumulator. A new observation is a field here, its count in the
accumulator, and its reading in :func:`cluster_stats`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from argusdiff.domain import ClusterStats, PlanTrigger

__all__ = ["PeriodAccumulator", "PeriodStats", "cluster_stats"]


@dataclass(frozen=True, slots=True)
class PeriodStats:
    """The traffic of one control period (or of several routers' periods, summed)."""

    arrivals: int = 0  # requests that arrived (admitted or refused)
    affinity: Mapping[str, int] = field(default_factory=dict)  # H counts: optimal level id -> prompts
    level_arrivals: Mapping[str, int] = field(default_factory=dict)  # level routed to -> requests
    tier_arrivals: Mapping[str, int] = field(default_factory=dict)  # SLO tier -> requests
    cache_lookups: int = 0
    cache_hits: int = 0
    # each arrival's own time, in the order counted (None: not known, e.g. other routers' arrivals);
    # the demand predictor's bins come from them when they are all of the period's arrivals
    arrival_times: tuple[float, ...] | None = None
    # level id -> measured batch latency / profiled when the period closed (argusdiff.latency)
    latency_scale: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def make_empty(cls) -> PeriodStats:
        return cls()

    @property
    def cache_hit_rate(self) -> float | None:
        """The share of the period's cache lookups that hit (None: no lookup)."""
        return self.cache_hits / self.cache_lookups if self.cache_lookups else None

    def __add__(self, other: PeriodStats) -> PeriodStats:
        """Both periods' counts; arrival times when both know them; this one's latencies, else the other's."""
        times = None
        if self.arrival_times is not None and other.arrival_times is not None:
            times = (*self.arrival_times, *other.arrival_times)
        return PeriodStats(
            arrivals=self.arrivals + other.arrivals,
            affinity=_sum(self.affinity, other.affinity),
            level_arrivals=_sum(self.level_arrivals, other.level_arrivals),
            tier_arrivals=_sum(self.tier_arrivals, other.tier_arrivals),
            cache_lookups=self.cache_lookups + other.cache_lookups,
            cache_hits=self.cache_hits + other.cache_hits,
            arrival_times=times,
            latency_scale=dict(self.latency_scale or other.latency_scale),
        )

    def counts(self) -> dict[str, int]:
        """The counts as flat named integers (what routers add up in Redis; zeros left out)."""
        out: dict[str, int] = {}
        if self.arrivals:
            out["arrivals"] = int(self.arrivals)
        for prefix, counts in (("h:", self.affinity), ("l:", self.level_arrivals), ("t:", self.tier_arrivals)):
            out.update({prefix + k: int(n) for k, n in counts.items() if n})
        if self.cache_lookups:
            out["c:lookups"] = int(self.cache_lookups)
        if self.cache_hits:
            out["c:hits"] = int(self.cache_hits)
        return out

    @classmethod
    def from_counts(cls, counts: Iterable[tuple[str, int]]) -> PeriodStats:
        """The inverse of :meth:`counts` (pairs of a name and a count; a name may repeat)."""
        arrivals = lookups = hits = 0
        by: dict[str, Counter[str]] = {"h:": Counter(), "l:": Counter(), "t:": Counter()}
        for name, value in counts:
            if name == "arrivals":
                arrivals += value
            elif name == "c:lookups":
                lookups += value
            elif name == "c:hits":
                hits += value
            elif name[:2] in by:
                by[name[:2]][name[2:]] += value
        return cls(arrivals, dict(by["h:"]), dict(by["l:"]), dict(by["t:"]), lookups, hits)

    def minus(self, other: PeriodStats) -> PeriodStats:
        """The counts of this period less ``other``'s (none below 0): another router's part of a sum."""
        return PeriodStats.from_counts(
            (k, n - other.counts().get(k, 0)) for k, n in self.counts().items() if n > other.counts().get(k, 0)
        )


def _sum(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    out = dict(a)
    for k, n in b.items():
        out[k] = out.get(k, 0) + n
    return out


class PeriodAccumulator:
    """Counts one period's traffic as it happens; :meth:`take` closes the period (one writer: the
    router's event loop, or the simulator)."""

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.arrivals = 0
        self.affinity: Counter[str] = Counter()
        self.level_arrivals: Counter[str] = Counter()
        self.tier_arrivals: Counter[str] = Counter()
        self.cache_lookups = 0
        self.cache_hits = 0
        self.arrival_times: list[float] = []

    def arrived(self, now_s: float, n: int, tier: str) -> None:
        """``n`` requests of ``tier`` arrived at ``now_s`` (admitted or refused)."""
        self.arrivals += n
        self.tier_arrivals[tier] += n
        self.arrival_times.extend([now_s] * n)

    def classified(self, optimal: str, n: int = 1) -> None:
        """The classifier read ``n`` prompts' optimal level as ``optimal`` (affinity H)."""
        self.affinity[optimal] += n

    def routed(self, level: str) -> None:
        """One request routed to ``level``."""
        self.level_arrivals[level] += 1

    def looked_up(self, hit: bool) -> None:
        """One cache lookup, a hit or a miss."""
        self.cache_lookups += 1
        self.cache_hits += bool(hit)

    def forget_before(self, horizon_s: float) -> None:
        """Drop arrival times before ``horizon_s`` (no control loop takes them, e.g. a follower)."""
        times = self.arrival_times
        k = 0
        while k < len(times) and times[k] < horizon_s:
            k += 1
        if k:
            del times[:k]

    def add(self, stats: PeriodStats) -> None:
        """Count ``stats`` in this period too (a period given back, or counted elsewhere)."""
        self.arrivals += stats.arrivals
        self.affinity.update(stats.affinity)
        self.level_arrivals.update(stats.level_arrivals)
        self.tier_arrivals.update(stats.tier_arrivals)
        self.cache_lookups += stats.cache_lookups
        self.cache_hits += stats.cache_hits
        if stats.arrival_times:
            self.arrival_times[:0] = stats.arrival_times

    def peek(self, latency_scale: Mapping[str, float] | None = None) -> PeriodStats:
        """The period so far, as a value; the period goes on (a look inside it:
        :attr:`~argusdiff.domain.PlanTrigger.CHECK`)."""
        return PeriodStats(
            arrivals=self.arrivals,
            affinity=dict(self.affinity),
            level_arrivals=dict(self.level_arrivals),
            tier_arrivals=dict(self.tier_arrivals),
            cache_lookups=self.cache_lookups,
            cache_hits=self.cache_hits,
            arrival_times=tuple(self.arrival_times),
            latency_scale=dict(latency_scale or {}),
        )

    def take(self, latency_scale: Mapping[str, float] | None = None, *, times: bool = True) -> PeriodStats:
        """The period so far, as a value, and a new period begins. ``times=False``: its counts only;
        the arrival times stay for the period's close (a router's counts going to the cluster's
        between ticks)."""
        if not times:
            kept = self.arrival_times
            out = replace(self.take(latency_scale), arrival_times=None)
            self.arrival_times = kept
            return out
        out = self.peek(latency_scale)
        self._clear()
        return out


def cluster_stats(
    period: PeriodStats,
    *,
    now_s: float,
    period_s: float,
    bin_s: float | None,
    reason: PlanTrigger = PlanTrigger.PERIOD,
    with_cache: bool = True,
    **observed,
) -> ClusterStats:
    """What a policy plans on: ``period``'s traffic and the cluster's state (``observed``: the
    workers, their queues, levels, loads and the cache's health, as :class:`ClusterStats` names
    them). A closed period's arrivals are binned for the demand predictor (``bin_s``; when its
    arrival times are all of its arrivals); ``with_cache``: whether the plan reads the cache's hit
    rate (else None). A look inside the period (``CHECK``) is binned alike, from the period's start.
    """
    from argusdiff.predictors import arrival_bins

    bins: tuple[int, ...] = ()
    width = 0.0
    times = period.arrival_times
    closed = reason in (PlanTrigger.PERIOD, PlanTrigger.CHECK)
    if closed and bin_s and times is not None and len(times) == period.arrivals:
        bins, width = arrival_bins(times, now_s - period_s, period_s, bin_s)
    return ClusterStats(
        now_s=now_s,
        period_s=period_s,
        arrivals=int(period.arrivals),
        affinity=dict(period.affinity),
        level_arrivals=dict(period.level_arrivals),
        tier_arrivals=dict(period.tier_arrivals),
        cache_hit_rate=period.cache_hit_rate if with_cache else None,
        latency_scale=dict(period.latency_scale),
        arrival_bins=bins,
        bin_s=width,
        reason=reason,
        **observed,
    )
