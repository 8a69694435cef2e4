"""Plain shared types of argusdiff: levels, profiles, requests, plans.

This is the one module the subsystem packages (``solver``, ``cache``, ``workers``,
``classifiers``, ``traces``) may import from ``argusdiff``. It depends on the standard
library only, so importing it is cheap and can never form a cycle.

Conventions (ARGUS §4): approximation levels are ordered **slowest/best first**
(index 0 is v1, the full-quality level; the last index is the fastest level).
Times are seconds, rates are queries per minute (QPM) unless a name says otherwise.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

__all__ = [
    "DEFAULT_TIER_SLO",
    "FEATURE_CACHE_METHODS",
    "TIER_PRIORITY",
    "AdapterSpec",
    "ApproxLevel",
    "Assignment",
    "CascadeSpec",
    "ClusterStats",
    "DeadlineVerdict",
    "Delivery",
    "Outcome",
    "Plan",
    "PlanRoute",
    "PlanTrigger",
    "Profile",
    "Refusal",
    "Request",
    "RouteReason",
    "Strategy",
    "Tier",
    "Timeliness",
    "level_catalogue",
    "tier_rank",
]


class Strategy(enum.StrEnum):
    """How a level approximates the best level."""

    AC = "ac"  # approximate caching: resume from a cached latent, skip K of N steps
    SM = "sm"  # smaller (or distilled) model
    CASCADE = "cascade"  # light model judged by a discriminator, heavy model on deferral

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.value


class Delivery(enum.Enum):
    """How an accepted request reaches a worker: each policy declares its source's
    (``Policy.delivery``; docs/baselines.md gives the sources).

    * ``SHARED`` — the level's one queue, pulled by every worker serving the level: the request
      starts on whichever of them frees up first (earliest start).
    * ``PER_WORKER`` — the queue of the worker the policy picked (``Assignment.worker``): the
      request waits there behind that worker's own backlog, as Proteus's ``canary_routing`` puts it
      on one device's queue; another worker takes it only when that one is gone (its queue is
      re-queued to the level's shared queue)."""

    SHARED = "shared"
    PER_WORKER = "per-worker"

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.value


class Tier(enum.StrEnum):
    """Per-request service tiers (after Nitsum): they set the default SLO multiplier."""

    INTERACTIVE = "interactive"
    STANDARD = "standard"
    BATCH = "batch"


#: Pull order of the tiers at a level, highest priority first: the :class:`Tier` order. A worker
#: takes queued work of the first tier that has any (FIFO within a tier), in the simulator and in
#: both work queues of the service (one decision path).
TIER_PRIORITY: tuple[str, ...] = tuple(t.value for t in Tier)
_TIER_RANK: dict[str, int] = {name: k for k, name in enumerate(TIER_PRIORITY)}
#: Each tier's default SLO multiplier on the deployment SLO (a request without its own SLO): batch
#: work tolerates 4x the delay. The one table the simulator, the replay, the bound, the unified
#: planner's tier deadlines and ``[replay] tier_slo_factors`` default to.
DEFAULT_TIER_SLO: dict[str, float] = {Tier.INTERACTIVE.value: 1.0, Tier.STANDARD.value: 1.0, Tier.BATCH.value: 4.0}


def tier_rank(tier: str | None) -> int:
    """The pull rank of ``tier`` (0 is pulled first). A request with no tier, or one the
    :class:`Tier` enum does not name, ranks as ``standard``, the tier of untiered traffic."""
    rank = _TIER_RANK.get(str(tier)) if tier is not None else None
    return rank if rank is not None else _TIER_RANK[Tier.STANDARD.value]


#: Feature caches a level may name (``feature_cache.method``) and the diffusers config class each
#: stands for (``diffusers.hooks``; applied with the denoiser's ``enable_cache``).
FEATURE_CACHE_METHODS = {
    "first_block": "FirstBlockCacheConfig",
    "faster": "FasterCacheConfig",
    "mag": "MagCacheConfig",
    "taylorseer": "TaylorSeerCacheConfig",
    "pyramid_attention_broadcast": "PyramidAttentionBroadcastConfig",
}


