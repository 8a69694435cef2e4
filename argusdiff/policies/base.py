"""The policy interface shared by the simulator and the live service.

A policy has two entry points (ARGUS Fig. 3):

* ``plan(stats) -> Plan`` on the control path, once per control period: which level each worker
  runs and how prompts are redistributed over the levels (the PASM);
* ``route(request, plan, view) -> Assignment`` on the data path, once per request: the level
  that serves it (or a drop), decided by the routing object the plan carries (``Plan.routing``,
  a :class:`Routing` the policy built with the plan: :meth:`Policy.make_routing`). Which worker
  runs it is the delivery's (:attr:`Policy.delivery`): by default (``Delivery.SHARED``) the
  level's queue is pulled by its workers and the request starts on whichever frees up first;
  only a ``Delivery.PER_WORKER`` policy's ``Assignment.worker`` puts it on one worker's queue
  (elsewhere that field is a hint, unused).

Policies are pure: no I/O, no wall clock, randomness only from the injected
``numpy.random.Generator``. What the data path may observe is a :class:`RouteView`, which the
simulator (or the service's router) fills in; the simulator reuses one mutable view object for
every request, so a policy must not keep a reference to it.
"""

from __future__ import annotations

import abc
import math
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

from argusdiff.domain import (
    Assignment,
    ClusterStats,
    Delivery,
    Outcome,
    Plan,
    PlanRoute,
    Profile,
    Refusal,
    Request,
    RouteReason,
    Strategy,
    level_catalogue,
)
from argusdiff.errors import ConfigError
from argusdiff.policies.state import import_demand
from argusdiff.predictors import DemandPredictor, predictor_spec

__all__ = [
    "FAMILIES",
    "FLOOR_UNMET",
    "MODELS_UNSERVED",
    "REGISTRY",
    "CommonOptions",
    "PlanRouting",
    "Policy",
    "PolicyError",
    "RouteView",
    "Routing",
    "frozen_init",
    "identity_pasm",
    "nearest_served",
    "option_names",
    "require",
    "select_worker",
    "uniform_pasm",
]


#: ``Assignment.reason`` (the words; :attr:`Refusal.FLOOR_UNMET` is the value) of a request refused
#: because no planned level meets its minimum quality
FLOOR_UNMET = "no worker serves a level at least as good as the requested minimum quality level"
#: ``Assignment.reason`` (the words; :attr:`Refusal.MODELS_UNSERVED` is the value) of a request
#: refused because no planned level is of a model it allows (its adapter's)
MODELS_UNSERVED = "no worker serves a level of a model that has the requested adapter"


class PolicyError(ConfigError):
    """A policy name or option is invalid, or a policy cannot run on the given profile."""


@dataclass(slots=True)
class RouteView:
    """What the data path may observe when it routes one request.

    ``queue_lengths[w]`` counts requests assigned to worker ``w`` and not finished (including the
    one in service); ``busy_until[w]`` is the estimated time ``w`` finishes all of them;
    ``worker_models[w]`` the model ``w`` has loaded (or is loading); ``optimal_level`` the
    classifier's (or quality oracle's) predicted optimal level of the prompt; ``cache_similarity``
    the cosine similarity of the best cached prompt (``None``: unknown / no cache); ``deferred_from``
    the light level a deferred request ran at (set for ``route_heavy`` only); ``deadline_factor``
    the share of a request's SLO its deadline allows (:func:`argusdiff.deadline.deadline_s`: the
    admission's ``deadline_factor`` when admission is on, else 1), so a policy that routes by
    deadline routes to the deadline admission judges.
    """

    now_s: float = 0.0
    queue_lengths: Mapping[str, int] = field(default_factory=dict)
    busy_until: dict[str, float] = field(default_factory=dict)
    worker_models: dict[str, str | None] = field(default_factory=dict)
    up: frozenset[str] | set[str] = field(default_factory=set)
    optimal_level: str | None = None
    cache_similarity: float | None = None
    cache_healthy: bool = True
    slo_s: float = 0.0
    # for ``route_heavy``: the cascade light level whose image the discriminator rejected
    deferred_from: str | None = None
    deadline_factor: float = 1.0


