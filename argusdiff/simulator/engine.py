"""Discrete-event simulator of a serving cluster driven by one policy.

Virtual clock, deterministic for a seed. The mechanism modelled here:

* **Delivery** (the policy's :class:`~argusdiff.domain.Delivery`): with ``SHARED`` a request goes
  to the level's queue and starts on whichever of the level's workers starts it first (earliest
  start: the workers pull the one queue); with ``PER_WORKER`` it waits in the queue of the worker
  the policy picked (``Assignment.worker``), behind that worker's own backlog, and moves only when
  that worker is down (a failure re-dispatches it, and the policy picks again).
* **Workers** serve one batch at a time, pulling a level's queue highest-priority SLO tier first
  (``interactive``, ``standard``, ``batch``: :data:`argusdiff.domain.TIER_PRIORITY`; FIFO within
  a tier), as the service's work queues do. A request joins the last batch of its worker if that
  batch has not started, runs the same level and is below the plan's batch size for that level
  (greedy batching: a worker takes what is queued when it frees up); otherwise it starts a new
  batch when the worker frees up. A request of a higher-priority tier goes ahead of the batches
  not yet started on its worker that hold only lower-priority work of the same model (joining the
  first of them when it runs its level and has room); those start later by as much. Batch time is
  the profile's ``latency(b)`` times an optional log-normal jitter.
* **Model loads and residency**: a worker keeps up to ``max_resident_models`` models loaded (the
  live worker's ``[workers] max_loaded_models``, least recently used evicted first) within its
  GPU's memory (the profile's ``gpu_memory_gb`` and each level's ``memory_gb``, when given). A
  plan level or a request whose model is resident costs no load (a role swap between resident
  models is free); otherwise the worker finishes its queued work, then loads for the level's
  ``load_time_s`` (as the live worker does between batches). A plan's ``preload`` levels are
  loaded *alongside*, in the background, when memory holds them next to the resident models: the
  worker keeps serving meanwhile and work for the preloaded model starts when its load ends; a
  policy with ``replans_on_load`` is re-planned at once when such a load finishes (ARGUS §4.6).
  No queued work is dropped by a plan change.
* **Approximate caching**: a request at an AC level with K > 0 looks up the cache (retrieval
  latency added). It is a hit when a prompt served earlier on the AC model is similar enough
  (MiniLM cosine ≥ ``cache_min_similarity``, or an exact repeat when no embeddings are given);
  on a miss or while the cache store is down (lookup fails after ``cache_timeout_s``) it runs at
  K = 0. Every request served on the AC model stores its latents (the cache fills as prompts are
  served; a prompt counts as cached from its dispatch; ``cache_prefill`` caches a share of the
  prompt set before the trace starts).
* **Cascades**: a policy with ``cascade = True`` runs on a profile with light→heavy pairs (one
  ``[cascade]`` or a deployment profile's ``[[cascades]]``). After a batch at any pair's light
  level and the discriminator, a prompt whose confidence (the workload's confidences for that light
  level) is below the plan's threshold for it is handed to the policy's ``route_heavy`` at that
  moment, with ``RouteView.deferred_from`` naming the light level; the policy picks the heavy level.
* **Admission** (``SimConfig.admission``, :mod:`argusdiff.admission`): after ``policy.decide`` an
  arrival is dropped (``refused``) when it cannot finish by its deadline at its level given the
  queued requests of its tier or a higher one on the up workers serving that level, or the level
  is at its queue cap, as the live router refuses it with 429. Off in a bare ``SimConfig``;
  ``argusdiff replay`` turns it on.
* **Control period**: every ``period_s`` the simulator builds :class:`ClusterStats` (arrivals,
  queues, loaded models, affinity counts of the predicted optimal levels, cache health seen by
  lookups and probes) and applies ``policy.plan(stats)``.
* **Faults**: workers off for an interval (their queued and running requests are re-dispatched at
  the failure time, the model must be reloaded when they return); workers slower than profiled
  (every batch they start in the interval takes that many times longer); cache store down.
* **Measured latencies**: each finished batch's time against the profile goes to a
  :class:`~argusdiff.latency.LatencyEstimator`, as the service's workers report theirs; each
  period's ``ClusterStats.latency_scale`` carries the estimate.

Every request's outcome (level, finish time, quality, cache hit, drop) is kept in numpy arrays;
:mod:`argusdiff.simulator.metrics` turns them into per-minute metrics.

:class:`Simulator` holds the state and the run loop, a short one: the next event (one small class
per kind: :mod:`~argusdiff.simulator.events`), handled, until none is left. Its parts are mixed in
by concern: :mod:`~argusdiff.simulator.control` (the control period, a plan applied),
:mod:`~argusdiff.simulator.residency` (model loads and residency),
:mod:`~argusdiff.simulator.events` (the events and their order, faults, admission, cascade
hand-offs) and
:mod:`~argusdiff.simulator.workers` (delivery, pulling, batching, serving);
:mod:`~argusdiff.simulator.state` holds the request status codes and the batch they share.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argusdiff.admission import Admission, AdmissionConfig
from argusdiff.domain import (
    DEFAULT_TIER_SLO,
    ApproxLevel,
    Delivery,
    Profile,
    Request,
    Strategy,
    Tier,
    level_catalogue,
    tier_rank,
)
from argusdiff.errors import ConfigError
from argusdiff.latency import LatencyEstimator
from argusdiff.period import PeriodAccumulator
from argusdiff.policies.base import Policy, RouteView
from argusdiff.predictors import bin_length_s
from argusdiff.simulator.control import ControlPath
from argusdiff.simulator.events import EventHandling
from argusdiff.simulator.faults import Fault
from argusdiff.simulator.residency import ModelResidency
from argusdiff.simulator.state import BIG_QUEUE, DROPPED, INF, PENDING, SERVED, _Batch  # noqa: F401
from argusdiff.simulator.workers import WorkerService
from argusdiff.simulator.workload import Workload

__all__ = ["DEFAULT_TIER_SLO", "SimConfig", "SimResult", "Simulator", "simulate"]


@dataclass(frozen=True)
class SimConfig:
    gpus: int = 8
    period_s: float = 60.0
    slo_s: float | None = None  # None: the policy profile's default (3 × slowest level)
    seed: int = 0
    jitter: float = 0.0  # sigma of a log-normal multiplier on service times (0: none)
    cache_latency_s: float = 0.05  # vector lookup + latent fetch when the cache is healthy
    cache_timeout_s: float = 1.0  # a failed lookup costs this before falling back to K = 0
    cache_min_similarity: float = 0.65  # below: a miss (NIRVANA's lowest threshold)
    faults: tuple[Fault, ...] = ()
    warm_start: bool = True  # the first plan's models are loaded before the trace starts
    cache_prefill: float = 0.0  # share of the prompt set whose latents are cached before the trace
    max_resident_models: int = 2  # models a worker keeps loaded (the live [workers] max_loaded_models)
    # tier -> multiplier on ``slo_s`` for requests without an explicit per-request SLO
    tier_slo: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TIER_SLO))
    # admission after the policy, as in the service (argusdiff.admission). Off in a bare
    # SimConfig (the policy alone); `argusdiff replay` turns it on ([admission] replay)
    admission: AdmissionConfig = field(default_factory=lambda: AdmissionConfig(enabled=False))
    # workers pull a level's work highest-priority tier first and admission counts the backlog of
    # a request's tier and higher, as the service's queues do; False: one queue in arrival order and
    # the whole backlog (the replay's ``-tiers`` ablation: the system without tier awareness)
    tier_priority: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.admission, AdmissionConfig):
            raise ConfigError(f"admission: expected an AdmissionConfig, got {type(self.admission).__name__}")
        for tier, factor in self.tier_slo.items():
            if not (isinstance(factor, int | float) and math.isfinite(factor) and factor > 0):
                raise ConfigError(f"tier_slo: multiplier of tier {tier!r} must be a positive number, got {factor!r}")
        if self.gpus < 1:
            raise ConfigError(f"gpus must be >= 1, got {self.gpus}")
        if self.period_s <= 0:
            raise ConfigError(f"period must be positive, got {self.period_s}")
        if self.slo_s is not None and self.slo_s <= 0:
            raise ConfigError(f"slo must be positive, got {self.slo_s}")
        if self.jitter < 0:
            raise ConfigError(f"jitter must be >= 0, got {self.jitter}")
        if not 0.0 <= self.cache_prefill <= 1.0:
            raise ConfigError(f"cache prefill must be in [0, 1], got {self.cache_prefill}")
        if self.max_resident_models < 1:
            raise ConfigError(f"max_resident_models must be >= 1, got {self.max_resident_models}")


@dataclass
class SimResult:
    policy: str
    description: dict[str, Any]
    config: SimConfig
    slo_s: float
    workload: Workload
    req_slo_s: np.ndarray  # each request's SLO (seconds after arrival)
    tier_names: tuple[str, ...]  # tiers present, indexed by ``tier``
    tier: np.ndarray  # per request index into ``tier_names``
    level_ids: tuple[str, ...]  # catalog of every level the run could use
    level_profile: tuple[str, ...]  # profile name per catalog level
    status: np.ndarray
    finish_s: np.ndarray
    level: np.ndarray  # catalog index of the level that served (-1: dropped)
    quality: np.ndarray  # raw score of the served image
    relative: np.ndarray  # score relative to the prompt's best level
    cache_hit: np.ndarray
    cache_miss: np.ndarray  # routed to an AC level with K > 0, served at the K = 0 level (miss or cache down)
    best_effort: np.ndarray
    deferred: np.ndarray
    worker: np.ndarray  # per request the index of the worker that served it (-1: none); ids w0, w1, ...
    busy: list[tuple[int, float, float]]  # (worker, start, end) of every batch
    loads: list[tuple[int, float, float, str]]  # (worker, start, end, model)
    up_intervals: list[tuple[int, float, float]]  # (worker, start, end) when the worker was up
    plans: list[dict[str, Any]] = field(default_factory=list)
    end_s: float = 0.0
    wall_s: float = 0.0
    refused: np.ndarray | None = None  # dropped by admission (a subset of status == DROPPED)
    # refused although, queued at its routed level when it arrived, it would have met its SLO
    false_refused: np.ndarray | None = None


class _Queues(Mapping[str, int]):
    """Queue length per worker id, brought up to date lazily when read: a worker's finished
    batches leave its queue as the clock passes them. (The run itself hands the policy a plain
    dict that :meth:`Simulator._sync` keeps current: ``RouteView.queue_lengths``.)"""

    __slots__ = ("sim",)

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim

    def get(self, wid: str, default: int = 0) -> int:
        sim = self.sim
        w = sim.widx.get(wid)
        if w is None:
            return default
        if not sim.up[w]:
            return BIG_QUEUE
        dq = sim.dq[w]
        now = sim.now
        while dq and dq[0].finish <= now:
            sim.qlen[w] -= dq.popleft().size
        return sim.qlen[w]

    def __getitem__(self, wid: str) -> int:
        if wid not in self.sim.widx:
            raise KeyError(wid)
        return self.get(wid)

    def __contains__(self, wid: object) -> bool:
        return wid in self.sim.widx

    def __iter__(self) -> Iterator[str]:
        return iter(self.sim.wids)

    def __len__(self) -> int:
        return len(self.sim.wids)


class Simulator(ModelResidency, WorkerService, EventHandling, ControlPath):
    def __init__(
        self,
        policy: Policy,
        workload: Workload,
        config: SimConfig | None = None,
        *,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.policy = policy
        self.wl = workload
        self.cfg = config or SimConfig()
        self.progress = progress
        cfg = self.cfg
        self.slo_s = cfg.slo_s if cfg.slo_s is not None else policy.profile.default_slo_s()
        self._request_slos()
        # the policy's profile and any it may switch to (ARGUS's smaller-model fallback)
        profiles: list[Profile] = [policy.profile]
        for other in policy.known_profiles():
            if other.name not in {p.name for p in profiles}:
                profiles.append(other)
        self.profiles = profiles
        for prof in profiles:
            missing = [lv for lv in prof.ids if lv not in workload.quality]
            if missing:
                raise ConfigError(
                    f"policy {policy.name!r}: the quality source has no scores for level(s) {', '.join(missing)} "
                    f"of profile {prof.name!r}"
                )
        # the router's level table (a level both profiles list is the profile's)
        self.levels: dict[str, ApproxLevel] = level_catalogue(*profiles)
        self.level_profile: dict[str, Profile] = {lv: next(p for p in profiles if lv in p.ids) for lv in self.levels}
        self.catalog = tuple(self.levels)
        self.cat_index = {lv: i for i, lv in enumerate(self.catalog)}
        # an AC level that misses the cache runs at K = 0 on its model (the profile's best level of
        # that model; mixed ladders hold small models too, so not simply levels[0])
        self.ac_base = {
            lv.id: self.level_profile[lv.id].ac_base(lv.id).id
            for lv in self.levels.values()
            if lv.strategy is Strategy.AC
        }
        self.cascade = policy.cascade
        # light level id -> its pair (every pair the policy's profile lists)
        self.specs = {c.light: c for c in policy.profile.cascade_specs} if self.cascade else {}
        self.confidences: dict[str, np.ndarray] = {}
        if self.cascade:
            if not self.specs:
                raise ConfigError(f"policy {policy.name!r} needs a cascade profile, got {policy.profile.name!r}")
            for light in self.specs:
                conf = workload.confidences.get(light, workload.confidence)
                if conf is None:
                    raise ConfigError(
                        f"policy {policy.name!r} needs discriminator confidences in the workload "
                        f"(light level {light!r})"
                    )
                self.confidences[light] = conf
        self.needs_similarity = any(lv.strategy is Strategy.AC for lv in self.levels.values())
        # GPU memory: the model sizes the profiles give and the GPU's (None: not modelled)
        self.model_memory: dict[str, float] = {}
        for lv in self.levels.values():
            if lv.memory_gb is not None:
                self.model_memory.setdefault(lv.model, lv.memory_gb)
        mems = [p.gpu_memory_gb for p in profiles if p.gpu_memory_gb is not None]
        self.gpu_memory = min(mems) if mems else None
        self.replans_on_load = policy.replans_on_load
        # the policy's delivery: its own worker choice honoured, or the level's shared pull
        self.per_worker = policy.delivery is Delivery.PER_WORKER
        # demand bins of each period, as the live control loop counts them
        self.bin_s = bin_length_s(policy.predictor_spec)
        if policy.profile.ids not in workload.optimal:
            workload.optimal_for(policy.profile)  # a merged ladder: derive its optimal levels up front

    def _request_slos(self) -> None:
        """Each request's SLO: its explicit SLO when the workload has one, else the deployment
        SLO times its tier's multiplier (``SimConfig.tier_slo``; ``standard`` when untiered)."""
        wl, cfg = self.wl, self.cfg
        n = wl.n_requests
        if wl.tier is None:
            names: tuple[str, ...] = (Tier.STANDARD.value,)
            codes = np.zeros(n, dtype=np.int8)
        else:
            names = tuple(sorted(set(wl.tier)))
            pos = {t: k for k, t in enumerate(names)}
            codes = np.fromiter((pos[t] for t in wl.tier), dtype=np.int8, count=n)
        unknown = [t for t in names if t not in cfg.tier_slo]
        if unknown:
            raise ConfigError(
                f"tier_slo: no SLO multiplier for tier(s) {', '.join(map(repr, unknown))} of the trace "
                f"(configured: {', '.join(cfg.tier_slo)})"
            )
        factors = np.array([cfg.tier_slo[t] for t in names], dtype=np.float64)
        slo = self.slo_s * factors[codes]
        if wl.slo_s is not None:
            explicit = np.isfinite(wl.slo_s)
            slo = np.where(explicit, wl.slo_s, slo)
        self.req_slo = slo
        self.tier_names = names
        self.tier_codes = codes
        # each request's pull rank (argusdiff.domain.TIER_PRIORITY: 0, interactive, is pulled first)
        self.req_rank = np.array([tier_rank(t) for t in names], dtype=np.int8)[codes]
        if not cfg.tier_priority:
            self.req_rank = np.zeros_like(self.req_rank)  # one rank: arrival order, the whole backlog
        self.max_rank = int(self.req_rank.max()) if n else 0  # the lowest-priority tier present
        # Request objects carry the tier as the domain enum when it is one, else the name
        self._tier_obj = tuple(Tier(t) if t in Tier._value2member_map_ else t for t in names)
        self._explicit = wl.slo_s is not None or wl.tier is not None or wl.min_quality is not None
        # the per-request values the data path reads one at a time, as Python numbers (a list
        # index costs less than a numpy scalar's; the values are the arrays')
        self._arr_l: list[float] = wl.arrivals_s.tolist()
        self._slo_l: list[float] = slo.tolist()
        self._rank_l: list[int] = self.req_rank.tolist()

    def _request(self, i: int, p: int) -> Request:
        if not self._explicit:
            return Request(id=str(i), prompt=self.wl.prompts[p], arrival_s=self._arr_l[i], prompt_idx=p)
        return Request(
            id=str(i),
            prompt=self.wl.prompts[p],
            arrival_s=self._arr_l[i],
            prompt_idx=p,
            slo_s=self._slo_l[i],
            tier=self._tier_obj[self.tier_codes[i]],  # type: ignore[arg-type]
            min_quality_level=self.wl.min_quality[i] if self.wl.min_quality is not None else None,
        )

    # ---- cache model ---------------------------------------------------------------------

    def cache_up(self, t: float) -> bool:
        return all(not s <= t < e for s, e in self.cache_down)

    def similarity(self, p: int) -> float:
        if self.cached[p]:
            return 1.0
        nb = self.wl.neighbours
        if nb is None:
            return 0.0
        cached = self.cached
        row = nb[p]
        for j in range(row.shape[0]):
            if cached[row[j]]:
                return float(self.wl.neighbour_sim[p, j])
        return 0.0

    # ---- run -------------------------------------------------------------------------------

    def run(self) -> SimResult:
        """Replay the workload: each event (:mod:`argusdiff.simulator.events`) in order, handled."""
        t_wall = time.perf_counter()
        self._start(self.wl.n_requests, self.cfg.gpus)
        next_event = self._next_event
        while (ev := next_event()) is not None:
            ev.handle(self)
        return self._result(t_wall)

    def _start(self, n: int, G: int) -> None:
        """The state of a run of ``n`` requests on ``G`` workers, before its first event: queues,
        residency, the cache, per-request outcome arrays, admission, the policy's view and the
        run's clock (:meth:`_start_clock`)."""
        wl, cfg = self.wl, self.cfg
        self.wids = tuple(f"w{k}" for k in range(G))
        self.widx = {w: k for k, w in enumerate(self.wids)}
        self.up = [True] * G
        self.dq: list[deque] = [deque() for _ in range(G)]
        self.qlen = [0] * G
        # queue length per worker id as the policy reads it (RouteView.queue_lengths; BIG_QUEUE for
        # a worker that is down), kept current by _sync from a heap of batch finish times
        self.qd: dict[str, int] = {w: 0 for w in self.wids}
        self._fin: list[tuple[float, int]] = []
        self._upv = 0  # bumped when a worker goes down or comes back (admission's serving workers)
        self._adm_key: tuple[Any, int] = (None, -1)
        self._adm_ws: dict[str, tuple[str, ...]] = {}
        self.free_at = [0.0] * G
        self.model: list[str | None] = [None] * G  # model of the worker's planned level
        # models loaded on each worker -> the time each is ready, least recently used first
        self.resident: list[dict[str, float]] = [{} for _ in range(G)]
        self.pinned: list[frozenset[str]] = [frozenset() for _ in range(G)]  # planned + preloaded models
        self.wlevel: list[str | None] = [None] * G
        self.load_end = [0.0] * G
        self.up_since = [0.0] * G
        self.up_intervals: list[tuple[int, float, float]] = []
        self.cached = np.zeros(len(wl.prompts), dtype=bool)
        if cfg.cache_prefill > 0:
            pre = np.random.default_rng([cfg.seed, 2]).random(len(wl.prompts)) < cfg.cache_prefill
            self.cached |= pre
        self.cache_down = [(f.start_s, f.end_s) for f in cfg.faults if f.kind == "cache"]
        # workers slower than the profile (fault "slow"): (start, end, first n workers, factor)
        self.slow = [(f.start_s, f.end_s, f.count, f.factor) for f in cfg.faults if f.kind == "slow"]
        # what workers report: each batch's measured time against the profile, once it finished
        self.latency = LatencyEstimator()
        self._ran: deque = deque()
        self.now = 0.0
        rng = np.random.default_rng([cfg.seed, 1])
        jit = np.exp(rng.normal(0.0, cfg.jitter, n)) if cfg.jitter > 0 else None
        self.jit = jit

        self.status = np.zeros(n, dtype=np.int8)
        self.level_arr = np.full(n, -1, dtype=np.int16)
        self.quality = np.zeros(n, dtype=np.float64)
        self.relative = np.zeros(n, dtype=np.float64)
        self.hit = np.zeros(n, dtype=bool)
        self.miss = np.zeros(n, dtype=bool)
        self.best_effort = np.zeros(n, dtype=bool)
        self.deferred = np.zeros(n, dtype=bool)
        self.worker_arr = np.full(n, -1, dtype=np.int32)
        self.refused = np.zeros(n, dtype=bool)
        self.false_refused = np.zeros(n, dtype=bool)
        admission = Admission(self.levels, cfg.admission) if cfg.admission.enabled else None
        self.admission = admission
        self.req_batch: list[list | None] = [None] * n
        self.epoch = np.zeros(n, dtype=np.int32)
        self.busy: list[list] = []
        self.loads: list[tuple[int, float, float, str]] = []
        self.plans: list[dict[str, Any]] = []
        self.period = PeriodAccumulator()  # the current period's routing and cache lookups
        self.waiting: list[int] = []  # requests accepted while no worker was up
        self.pullers: dict[str, list[int]] = {}

        # one deadline for the policy's routing and admission (argusdiff.deadline)
        view = RouteView(slo_s=self.slo_s, deadline_factor=cfg.admission.deadline_factor if admission else 1.0)
        view.queue_lengths = self.qd
        view.busy_until = {w: 0.0 for w in self.wids}
        view.worker_models = {w: None for w in self.wids}
        view.up = set(self.wids)
        self.view = view

        self._start_clock(n)

    def _result(self, t_wall: float) -> SimResult:
        """The run's :class:`SimResult` once its last event is done."""
        wl, cfg, policy = self.wl, self.cfg, self.policy
        n = wl.n_requests
        arr = wl.arrivals_s
        G = cfg.gpus
        for i in self.waiting:  # no worker ever came back for them
            self.status[i] = DROPPED
        end = max([b.finish for b in self.busy] + [self.now, float(arr[-1]) if n else 0.0])
        for w in range(G):
            if self.up[w]:
                self.up_intervals.append((w, self.up_since[w], end))
        finish = np.full(n, np.nan)
        for k, b in enumerate(self.req_batch):
            if b is not None and self.status[k] == SERVED:
                finish[k] = b.finish
        if self.progress is not None:
            self.progress(1.0)
        desc = policy.describe()
        desc["classifier"] = wl.classifier if policy.uses_classifier else "none"
        if desc["classifier"] != "none" and wl.derived_optimal.get(policy.profile.ids):
            desc["classifier"] = wl.derived_optimal[policy.profile.ids]
        return SimResult(
            policy=policy.name,
            description=desc,
            config=cfg,
            slo_s=self.slo_s,
            workload=wl,
            req_slo_s=self.req_slo,
            tier_names=self.tier_names,
            tier=self.tier_codes,
            level_ids=self.catalog,
            level_profile=tuple(self.level_profile[lv].name for lv in self.catalog),
            status=self.status,
            finish_s=finish,
            level=self.level_arr,
            quality=self.quality,
            relative=self.relative,
            cache_hit=self.hit,
            cache_miss=self.miss,
            best_effort=self.best_effort,
            deferred=self.deferred,
            worker=self.worker_arr,
            busy=[(b.worker, b.start, b.finish) for b in self.busy if b.finish > b.start],
            loads=self.loads,
            up_intervals=self.up_intervals,
            plans=self.plans,
            end_s=end,
            wall_s=time.perf_counter() - t_wall,
            refused=self.refused,
            false_refused=self.false_refused,
        )

    def _sync(self, now: float) -> None:
        """Take the batches finished by ``now`` off their workers' queues (``qd``, the queue
        lengths the policy and admission read): the heap holds every finish time a batch was
        given, so the current head of every queue is in it (stale entries cost a look)."""
        fin = self._fin
        dqs, qlen, qd, wids, up = self.dq, self.qlen, self.qd, self.wids, self.up
        pop = heapq.heappop
        while fin and fin[0][0] <= now:
            w = pop(fin)[1]
            dq = dqs[w]
            while dq and dq[0].finish <= now:
                qlen[w] -= dq.popleft().size
            if up[w]:
                qd[wids[w]] = qlen[w]


def simulate(
    policy: Policy,
    workload: Workload,
    config: SimConfig | None = None,
    *,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """Replay ``workload`` through ``policy`` on a simulated cluster."""
    return Simulator(policy, workload, config, progress=progress).run()