@dataclass(frozen=True, slots=True)
class ApproxLevel:
    """One approximation level v_i of a deployment (ARGUS §4.2).

    ``latency_s`` maps a batch size to the profiled execution time of one batch (seconds).
    ``quality`` is the profiled mean quality relative to the deployment's best level (0..1].
    """

    id: str
    strategy: Strategy
    model: str
    steps: int
    skip: int
    latency_s: Mapping[int, float]
    quality: float
    load_time_s: float
    peak_qpm_override: float | None = None
    description: str = ""
    memory_gb: float | None = None  # GPU memory the level's model holds while loaded
    estimated: tuple[str, ...] = ()  # fields whose value is an estimate, not from the profile's sources
    # a feature cache the level's runs apply to the loaded model's denoiser ({"method": ..., params});
    # None: none. Such a level is an AC level with K = 0: switching to it loads nothing.
    feature_cache: Mapping[str, Any] | None = None

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.latency_s))

    def latency(self, batch: int = 1) -> float:
        """Profiled execution time of one batch of ``batch`` requests (seconds).

        Batch sizes between profiled points are interpolated linearly; above the largest
        profiled size the time grows linearly from the largest profiled point.
        """
        if batch < 1:
            raise ValueError(f"batch size must be >= 1, got {batch}")
        if batch in self.latency_s:
            return self.latency_s[batch]
        sizes = self.batch_sizes
        if batch > sizes[-1]:
            return self.latency_s[sizes[-1]] * batch / sizes[-1]
        if batch < sizes[0]:
            return self.latency_s[sizes[0]] * batch / sizes[0]
        hi = next(s for s in sizes if s > batch)
        lo = max(s for s in sizes if s < batch)
        w = (batch - lo) / (hi - lo)
        return self.latency_s[lo] * (1 - w) + self.latency_s[hi] * w

    def throughput_qpm(self, batch: int = 1) -> float:
        """Throughput of one worker at ``batch`` (queries per minute)."""
        return 60.0 * batch / self.latency(batch)

    @property
    def peak_qpm(self) -> float:
        """P_th(v): peak throughput of one worker (QPM) at batch size 1, as ARGUS serves.

        A profile may override it (e.g. a measured figure that includes overheads).
        """
        if self.peak_qpm_override is not None:
            return self.peak_qpm_override
        return self.throughput_qpm(1)

    def shares_worker_with(self, other: ApproxLevel) -> bool:
        """Whether a worker loaded for this level can serve ``other`` without a model switch:
        both approximate-caching levels of the same model and N (they differ only in the K a
        request resumes at, a per-request choice, or in the feature cache a batch runs with, a hook
        applied to the loaded model)."""
        return (
            self.strategy is Strategy.AC
            and other.strategy is Strategy.AC
            and self.model == other.model
            and self.steps == other.steps
        )


@dataclass(frozen=True, slots=True)
class CascadeSpec:
    """A light→heavy cascade (DiffServe §3): the light level's image is returned when the
    discriminator's confidence is at least the threshold t, else the heavy level redoes it.

    ``thresholds`` and ``deferral`` are the profiled f(t) table: the share of queries
    deferred to the heavy level at each threshold (non-decreasing in t).
    """

    light: str
    heavy: str
    discriminator_latency_s: float
    thresholds: tuple[float, ...]
    deferral: tuple[float, ...]
    # Optional quality of the served mix at each threshold (relative to the heavy level).
    quality: tuple[float, ...] | None = None
    # whether a deferral resumes the heavy model from the light image's latent (pipelines that share
    # a latent space, workers/cascade.py); the planner still charges the heavy level's full latency
    resume: bool = False
    # the DiffServe artifact's name of this pair (sdturbo, sdxs, sdxlltn: traces.diffserve.PAIRS),
    # whose measured per-query discriminator confidences (dist_<pair>.txt) the replay's
    # ``--quality diffserve`` uses; None: the artifact measured no such pair
    diffserve_pair: str | None = None

    def f(self, t: float) -> float:
        """Deferral fraction f(t), linearly interpolated on the profiled grid."""
        ts, fs = self.thresholds, self.deferral
        if t <= ts[0]:
            return fs[0]
        if t >= ts[-1]:
            return fs[-1]
        lo, hi = 0, len(ts) - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ts[mid] <= t:
                lo = mid
            else:
                hi = mid
        w = (t - ts[lo]) / (ts[hi] - ts[lo])
        return fs[lo] * (1 - w) + fs[hi] * w