@dataclass(frozen=True, kw_only=True)
class CommonOptions:
    """What every policy reads; each policy's own options dataclass extends it (``Policy.options_type``).

    ``slo_s``: the request SLO (``None``: the profile's default, 3 × its slowest level);
    ``period_s``: the control period; ``predictor``: the demand predictor the policy plans for (a
    name or spec string of :func:`argusdiff.predictors.predictor_spec`, a
    :class:`~argusdiff.predictors.PredictorSpec`; ``None``: :data:`argusdiff.predictors.DEFAULT_PREDICTOR`).
    Its margin is the headroom the plan provisions over the predicted demand.
    """

    slo_s: float | None = None
    period_s: float = 60.0
    predictor: Any = None

    def __post_init__(self) -> None:
        if self.slo_s is not None:
            require("slo_s", self.slo_s, lambda v: v > 0, "> 0 (or None: the profile's default)")
        require("period_s", self.period_s, lambda v: v > 0, "> 0")

    @classmethod
    def names(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls))

    @classmethod
    def coerce(cls, config: CommonOptions | Mapping[str, Any] | None, *, policy: str, known: frozenset[str]) -> Any:
        """``config`` as this options class. An instance must be of this class; a mapping may also
        carry options of other policies (``known``: every registered policy's option names) — the
        service and the replay hand one set to whichever policy runs — and a key no policy knows
        is an error naming it."""
        if config is None:
            return cls()
        if isinstance(config, CommonOptions):
            if not isinstance(config, cls):
                raise PolicyError(
                    f"policy {policy!r} takes {cls.__name__}, got {type(config).__name__} (pass a mapping or a "
                    f"{cls.__name__})"
                )
            return config
        unknown = set(config) - known
        if unknown:
            raise PolicyError(f"unknown policy option(s): {', '.join(sorted(unknown))}")
        mine = cls.names()
        return cls(**{k: v for k, v in config.items() if k in mine})


def require(name: str, value: Any, test: Callable[[Any], bool], what: str) -> None:
    """Raise :class:`PolicyError` naming option ``name`` unless ``value`` is a number (not a bool)
    that passes ``test``; ``what`` says what it must be."""
    try:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and bool(test(value))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise PolicyError(f"policy option {name}: must be {what}, got {value!r}")


def option_names() -> frozenset[str]:
    """Every option name some registered policy takes."""
    return frozenset().union(*(cls.options_type.names() for cls in _REGISTRY.values()), CommonOptions.names())


def select_worker(workers: Sequence[str], view: RouteView, proc_s: float | Sequence[float] = 1.0) -> str | None:
    """ARGUS §4.4 Worker-Selector: argmin over ``workers`` of queue length × processing time.

    Ties go to the worker that frees up first (an idle worker frees up now: several idle workers
    tie, however long each has been idle), then the order given. ``proc_s`` is one time for all
    (the same level) or one per worker.
    """
    best: str | None = None
    ql = view.queue_lengths
    bu = view.busy_until
    now = view.now_s
    if isinstance(proc_s, int | float):
        # one time for all (the common case, once per request): the key below compared as the
        # tuple compares it, without building a tuple per worker. Queue lengths are counts (>= 0),
        # so no key is below (proc_s, now): the first idle worker free now ends the scan
        floor = proc_s if proc_s >= 0 else -math.inf
        best_q = best_b = math.inf
        for w in workers:
            q = (ql.get(w, 0) + 1) * proc_s
            if q < best_q:
                free = bu.get(w, 0.0)
                best_q, best_b, best = q, (free if free > now else now), w
                if q <= floor and free <= now:
                    break
            elif q == best_q:
                free = bu.get(w, 0.0)
                b = free if free > now else now
                if b < best_b:
                    best_b, best = b, w
                    if q <= floor and free <= now:
                        break
        return best
    best_key = (math.inf, math.inf)
    scalar = not isinstance(proc_s, Sequence)
    for i, w in enumerate(workers):
        t = proc_s if scalar else proc_s[i]
        free = bu.get(w, 0.0)
        key = ((ql.get(w, 0) + 1) * t, free if free > now else now)
        if key < best_key:
            best_key = key
            best = w
    return best


def identity_pasm(n: int) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(1.0 if i == j else 0.0 for j in range(n)) for i in range(n))


def uniform_pasm(share: Sequence[float]) -> tuple[tuple[float, ...], ...]:
    """Every row equal to ``share``: the prompt-agnostic redistribution (PAC, Proteus)."""
    total = math.fsum(share)
    row = tuple(s / total for s in share) if total > 0 else tuple(1.0 / len(share) for _ in share)
    return tuple(row for _ in share)


#: the profile family a registered policy runs on in a replay (argusdiff.replay): approximate
#: caching (with its smaller-model fallback), the smaller-model ladder, or a light→heavy cascade
FAMILIES = ("ac", "sm", "cascade")

_REGISTRY: dict[str, type[Policy]] = {}
#: every registered policy by name, in registration order (read-only)
REGISTRY: Mapping[str, type[Policy]] = MappingProxyType(_REGISTRY)


class Policy(abc.ABC):
    """Base class of every routing/allocation policy.

    A concrete policy registers itself by name: ``class Argus(Policy, name="argus", family="ac")``
    (:data:`REGISTRY`; :func:`argusdiff.policies.make_policy` builds one). It declares what it can
    do in the typed class attributes below, its options in ``options_type`` (a dataclass extending
    :class:`CommonOptions`), and its own state in :meth:`setup` (not ``__init__``).
    """

    name: ClassVar[str] = "policy"
    #: the replay's profile family (:data:`FAMILIES`), set by registration
    family: ClassVar[str] = ""
    #: one line for listings
    summary: ClassVar[str] = ""
    options_type: ClassVar[type[CommonOptions]] = CommonOptions
    #: profile strategies the policy can run on
    strategies: ClassVar[frozenset[Strategy]] = frozenset({Strategy.AC, Strategy.SM})

    # ---- capabilities: what the policy does, read by the simulator, the router and the replay ----
    #: whether the policy needs the classifier's optimal level in the RouteView
    uses_classifier: ClassVar[bool] = False
    #: whether ``route`` reads RouteView.cache_similarity (the live router then looks it up)
    uses_cache_similarity: ClassVar[bool] = False
    #: how an accepted request reaches a worker (:class:`~argusdiff.domain.Delivery`): the level's
    #: shared queue pulled by its workers, or the queue of the worker ``route`` picked (the source's
    #: delivery; the simulator, the in-process queues and Redis all honour it)
    delivery: ClassVar[Delivery] = Delivery.SHARED
    #: whether the control loop re-plans as soon as a model finishes loading (ARGUS §4.6)
    replans_on_load: ClassVar[bool] = False
    #: how often the control path looks inside a period (seconds; None: never): every ``check_s``
    #: between two period ends the simulator and the live control loop call ``plan()`` with a
    #: :attr:`~argusdiff.domain.PlanTrigger.CHECK` stats of the period so far, and apply what it
    #: returns unless it is the plan it returned last (the same object); an instance attribute
    check_s: float | None = None
    #: whether the policy switches an AC profile to a smaller-model fallback profile when the cache
    #: degrades (ARGUS §4.6; option ``fallback``): the replay hands it its smaller-model profile
    uses_fallback: ClassVar[bool] = False
    #: whether the policy is provisioned once for an anticipated peak demand given in advance (option
    #: ``peak_qpm``): the replay passes the trace's peak
    needs_peak: ClassVar[bool] = False
    #: whether DiffServe §4.1 runs this model-ladder baseline on a cascade's two models (the replay's
    #: ``cascade_baselines``)
    cascade_baseline: ClassVar[bool] = False
    #: the demand predictor of the policy's paper or artifact (the replay's ``predictor="source"``;
    #: docs/baselines.md gives the sources); None: it predicts nothing
    source_predictor: ClassVar[str | None] = None
    #: whether the policy plans a deployment profile that lists every kind of path (``[[cascades]]``
    #: beside AC and smaller-model levels) in one unified plan: the replay adds its run on such a profile
    plans_unified: ClassVar[bool] = False
    #: whether the policy plans a merged AC+SM ladder (:func:`argusdiff.policies.mixed.merged_ladder`):
    #: the replay's ``mixed`` run
    plans_mixed: ClassVar[bool] = False
    #: the replay's ablation runs of the policy (label suffix -> options that switch one part off),
    #: and of its unified plan (``plans_unified``)
    ablations: ClassVar[Mapping[str, Mapping[str, Any]]] = MappingProxyType({})
    path_ablations: ClassVar[Mapping[str, Mapping[str, Any]]] = MappingProxyType({})
    #: whether a rejected light image of a cascade is handed to :meth:`route_heavy` (else the light
    #: image is the answer); an instance attribute: argus+ cascades only on a profile with cascades
    cascade: bool = False
    #: the cluster demand predictor ``plan()`` reads (None: the policy predicts no cluster demand)
    demand: DemandPredictor | None = None

    def __init_subclass__(cls, *, name: str | None = None, family: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if name is None:
            if family is not None:
                raise TypeError(f"{cls.__qualname__}: family {family!r} without a name")
            return  # a shared base (e.g. the static policies' _Static): not registered
        if family not in FAMILIES:
            raise TypeError(f"policy {name!r}: family must be one of {', '.join(FAMILIES)}, got {family!r}")
        if name in _REGISTRY:
            raise TypeError(f"policy {name!r} is registered twice ({_REGISTRY[name].__qualname__}, {cls.__qualname__})")
        cls.name = name
        cls.family = family
        _REGISTRY[name] = cls

    def __init__(
        self,
        profile: Profile,
        *,
        rng: np.random.Generator,
        classifier: Any = None,
        config: CommonOptions | Mapping[str, Any] | None = None,
    ) -> None:
        if not profile.strategies <= self.strategies and not (profile.strategies & self.strategies):
            raise PolicyError(
                f"policy {self.name!r} runs on {'/'.join(sorted(s.value for s in self.strategies))} profiles; "
                f"profile {profile.name!r} has {'/'.join(sorted(s.value for s in profile.strategies))} levels"
            )
        self.profile = profile
        self.rng = rng
        self.classifier = classifier
        self.options = self.options_type.coerce(config, policy=self.name, known=option_names())
        self.slo_s = self.options.slo_s if self.options.slo_s is not None else profile.default_slo_s()
        self.predictor_spec = predictor_spec(self.options.predictor)
        self._version = 0
        self.setup()
        self._all_levels = level_catalogue(*self.known_profiles())

    def setup(self) -> None:  # noqa: B027 - optional hook
        """The policy's own checks and state, once ``profile``, ``rng``, ``classifier``,
        ``options``, ``slo_s`` and ``predictor_spec`` are set. Default: nothing."""

    def known_profiles(self) -> tuple[Profile, ...]:
        """Every profile whose levels the policy may route to (the quality floor looks levels up
        in them). Default: the policy's profile."""
        return (self.profile,)

    # ---- control path --------------------------------------------------------------------

    @abc.abstractmethod
    def plan(self, stats: ClusterStats) -> Plan:
        """The plan for the next control period, carrying its routing object (:meth:`routed`)."""

    # ---- the plan's routing object ---------------------------------------------------------

    @abc.abstractmethod
    def make_routing(self, plan: Plan) -> PlanRoute:
        """The immutable routing object of ``plan`` (:class:`~argusdiff.domain.PlanRoute`, a
        :class:`Routing`): built from the plan, the profile and the options when the plan is made,
        never a reference to the policy, so the data path reads no state ``plan()`` changes."""

    def routed(self, plan: Plan) -> Plan:
        """``plan`` carrying its routing object: ``plan`` itself when it carries one already, else
        a copy with :meth:`make_routing`'s. ``plan()`` returns its plans so; the live router
        attaches it to a plan it reads from the control store (a follower's)."""
        return plan if plan.routing is not None else plan.with_routing(self.make_routing(plan))

    def routing_of(self, plan: Plan) -> PlanRoute:
        """The routing object ``plan`` carries; a plan without one (built by hand, or changed with
        ``dataclasses.replace``) is routed with one built for the call."""
        routing = plan.routing
        return routing if routing is not None else self.make_routing(plan)

    # ---- data path -----------------------------------------------------------------------

    def route(self, request: Request, plan: Plan, view: RouteView) -> Assignment:
        """The level that serves ``request`` under ``plan`` (or a drop); a ``Delivery.PER_WORKER``
        policy also picks the worker whose queue it waits in (:attr:`delivery`). The plan's
        routing object decides, with the policy's generator passed in."""
        return self.routing_of(plan).route(request, view, self.rng)

    def route_heavy(self, request: Request, plan: Plan, view: RouteView) -> Assignment:
        """A cascade deferral (the light image was rejected): the heavy level that redoes it (and,
        under ``Delivery.PER_WORKER``, its worker), a drop, or
        :attr:`~argusdiff.domain.Outcome.KEPT`: the light image is the answer (a routing that
        does not cascade: :meth:`Routing.route_heavy`). The plan's routing object decides."""
        return self.routing_of(plan).route_heavy(request, view)

    # ---- the data path's entry points (the simulator and the live router call these) -------

    def decide(self, request: Request, plan: Plan, view: RouteView) -> Assignment:
        """One request's decision: :meth:`route`, then the request's quality floor and models."""
        a = self.at_least(request, plan, view, self.route(request, plan, view))
        return self.within_models(request, plan, view, a)

    def decide_heavy(self, request: Request, plan: Plan, view: RouteView) -> Assignment:
        """One cascade deferral's decision: :meth:`route_heavy`, then the request's quality floor
        and models; a level that redoes it makes it :attr:`~argusdiff.domain.Outcome.DEFERRED`."""
        a = self.at_least(request, plan, view, self.route_heavy(request, plan, view))
        a = self.within_models(request, plan, view, a)
        return replace(a, outcome=Outcome.DEFERRED) if a.level is not None else a

    def within_models(self, request: Request, plan: Plan, view: RouteView, a: Assignment) -> Assignment:
        """``a``, or, when the request may only be served by some models (``request.models``: a LoRA
        adapter is part of the path's quality profile) and ``a``'s level is of another, a planned
        level of those models with a worker and within the quality floor: the fastest at least as
        good as ``a``'s, else the best of them; none: dropped (:attr:`~argusdiff.domain.Refusal.MODELS_UNSERVED`)."""
        allowed = request.models
        if allowed is None or a.dropped or a.level is None:
            return a
        levels = self._all_levels
        chosen = levels.get(a.level)
        if chosen is not None and chosen.model in allowed:
            return a
        floor = levels[request.min_quality_level].quality - 1e-12 if request.min_quality_level in levels else None
        served = []
        for lv in plan.levels:  # best first
            level = levels.get(lv)
            if level is None or level.model not in allowed or (floor is not None and level.quality < floor):
                continue
            workers = [w for w, x in plan.assignment.items() if x == lv]
            if workers:
                served.append((level, workers))
        if not served:
            return Assignment(
                level=None,
                optimal_level=a.optimal_level,
                refusal=Refusal.MODELS_UNSERVED,
                reason=MODELS_UNSERVED,
                outcome=Outcome.REFUSED,
                cause=RouteReason.ADAPTER,
            )
        want = chosen.quality - 1e-12 if chosen is not None else float("inf")
        good = [x for x in served if x[0].quality >= want]
        level, workers = good[-1] if good else served[0]
        return Assignment(
            level=level.id,
            worker=select_worker(workers, view, level.latency(1)),
            optimal_level=a.optimal_level,
            best_effort=a.best_effort,
            reason="adapter's model",
            cause=RouteReason.ADAPTER,
        )

    def at_least(self, request: Request, plan: Plan, view: RouteView, a: Assignment) -> Assignment:
        """``a``, or, when its level is below the request's ``min_quality_level``, the fastest level
        of ``plan`` with a worker that is at least as good (its least loaded worker as the
        ``Delivery.PER_WORKER`` pick); no such level:
        dropped (:attr:`~argusdiff.domain.Refusal.FLOOR_UNMET`). A tier needs nothing here: it sets
        the request's SLO."""
        floor = request.min_quality_level
        if floor is None or a.dropped or a.level is None:
            return a
        levels = self._all_levels
        if floor not in levels or a.level not in levels:
            return a
        need = levels[floor].quality - 1e-12
        if levels[a.level].quality >= need:
            return a
        for lv in reversed(plan.levels):  # fastest first
            level = levels.get(lv)
            if level is None or level.quality < need:
                continue
            workers = [w for w, x in plan.assignment.items() if x == lv]
            if workers:
                return Assignment(
                    level=lv,
                    worker=select_worker(workers, view, level.latency(1)),
                    optimal_level=a.optimal_level,
                    best_effort=a.best_effort,
                    reason="minimum quality level",
                    cause=RouteReason.QUALITY_FLOOR,
                )
        return Assignment(
            level=None,
            optimal_level=a.optimal_level,
            refusal=Refusal.FLOOR_UNMET,
            reason=FLOOR_UNMET,
            outcome=Outcome.REFUSED,
            cause=RouteReason.QUALITY_FLOOR,
        )

    def on_served(self, level_id: str, latency_s: float, ok: bool) -> None:  # noqa: B027 - optional hook
        """Feedback after a request finished (``ok``: within its SLO). Default: nothing."""

    # ---- the state a successor continues (argusdiff.policies.state) -------------------------

    def export_state(self) -> dict[str, Any]:
        """The control-path state ``plan()`` keeps (JSON-able parts beside the version): the demand
        predictor; a policy with more state adds its parts."""
        return {} if self.demand is None else {"demand": self.demand.state()}

    def import_state(self, data: Mapping[str, Any]) -> list[str]:
        """Take the parts of ``data`` (exported by this policy kind) that still fit; returns their names."""
        if self.demand is None:
            return []
        taken = import_demand(self.demand, data.get("demand"))
        if taken is None:
            return []
        self.demand = taken
        return ["demand"]

    def new_demand_predictor(self) -> DemandPredictor:
        """A fresh :class:`~argusdiff.predictors.DemandPredictor` of this policy's reading."""
        return DemandPredictor(self.predictor_spec)

    def describe(self) -> dict[str, Any]:
        """What the policy is, for reports (classifier kind and accuracy included)."""
        out: dict[str, Any] = {
            "policy": self.name,
            "profile": self.profile.name,
            "predictor": self.predictor_spec.describe(),
            "delivery": self.delivery.value,
        }
        if self.uses_classifier and self.classifier is not None:
            out["classifier"] = getattr(self.classifier, "description", type(self.classifier).__name__)
        return out

    # ---- helpers ------------------------------------------------------------------------

    def next_version(self) -> int:
        self._version += 1
        return self._version

    def level_ids(self) -> tuple[str, ...]:
        return self.profile.ids

    def no_worker_plan(
        self,
        stats: ClusterStats,
        levels: tuple[str, ...],
        strategy: Strategy,
        demand: float,
        notes: tuple[str, ...] = (),
    ) -> Plan:
        """The plan while no worker is up: nothing assigned, uniform shares, all demand a shortfall."""
        n = len(levels)
        return Plan(
            version=self.next_version(),
            created_s=stats.now_s,
            strategy=strategy,
            levels=levels,
            assignment={},
            share=tuple(1.0 / n for _ in range(n)),
            pasm=uniform_pasm([1.0] * n),
            predicted_qpm=demand,
            expected_quality=0.0,
            saturated=True,
            shortfall_qpm=demand,
            policy=self.name,
            notes=("no worker is up", *notes),
        )

    def static_plan(self, stats: ClusterStats, level_id: str, *, note: str = "") -> Plan:
        """Every up worker at ``level_id``; PASM sends every prompt there."""
        ids = self.profile.ids
        j = ids.index(level_id)
        share = tuple(1.0 if i == j else 0.0 for i in range(len(ids)))
        capacity = self.profile.level(level_id).peak_qpm * len(stats.workers)
        return Plan(
            version=self.next_version(),
            created_s=stats.now_s,
            strategy=self.profile.level(level_id).strategy,
            levels=ids,
            assignment={w: level_id for w in stats.workers},
            share=share,
            pasm=tuple(share for _ in ids),
            predicted_qpm=stats.arrival_qpm,
            expected_quality=self.profile.level(level_id).quality,
            saturated=stats.arrival_qpm > capacity,
            shortfall_qpm=max(0.0, stats.arrival_qpm - capacity),
            policy=self.name,
            notes=(note,) if note else (),
        )


def nearest_served(has_worker: Sequence[Any], j: int) -> int:
    """The index nearest ``j`` whose entry of ``has_worker`` (levels slowest/best first) is truthy:
    ``j`` itself, else a faster level first (keeps latency), then a slower one; ``j`` when none is.
    The data path's fallback for a PASM draw and the control loop's target for queued work of a
    level the plan no longer serves."""
    if has_worker[j]:
        return j
    n = len(has_worker)
    for d in range(1, n):
        if j + d < n and has_worker[j + d]:
            return j + d
        if j - d >= 0 and has_worker[j - d]:
            return j - d
    return j


class Routing:
    """The base of every policy's routing object (:class:`~argusdiff.domain.PlanRoute`): the data
    path's snapshot of one plan, built once per plan (the plan carries it: ``Plan.routing``) from
    the plan, the profile and the options, and never changed (immutable: setting an attribute
    raises; :func:`frozen_init` sets them). ``route()`` reads only this and the RouteView;
    ``plan()`` never touches it, so the control path may plan in another thread."""

    __slots__ = ()
    #: why :meth:`route_heavy` keeps the light image (a routing that does not cascade)
    no_heavy_reason = "the policy does not cascade: light image returned"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable (built once per plan)")

    def __getstate__(self) -> dict[str, Any]:
        """Its slots (a routed plan pickles and copies as a plan without one does)."""
        names = (n for c in type(self).__mro__ for n in getattr(c, "__slots__", ()))
        return {n: getattr(self, n) for n in names if hasattr(self, n)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        frozen_init(self, **state)

    def route(self, request: Request, view: RouteView, rng: np.random.Generator) -> Assignment:
        """One request's assignment (draws from ``rng``, the policy's generator, as the policy does)."""
        raise NotImplementedError

    def route_heavy(self, request: Request, view: RouteView) -> Assignment:
        """A cascade deferral under a routing that does not cascade: the light image is the answer."""
        return Assignment(
            level=None,
            reason=self.no_heavy_reason,
            outcome=Outcome.KEPT,
            cause=RouteReason.NO_HEAVY,
        )


class PlanRouting(Routing):
    """A routing over the plan's levels: workers per level and cumulative PASM rows. ``workers``
    overrides the plan's workers per level (argus+'s pooled AC plan: every worker at every level).
    A policy's own routing (e.g. :class:`~argusdiff.policies.argus.ArgusRouting`) extends it with
    what its ``route`` needs, taken from the plan, the profile and the options when it is built,
    never from the mutable policy."""

    __slots__ = ("_cum", "cum", "index", "levels", "workers")

    def __init__(self, plan: Plan, workers: tuple[tuple[str, ...], ...] | None = None) -> None:
        index = {lv: i for i, lv in enumerate(plan.levels)}
        if workers is None:
            per: list[list[str]] = [[] for _ in plan.levels]
            for w, lv in plan.assignment.items():
                if lv is not None and lv in index:
                    per[index[lv]].append(w)
            workers = tuple(tuple(ws) for ws in per)
        cum = tuple(np.cumsum(row) for row in plan.pasm)
        for c in cum:
            c.flags.writeable = False
        # the same sums as Python floats: a draw bisects them (what searchsorted(side="right")
        # finds on the array) without numpy's per-call overhead
        frozen_init(
            self,
            levels=plan.levels,
            index=index,
            workers=workers,
            cum=cum,
            _cum=tuple(tuple(c.tolist()) for c in cum),
        )

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for c in self.cum:
            c.flags.writeable = False

    def sample(self, row: int, u: float) -> int:
        """Level index drawn from PASM row ``row`` with uniform ``u``, restricted to levels that
        have workers (falls back to the nearest level with a worker)."""
        cum = self._cum[row]
        j = bisect_right(cum, u * cum[-1]) if cum[-1] > 0 else row
        j = min(j, len(self.levels) - 1)
        return nearest_served(self.workers, j)

    def nearest_served(self, j: int) -> int:
        return nearest_served(self.workers, j)


def frozen_init(obj: Any, **values: Any) -> None:
    """Set the attributes of an immutable per-plan routing object (its ``__setattr__`` raises)."""
    for name, value in values.items():
        object.__setattr__(obj, name, value)