@dataclass(frozen=True, slots=True)
class AdapterSpec:
    """A LoRA adapter a profile offers for one of its models (``[[adapters]]``): a request that
    names it is served only by levels of that model, with the adapter loaded at ``scale`` (or the
    request's scale, within [``scale_min``, ``scale_max``])."""

    name: str
    model: str  # the registry name of the model it was trained for
    source: str  # a folder or file of LoRA weights (diffusers' load_lora_weights), or a hub id
    scale: float = 1.0
    scale_min: float = 0.0
    scale_max: float = 2.0
    weight_name: str | None = None  # the weights file inside ``source`` when it holds several


@dataclass(frozen=True, slots=True)
class Profile:
    """The levels of one deployment on one GPU kind, slowest/best first."""

    name: str
    gpu: str
    levels: tuple[ApproxLevel, ...]
    description: str = ""
    cascade: CascadeSpec | None = None
    source: str = ""  # file the profile was loaded from
    slo_s: float | None = None  # the deployment's default SLO; None: 3 × the slowest level
    gpu_memory_gb: float | None = None  # memory of one worker's GPU; None: not modelled
    sources: Mapping[str, str] = field(default_factory=dict)  # field -> where its values come from
    # a deployment profile's light→heavy pairs (``[[cascades]]``), next to its AC and SM levels;
    # ``cascade`` is the one pair of a cascade-only profile (``[cascade]``)
    cascades: tuple[CascadeSpec, ...] = ()
    adapters: tuple[AdapterSpec, ...] = ()  # LoRA adapters per model (``[[adapters]]``)

    def __post_init__(self) -> None:
        if not self.levels:
            raise ValueError(f"profile {self.name!r} has no levels")

    def adapter(self, name: str, model: str) -> AdapterSpec | None:
        """Adapter ``name`` of ``model`` (None: not declared for it)."""
        return next((a for a in self.adapters if a.name == name and a.model == model), None)

    def adapter_models(self, name: str) -> frozenset[str]:
        """The models that have adapter ``name`` (empty: unknown adapter)."""
        return frozenset(a.model for a in self.adapters if a.name == name)

    @property
    def cascade_specs(self) -> tuple[CascadeSpec, ...]:
        """Every light→heavy pair of the profile: its ``[[cascades]]``, or its one ``[cascade]``."""
        if self.cascades:
            return self.cascades
        return (self.cascade,) if self.cascade is not None else ()

    def cascade_for(self, light: str) -> CascadeSpec | None:
        """The pair whose light level is ``light`` (None: ``light`` starts no cascade)."""
        return next((c for c in self.cascade_specs if c.light == light), None)

    @property
    def unified(self) -> bool:
        """Whether the profile lists several kinds of path for one plan: ``[[cascades]]`` next to
        other levels, or AC levels next to smaller models."""
        return bool(self.cascades) or {Strategy.AC, Strategy.SM} <= self.strategies

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(level.id for level in self.levels)

    def index(self, level_id: str) -> int:
        for i, level in enumerate(self.levels):
            if level.id == level_id:
                return i
        raise KeyError(f"profile {self.name!r} has no level {level_id!r}; levels: {', '.join(self.ids)}")

    def level(self, level_id: str) -> ApproxLevel:
        return self.levels[self.index(level_id)]

    def ac_base(self, level_id: str) -> ApproxLevel:
        """The level an approximate-caching level runs as on a cache miss: the AC level of the same
        model with the smallest K (K = 0 where the profile has it). Other levels: themselves."""
        lv = self.level(level_id)
        if lv.strategy is not Strategy.AC:
            return lv
        return min(
            (x for x in self.levels if x.model == lv.model and x.strategy is Strategy.AC),
            key=lambda x: (x.skip, x.feature_cache is not None),  # the plain full run before a feature cache
        )

    @property
    def best(self) -> ApproxLevel:
        return self.levels[0]

    @property
    def fastest(self) -> ApproxLevel:
        return self.levels[-1]

    @property
    def strategies(self) -> frozenset[Strategy]:
        return frozenset(level.strategy for level in self.levels)

    def default_slo_s(self, factor: float = 3.0) -> float:
        """The profile's ``slo_s`` when set, else ARGUS §5: 3 × the slowest level's latency."""
        if self.slo_s is not None:
            return self.slo_s
        return factor * max(level.latency(1) for level in self.levels)

    def time_scaled(self, s: float) -> Profile:
        """This profile with every time × ``s`` (latencies, load times, the SLO) and every throughput
        ÷ ``s``: the profile of stand-in workers that run ``s`` times as fast (benchmarks)."""
        levels = tuple(
            replace(
                lv,
                latency_s={b: t * s for b, t in lv.latency_s.items()},
                load_time_s=lv.load_time_s * s,
                peak_qpm_override=None if lv.peak_qpm_override is None else lv.peak_qpm_override / s,
            )
            for lv in self.levels
        )
        return replace(self, levels=levels, slo_s=self.default_slo_s() * s)

    def qualities(self) -> tuple[float, ...]:
        return tuple(level.quality for level in self.levels)

    def peak_qpms(self) -> tuple[float, ...]:
        return tuple(level.peak_qpm for level in self.levels)


def level_catalogue(*profiles: Profile | None) -> dict[str, ApproxLevel]:
    """Every level a deployment can run, by id: the levels of its profile, then those of its
    fallback profile (and of any further profile given) that the ones before do not list. The
    router, the simulator, the executor factory and the control loop all read this one table."""
    levels: dict[str, ApproxLevel] = {}
    for profile in profiles:
        if profile is not None:
            for lv in profile.levels:
                levels.setdefault(lv.id, lv)
    return levels


@dataclass(frozen=True, slots=True)
class Request:
    """One text-to-image request as the router sees it."""

    id: str
    prompt: str
    arrival_s: float
    prompt_idx: int | None = None
    slo_s: float | None = None  # per-request deadline relative to arrival (None: the deployment's SLO)
    tier: Tier = Tier.STANDARD
    min_quality_level: str | None = None  # slowest acceptable level id is not constrained when None
    seed: int | None = None
    models: frozenset[str] | None = None  # only levels of these models may serve it (a LoRA adapter's)

    def deadline_s(self, default_slo_s: float) -> float:
        return self.arrival_s + (self.slo_s if self.slo_s is not None else default_slo_s)


class Timeliness(enum.Enum):
    """How a routed request stands against its deadline by the shared finish estimate
    (:mod:`argusdiff.deadline`)."""

    #: the path the plan drew finishes by the deadline
    ON_TIME = "on time"
    #: the drawn path would not; another allowed path does, and the request was moved there
    ESCALATED = "escalated"
    #: no allowed path finishes by the deadline (best effort without admission; refused with it)
    LATE = "late"


@dataclass(frozen=True, slots=True)
class DeadlineVerdict:
    """A policy's deadline judgement of one routed request: its kind, the finish estimate of the
    path it was routed to, and the deadline it was judged against (the data path's clock)."""

    kind: Timeliness
    finish_s: float
    deadline_s: float

    @property
    def on_time(self) -> bool:
        return self.kind is not Timeliness.LATE


class Refusal(enum.StrEnum):
    """Why a request is not taken, as a value: the router and the simulator branch on it by
    identity, never on a message. The human-readable text (``Assignment.reason``, the 429's
    message) is for clients only. The values are the ``reason`` labels of
    ``argusdiff_refused_total``."""

    #: not refused
    NONE = ""
    #: the policy dropped it (DiffServe's 1.5 x SLO rule); ``Assignment.reason`` says why in words
    POLICY = "policy"
    #: no planned level with a worker is at least as good as the request's ``min_quality_level``
    FLOOR_UNMET = "floor unmet"
    #: no planned level with a worker is of a model the request allows (its LoRA adapter's)
    MODELS_UNSERVED = "models unserved"
    #: admission: it cannot finish by its deadline at its level given the backlog there
    LATE = "definitely late"
    #: admission: the level's queue is at ``[admission] queue_cap``
    CAPPED = "queue cap"


class Outcome(enum.StrEnum):
    """What the data path decided for one request, or for one cascade deferral, as a value: the
    router and the simulator branch on it by identity (:attr:`Assignment.outcome`)."""

    #: taken at a level: the one the plan drew, or the one a rule of the policy chose
    #: (:attr:`Assignment.cause` says which)
    SERVED = "served"
    #: moved to another path so that it finishes by its deadline (:attr:`Timeliness.ESCALATED`)
    ESCALATED = "escalated"
    #: a cascade deferral that a heavy level redoes (``Policy.decide_heavy``)
    DEFERRED = "deferred"
    #: a cascade deferral that no heavy level redoes: the light image is the answer
    KEPT = "kept"
    #: not taken: no planned level with a worker is what the request needs (its quality floor, its
    #: adapter's models; :attr:`Assignment.refusal` says which)
    REFUSED = "refused"
    #: the policy dropped it (DiffServe's 1.5 x SLO rule; :attr:`Refusal.POLICY`)
    DROPPED = "dropped"


class RouteReason(enum.StrEnum):
    """Why a request went where it did, as a value (:attr:`Assignment.cause`): explanations and the
    ``argusdiff_routed_total`` metric read it; ``Assignment.reason`` holds the same in words for
    clients, and no code compares those words."""

    #: where the plan drew it (its PASM row, its share, its queue)
    PLAN = "plan"
    #: the plan has no worker at the drawn level: it waits there for one
    NO_WORKER = "no worker"
    #: ARGUS §4.6: the cache is degraded, K = 0 at once on the loaded model
    CACHE_DEGRADED = "cache degraded"
    #: a mixed ladder's cache miss at an AC level: a smaller model instead
    CACHE_MISS = "cache miss"
    #: the drawn path would miss the deadline; another one meets it
    DEADLINE_MOVED = "deadline moved"
    #: no path meets the deadline: best effort on the one that finishes first
    DEADLINE_LATE = "deadline late"
    #: moved up to the request's ``min_quality_level`` (refused: none meets it)
    QUALITY_FLOOR = "quality floor"
    #: moved to a level of a model the request allows (its LoRA adapter's; refused: none has one)
    ADAPTER = "adapter"
    #: DiffServe's drop: predicted to miss 1.5 x the SLO
    PREDICTED_LATE = "predicted late"
    #: a deferral's heavy run would miss the deadline: the light image is kept
    HEAVY_LATE = "heavy late"
    #: a deferral with no heavy level or worker (or no plan, or a policy that does not cascade):
    #: the light image is kept
    NO_HEAVY = "no heavy"


_SERVED = Outcome.SERVED
_NO_REFUSAL = Refusal.NONE


@dataclass(frozen=True, slots=True)
class Assignment:
    """The data path's decision for one request: its :attr:`outcome` and :attr:`cause` as values,
    the level and worker, and :attr:`reason` in words for clients."""

    level: str | None  # level id that serves it (None: refused, dropped, or the light image kept)
    worker: str | None = None  # worker id chosen by the worker selector, when the policy picks one
    optimal_level: str | None = None  # the classifier's predicted optimal level
    refusal: Refusal = Refusal.NONE  # why the policy refused or dropped it (NONE: it did not)
    best_effort: bool = False  # admitted although predicted to miss its deadline
    reason: str = ""  # the decision in words, for clients and explanations; never branched on
    # the policy's deadline judgement (argusdiff.deadline); None: the policy does not route by
    # deadline, admission estimates on its own
    verdict: DeadlineVerdict | None = None
    outcome: Outcome = Outcome.SERVED  # what was decided
    cause: RouteReason = RouteReason.PLAN  # why, as a value

    def __post_init__(self) -> None:
        outcome = self.outcome
        if outcome is _SERVED and self.level is not None and self.refusal is _NO_REFUSAL:
            return  # the common case, checked first (one per request on the data path)
        turned_away = outcome is Outcome.REFUSED or outcome is Outcome.DROPPED
        if turned_away != (self.refusal is not _NO_REFUSAL):
            raise ValueError(f"outcome {outcome} with refusal {self.refusal!r}")
        if (self.level is None) != (turned_away or outcome is Outcome.KEPT):
            raise ValueError(f"outcome {outcome} with level {self.level!r}")

    @property
    def dropped(self) -> bool:
        """The request is not taken: refused or dropped (:attr:`refusal` says why)."""
        return self.refusal is not Refusal.NONE

    @property
    def taken(self) -> bool:
        """A level takes the request: served, escalated or deferred (then :attr:`level` is set)."""
        return self.outcome is Outcome.SERVED or self.outcome is Outcome.ESCALATED or self.outcome is Outcome.DEFERRED


class PlanTrigger(enum.StrEnum):
    """What a plan is made for (:attr:`ClusterStats.reason`), as a value policies branch on by
    identity."""

    #: a control period closed: its arrivals count, the predictors observe them
    PERIOD = "period"
    #: a model finished loading (ARGUS §4.6): a re-plan between periods, on arrivals already counted
    LOADED = "loaded"
    #: a worker joined or died: a re-plan between periods, on the last full period's rate
    REPLAN = "replan"
    #: a look inside the period (``Policy.check_s``): the period's arrivals so far, not yet
    #: observed; the policy returns its current plan unchanged or re-plans on them
    CHECK = "check"


@dataclass(frozen=True, slots=True)
class ClusterStats:
    """What the control path observes at the start of a period; input to ``Policy.plan``."""

    now_s: float
    period_s: float
    arrivals: int  # requests that arrived during the last period
    workers: tuple[str, ...]  # ids of workers that are up
    queue_lengths: Mapping[str, int] = field(default_factory=dict)  # per worker id
    current: Mapping[str, str | None] = field(default_factory=dict)  # worker id -> level id it runs
    loading: Mapping[str, str] = field(default_factory=dict)  # worker id -> level id it is loading
    affinity: Mapping[str, int] = field(default_factory=dict)  # H counts: optimal level id -> prompts
    cache_latency_s: float | None = None  # recent median cache retrieval latency
    cache_error_rate: float = 0.0  # recent share of failed cache lookups
    level_queue: Mapping[str, int] = field(default_factory=dict)  # per level queued requests
    level_arrivals: Mapping[str, int] = field(default_factory=dict)  # per level arrivals last period
    # arrivals of the last period in consecutive sub-periods of ``bin_s`` seconds, oldest first
    # (empty: only the total is known); the demand predictor reads rates within the period from them
    arrival_bins: tuple[int, ...] = ()
    bin_s: float = 0.0
    resident: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # worker id -> models loaded, ready
    tier_arrivals: Mapping[str, int] = field(default_factory=dict)  # arrivals of the last period per SLO tier
    cache_hit_rate: float | None = None  # share of the last period's cache lookups that hit (None: unknown)
    # level id -> measured batch latency / profiled (argusdiff.latency.LatencyEstimator); a level
    # not listed runs as profiled
    latency_scale: Mapping[str, float] = field(default_factory=dict)
    # what the plan is for: a closed period, or a re-plan between periods (a name is read as its
    # PlanTrigger)
    reason: PlanTrigger = PlanTrigger.PERIOD

    def __post_init__(self) -> None:
        if type(self.reason) is not PlanTrigger:
            object.__setattr__(self, "reason", PlanTrigger(self.reason))

    @property
    def arrival_qpm(self) -> float:
        return self.arrivals * 60.0 / self.period_s if self.period_s > 0 else 0.0


class PlanRoute(Protocol):
    """The per-request routing of one plan (each policy's routing object, :mod:`argusdiff.policies`):
    built from the plan, its profile and the policy's options when the plan is made, immutable,
    and reading only that snapshot, the request and the data path's view (``view``: a
    :class:`argusdiff.policies.RouteView`; ``rng``: the policy's ``numpy.random.Generator``)."""

    def route(self, request: Request, view: Any, rng: Any) -> Assignment:
        """The level that serves ``request`` (or a drop)."""
        ...

    def route_heavy(self, request: Request, view: Any) -> Assignment:
        """A cascade deferral: the heavy level that redoes it, a drop, or the light image kept."""
        ...


@dataclass(frozen=True, slots=True)
class Plan:
    """The control path's decision for one period (published to router and workers).

    ``pasm[i][j]`` is P(v'_j | v_i): the probability that a prompt whose optimal level is
    ``levels[i]`` is served at ``levels[j]`` (ARGUS §4.3). Every row sums to 1.

    ``routing`` is the plan's routing object (:class:`PlanRoute`), which the data path routes each
    request with: the policy that makes a plan attaches it (``Policy.routed``, by
    :meth:`with_routing`), a router attaches its own to a plan it reads from the control store. It
    is not data of the plan: equality, ``repr`` and the JSON form (``service.plans``) leave it out,
    and ``dataclasses.replace`` drops it (a changed plan needs a routing of its own;
    :meth:`renumbered` keeps it).
    """

    version: int
    created_s: float
    strategy: Strategy
    levels: tuple[str, ...]
    assignment: Mapping[str, str | None]  # worker id -> level id (None: idle)
    share: tuple[float, ...]  # F(v): share of the predicted load each level serves
    pasm: tuple[tuple[float, ...], ...]
    predicted_qpm: float
    expected_quality: float
    saturated: bool = False
    shortfall_qpm: float = 0.0
    moved_workers: int = 0
    thresholds: Mapping[str, float] = field(default_factory=dict)  # cascade light level -> t
    batch_sizes: Mapping[str, int] = field(default_factory=dict)  # level id -> batch size
    margin: float = 1.0  # extra capacity factor in force (e.g. 1.5 during an AC→SM switch)
    policy: str = ""
    notes: tuple[str, ...] = ()
    # worker id -> level ids whose models the worker loads alongside the one it serves (GPU memory
    # permitting) and keeps loaded: a later move to such a level costs no load (DiffServe keeps its
    # light and heavy models on every worker; ARGUS §4.6 loads the small models next to SD-XL)
    preload: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # unified plans (argus+ over every path of a deployment profile): the PASM of each SLO tier
    # (tier name -> rows and columns over ``levels``; a tier not listed routes with ``pasm``), and
    # each cascade's heavy level (light level id -> heavy level id) that its deferrals go to at
    # the threshold in ``thresholds``
    tier_pasm: Mapping[str, tuple[tuple[float, ...], ...]] = field(default_factory=dict)
    cascades: Mapping[str, str] = field(default_factory=dict)
    # worker id -> the SLO tier whose requests alone it serves (capacity reserved for interactive
    # traffic ahead of standard and batch); a worker not listed serves every tier
    reserved: Mapping[str, str] = field(default_factory=dict)
    # level id -> measured latency / profiled that the plan was made with (argusdiff.latency); its
    # routing and admission judge deadlines with the same latencies. Empty: as profiled
    latency_scale: Mapping[str, float] = field(default_factory=dict)
    routing: PlanRoute | None = field(default=None, init=False, repr=False, compare=False)

    def with_routing(self, routing: PlanRoute) -> Plan:
        """This plan carrying ``routing`` (a copy: a plan's routing is set before it is published,
        never changed after)."""
        plan = replace(self)
        object.__setattr__(plan, "routing", routing)
        return plan

    def renumbered(self, version: int) -> Plan:
        """This plan as version ``version``, with its routing (which does not depend on the version)."""
        plan = replace(self, version=version)
        object.__setattr__(plan, "routing", self.routing)
        return plan

    def pasm_for(self, tier: str | None) -> tuple[tuple[float, ...], ...]:
        """The PASM a request of ``tier`` is routed with."""
        if tier is not None and self.tier_pasm:
            return self.tier_pasm.get(str(tier), self.pasm)
        return self.pasm

    def workers_at(self, level_id: str) -> tuple[str, ...]:
        return tuple(w for w, lv in self.assignment.items() if lv == level_id)

    def unserved_siblings(self, levels: Mapping[str, ApproxLevel], level_id: str | None) -> tuple[str, ...]:
        """This plan's levels that no worker holds but a worker at ``level_id`` serves as well: AC
        levels of its model and N (:meth:`ApproxLevel.shares_worker_with`; ``levels`` maps ids to
        levels)."""
        mine = levels.get(level_id) if level_id is not None else None
        if mine is None:
            return ()
        served = set(self.assignment.values())
        return tuple(
            lv for lv in self.levels if lv not in served and lv in levels and mine.shares_worker_with(levels[lv])
        )

    def counts(self) -> tuple[int, ...]:
        """Workers per level, in ``levels`` order."""
        return tuple(sum(1 for lv in self.assignment.values() if lv == level) for level in self.levels)

    def validate(self) -> None:
        n = len(self.levels)
        if len(self.share) != n or len(self.pasm) != n or any(len(row) != n for row in self.pasm):
            raise ValueError("plan shapes do not match its levels")
        for i, row in enumerate(self.pasm):
            total = math.fsum(row)
            if any(p < -1e-9 for p in row) or abs(total - 1.0) > 1e-6:
                raise ValueError(f"PASM row {self.levels[i]!r} is not a probability distribution: {row}")
        for tier, rows in self.tier_pasm.items():
            if len(rows) != n or any(len(row) != n for row in rows):
                raise ValueError(f"tier {tier!r}: PASM shape does not match the plan's levels")
            for i, row in enumerate(rows):
                if any(p < -1e-9 for p in row) or abs(math.fsum(row) - 1.0) > 1e-6:
                    raise ValueError(f"tier {tier!r}: PASM row {self.levels[i]!r} is not a probability distribution")
        for light, heavy in self.cascades.items():
            if light not in self.levels or heavy not in self.levels:
                raise ValueError(f"cascade {light!r} -> {heavy!r}: both levels must be plan levels")
