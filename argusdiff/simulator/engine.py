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
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argusdiff.admission import ADMITTED, Admission, AdmissionConfig, Decision
from argusdiff.domain import (
    ApproxLevel,
    ClusterStats,
    Delivery,
    Plan,
    Profile,
    Request,
    Strategy,
    Tier,
    level_catalogue,
    tier_rank,
)
from argusdiff.errors import ConfigError
from argusdiff.latency import LatencyEstimator
from argusdiff.period import PeriodAccumulator, PeriodStats, cluster_stats
from argusdiff.policies.base import Policy, RouteView
from argusdiff.predictors import bin_length_s
from argusdiff.simulator.faults import Fault
from argusdiff.simulator.workload import Workload

__all__ = ["DEFAULT_TIER_SLO", "SimConfig", "SimResult", "Simulator", "simulate"]

# SLO multiplier per tier on the deployment SLO (batch work tolerates 4x the delay)
DEFAULT_TIER_SLO: dict[str, float] = {"interactive": 1.0, "standard": 1.0, "batch": 4.0}

INF = math.inf
# request status
PENDING, SERVED, DROPPED = 0, 1, 2
BIG_QUEUE = 10**9


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


@dataclass(slots=True)
class _Batch:
    """One batch on a worker's queue, mutated in place as requests join it and earlier batches
    move. ``rank``: the best (lowest) tier rank of its members."""

    start: float
    finish: float
    size: int
    level: str  # the level id it runs
    members: list[int]  # request indices
    worker: int
    jit: float  # the log-normal multiplier on its service time
    extra: float  # seconds added to its latency (lookups, discriminator)
    rank: int


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


class Simulator:
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
        import time

        t_wall = time.perf_counter()
        wl, cfg, policy = self.wl, self.cfg, self.policy
        n = wl.n_requests
        arr = wl.arrivals_s
        pidx = wl.prompt_idx
        arr_l = self._arr_l
        pidx_l: list[int] = pidx.tolist()
        G = cfg.gpus
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

        heap: list[tuple] = []
        seq = 0
        for f in cfg.faults:
            if f.kind == "gpus":
                heapq.heappush(heap, (f.start_s, seq, "down", f.count, f.duration_s))
                seq += 1
        self.seq = seq
        self.heap = heap

        plan: Plan | None = None
        next_tick = 0.0
        i = 0
        last_tick_i = 0
        period = cfg.period_s
        route = policy.decide
        report_every = max(1, n // 200)
        optimal = wl.optimal
        cur_opt: np.ndarray | None = None
        cur_ids: tuple[str, ...] = ()
        needs_sim = self.needs_similarity
        first_plan = True

        while True:
            ta = arr_l[i] if i < n else INF
            te = heap[0][0] if heap else INF
            if i >= n and not heap:
                break
            if next_tick <= ta and next_tick <= te:
                self.now = next_tick
                self._sync(next_tick)
                if first_plan:
                    # the cluster was running before the trace starts: the first plan sees the
                    # first period's arrivals (otherwise every policy starts planned for 0 QPM)
                    j0 = int(np.searchsorted(arr, period, side="left"))
                    stats = self._stats(next_tick, period, j0, pidx[:j0], arr[:j0] - period, tiers=self.tier_codes[:j0])
                else:
                    stats = self._stats(
                        next_tick,
                        period,
                        i - last_tick_i,
                        pidx[last_tick_i:i],
                        arr[last_tick_i:i],
                        tiers=self.tier_codes[last_tick_i:i],
                    )
                last_tick_i = i
                plan = policy.plan(stats)
                self._apply(plan, next_tick, first_plan and cfg.warm_start)
                first_plan = False
                cur_ids = plan.levels
                cur_opt = optimal.get(cur_ids)
                if cur_opt is None and cur_ids == policy.profile.ids:
                    cur_opt = wl.optimal_for(policy.profile)
                next_tick += period
                continue
            if te < ta:
                ev = heapq.heappop(heap)
                self.now = ev[0]
                self._sync(ev[0])
                if ev[2] == "loaded":
                    # ARGUS §4.6: re-solve as soon as a model finishes loading (once for every
                    # load that finishes at this instant)
                    fresh = self.up[ev[3]] and self.resident[ev[3]].get(ev[4]) == ev[0]
                    while heap and heap[0][0] == ev[0] and heap[0][2] == "loaded":
                        more = heapq.heappop(heap)
                        fresh = fresh or (self.up[more[3]] and self.resident[more[3]].get(more[4]) == more[0])
                    if fresh:
                        stats = self._stats(ev[0], period, 0, pidx[:0], arr[:0], reason="loaded")
                        plan = policy.plan(stats)
                        self._apply(plan, ev[0], False)
                        cur_ids = plan.levels
                        cur_opt = optimal.get(cur_ids)
                        if cur_opt is None and cur_ids == policy.profile.ids:
                            cur_opt = wl.optimal_for(policy.profile)
                    continue
                self._event(ev, plan)
                continue
            # an arrival
            t = ta
            self.now = t
            if self._fin and self._fin[0][0] <= t:
                self._sync(t)
            p = pidx_l[i]
            view.now_s = t
            view.optimal_level = cur_ids[cur_opt[p]] if cur_opt is not None else None
            up_cache = self.cache_up(t) if self.cache_down else True
            view.cache_healthy = up_cache
            if needs_sim:
                view.cache_similarity = self.similarity(p) if up_cache else None
            req = self._request(i, p)
            a = route(req, plan, view)
            if a.dropped or a.level is None:
                self.status[i] = DROPPED
            elif admission is not None and not self._admit(i, a.level, plan, t, a.verdict).admitted:
                self.status[i] = DROPPED
                self.refused[i] = True
                # a false refusal: queued there and then, it would have finished within its SLO
                would = self._would_finish(i, p, t, a.level, plan, a.worker)
                self.false_refused[i] = would <= arr_l[i] + self._slo_l[i] + 1e-9
            else:
                self.best_effort[i] = a.best_effort
                self._serve(i, p, t, a.level, plan, stage=0, worker=a.worker)
            i += 1
            if self.progress is not None and i % report_every == 0:
                self.progress(i / n)
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

    # ---- control path --------------------------------------------------------------------

    def _stats(
        self,
        t: float,
        period: float,
        arrivals: int,
        recent: np.ndarray,
        times: np.ndarray,
        reason: str = "period",
        tiers: np.ndarray | None = None,
    ) -> ClusterStats:
        """What the policy sees at ``t``: ``recent`` the prompt indices and ``times`` the arrival
        times of the period ``[t - period, t)`` (binned for the demand predictor as the live control
        loop bins them: :func:`argusdiff.predictors.arrival_bins`)."""
        ups = tuple(w for k, w in enumerate(self.wids) if self.up[k])
        q = self.qd
        queue_lengths = {w: q[w] for w in ups}
        current = {w: self.wlevel[self.widx[w]] for w in ups}
        loading = {
            w: self.wlevel[self.widx[w]]
            for w in ups
            if self.load_end[self.widx[w]] > t and self.wlevel[self.widx[w]] is not None
        }
        resident = {w: tuple(m for m, r in self.resident[self.widx[w]].items() if r <= t) for w in ups}
        affinity: dict[str, int] = {}
        if len(recent):
            for ids, pred in self.wl.optimal.items():
                if not all(lv in self.levels for lv in ids):
                    continue
                counts = np.bincount(pred[recent], minlength=len(ids))
                for lv, c in zip(ids, counts, strict=True):
                    affinity[lv] = int(c)
        down = 0.0
        lo = t - period
        for s, e in self.cache_down:
            down += max(0.0, min(e, t) - max(s, lo))
        err = down / period
        if not self.cache_up(t):
            err = 1.0  # the probes at this tick fail
        cache_latency = self.cfg.cache_latency_s if self.cache_up(t) else self.cfg.cache_timeout_s
        level_queue: dict[str, int] = {}
        for w in ups:
            lv = self.wlevel[self.widx[w]]
            if lv is not None:
                level_queue[lv] = level_queue.get(lv, 0) + queue_lengths[w]
        if reason == "period":
            tier_arrivals: dict[str, int] = {}
            if tiers is not None and len(tiers):
                counts = np.bincount(tiers, minlength=len(self.tier_names))
                tier_arrivals = {name: int(c) for name, c in zip(self.tier_names, counts, strict=True) if c}
            # the period's arrivals join what the accumulator counted as they were routed
            times_ = tuple(times.tolist())
            self.period.add(PeriodStats(int(arrivals), affinity, tier_arrivals=tier_arrivals, arrival_times=times_))
            seen = self.period.take(self._measured(t))
        else:
            seen = PeriodStats(int(arrivals), latency_scale=self._measured(t))
        # binned for the demand predictor as the live control loop bins them
        return cluster_stats(
            seen,
            now_s=t,
            period_s=period,
            bin_s=self.bin_s,
            reason=reason,
            with_cache=self.needs_similarity,
            workers=ups,
            queue_lengths=queue_lengths,
            current=current,
            loading=loading,
            cache_latency_s=cache_latency if self.needs_similarity else None,
            cache_error_rate=err if self.needs_similarity else 0.0,
            level_queue=level_queue,
            resident=resident,
        )

    def _apply(self, plan: Plan, t: float, warm: bool) -> None:
        widx = self.widx
        # which workers pull each level's queue (workers.loop): its planned workers, and for an AC
        # level the plan gives no worker, the workers of a level of the same model and N
        pullers: dict[str, list[int]] = {}
        for wid, lv in plan.assignment.items():
            if lv is not None and wid in widx:
                pullers.setdefault(lv, []).append(widx[wid])
        for lv in list(pullers):
            for sib in plan.unserved_siblings(self.levels, lv):
                pullers.setdefault(sib, []).extend(pullers[lv])
        self.pullers = pullers
        for wid, lv in plan.assignment.items():
            w = widx.get(wid)
            if w is None:
                raise ConfigError(f"policy {self.policy.name!r} planned unknown worker {wid!r}")
            self.wlevel[w] = lv
            level = self.levels.get(lv) if lv is not None else None
            if lv is not None and level is None:
                raise ConfigError(f"policy {self.policy.name!r} planned unknown level {lv!r}")
            pre = []
            for p in plan.preload.get(wid, ()):
                plv = self.levels.get(p)
                if plv is None:
                    raise ConfigError(f"policy {self.policy.name!r} preloads unknown level {p!r}")
                pre.append(plv)
            self.pinned[w] = frozenset([level.model] if level is not None else []) | {x.model for x in pre}
            if level is None or not self.up[w]:
                continue
            self.model[w] = level.model
            self.view.worker_models[wid] = level.model
            self._need(w, level, t, warm=warm)
            for plv in pre:
                self._preload(w, plv, t, warm=warm)
        self.plans.append(
            {
                "t": t,
                "version": plan.version,
                "strategy": plan.strategy.value,
                "counts": dict(zip(plan.levels, plan.counts(), strict=True)),
                "predicted_qpm": plan.predicted_qpm,
                "workers": sum(1 for lv in plan.assignment.values() if lv is not None),
                "saturated": plan.saturated,
                "margin": plan.margin,
                "thresholds": dict(plan.thresholds),
                "latency_scale": dict(plan.latency_scale),
                "notes": list(plan.notes),
            }
        )

    # ---- model residency ---------------------------------------------------------------------

    def _fits(self, w: int, model: str, keep: set[str]) -> bool:
        """Whether ``model`` fits on ``w`` next to the resident models in ``keep``."""
        if len(keep) + 1 > self.cfg.max_resident_models:
            return False
        if self.gpu_memory is None:
            return True
        mem = self.model_memory
        used = sum(mem.get(m, 0.0) for m in sorted(keep))  # sorted: a set's order follows the hash seed
        return used + mem.get(model, 0.0) <= self.gpu_memory + 1e-9

    def _in_use(self, w: int, t: float) -> set[str]:
        """Models of batches on ``w`` that have not finished at ``t``."""
        return {self.levels[b.level].model for b in self.dq[w] if b.finish > t}

    def _make_room(self, w: int, model: str, keep: set[str]) -> bool:
        """Evict least recently used models of ``w`` outside ``keep`` until ``model`` fits."""
        res = self.resident[w]
        while True:
            current = set(res)
            if self._fits(w, model, current):
                return True
            victims = [m for m in res if m not in keep]
            if not victims:
                return False
            del res[victims[0]]

    def _need(self, w: int, level: ApproxLevel, t: float, *, warm: bool = False) -> float:
        """The time ``level``'s model is ready on ``w``: at once when resident, else after a load
        that waits for the worker's queued work (the old model may have to leave memory)."""
        res = self.resident[w]
        model = level.model
        if model in res:
            ready = res.pop(model)
            res[model] = ready  # most recently used
            return ready
        if warm:
            self._make_room(w, model, set(self.pinned[w]))
            res[model] = 0.0
            return 0.0
        start = max(t, self.free_at[w])
        # by ``start`` the queued work is done: only the plan's other models are worth keeping
        if not self._make_room(w, model, set(self.pinned[w]) - {model}):
            self._make_room(w, model, set())
        end = start + level.load_time_s
        res[model] = end
        self.loads.append((w, start, end, model))
        self.free_at[w] = end
        self.load_end[w] = end
        self.view.busy_until[self.wids[w]] = end
        return end

    def _preload(self, w: int, level: ApproxLevel, t: float, *, warm: bool = False) -> None:
        """Load ``level``'s model alongside the resident ones (background; the worker keeps
        serving) when GPU memory holds it next to the models the worker uses or plans."""
        res = self.resident[w]
        model = level.model
        if model in res:
            return
        keep = set(self.pinned[w]) | self._in_use(w, t)
        keep.discard(model)
        if not self._make_room(w, model, keep):
            return  # does not fit next to what the worker needs: loaded when first used instead
        if warm:
            res[model] = 0.0
            return
        end = t + level.load_time_s
        res[model] = end
        self.loads.append((w, t, end, model))
        self.load_end[w] = max(self.load_end[w], end)
        if self.replans_on_load:
            self._push(end, "loaded", w, model)

    # ---- events ----------------------------------------------------------------------------

    def _push(self, t: float, *payload: Any) -> None:
        heapq.heappush(self.heap, (t, self.seq, *payload))
        self.seq += 1

    def _event(self, ev: tuple, plan: Plan | None) -> None:
        t, _, kind = ev[0], ev[1], ev[2]
        if kind == "down":
            self._workers_down(t, ev[3], ev[4])
        elif kind == "up":
            w = ev[3]
            self.up[w] = True
            self.up_since[w] = t
            self.free_at[w] = t
            self.model[w] = None
            self.resident[w].clear()
            self.view.worker_models[self.wids[w]] = None
            self.view.busy_until[self.wids[w]] = t
            self.view.up.add(self.wids[w])
            self._upv += 1
            self.qd[self.wids[w]] = self.qlen[w]
            for i in self.waiting:
                self.epoch[i] += 1
                self._push(t, "redispatch", i)
            self.waiting.clear()
        elif kind == "redispatch":
            i = ev[3]
            self._redispatch(i, t, plan)
        elif kind == "defer":
            i, epoch, batch = ev[3], ev[4], ev[5]
            if self.epoch[i] != epoch or self.status[i] != SERVED:
                return
            ready = batch.finish
            if ready > t + 1e-12:  # the light batch grew after this event was scheduled
                self._push(ready, "defer", i, epoch, batch)
                return
            self._defer(i, t, plan, batch.level)

    def _workers_down(self, t: float, count: int, duration: float) -> None:
        victims = [w for w in range(len(self.wids) - 1, -1, -1) if self.up[w]][:count]
        for w in victims:
            self.up[w] = False
            self.up_intervals.append((w, self.up_since[w], t))
            wid = self.wids[w]
            self.view.up.discard(wid)
            self._upv += 1
            self.view.busy_until[wid] = INF
            self.model[w] = None
            self.resident[w].clear()  # loads in progress are lost with the worker
            self.view.worker_models[wid] = None
            for b in self.dq[w]:
                if b.finish <= t:
                    continue
                b.finish = max(b.start, t) if b.start < t else b.start
                for i in b.members:
                    self.status[i] = PENDING
                    self.worker_arr[i] = -1
                    self.epoch[i] += 1
                    self._push(t, "redispatch", i)
            self.dq[w].clear()
            self.qlen[w] = 0
            self.qd[wid] = BIG_QUEUE
            # loads in progress are lost with the worker
            self.free_at[w] = INF
            self._push(t + duration, "up", w)

    def _redispatch(self, i: int, t: float, plan: Plan | None) -> None:
        p = int(self.wl.prompt_idx[i])
        view = self.view
        view.now_s = t
        ids = plan.levels if plan is not None else ()
        opt = self.wl.optimal.get(ids)
        if opt is None and ids and ids == self.policy.profile.ids:
            opt = self.wl.optimal_for(self.policy.profile)
        view.optimal_level = ids[opt[p]] if opt is not None else None
        up_cache = self.cache_up(t)
        view.cache_healthy = up_cache
        if self.needs_similarity:
            view.cache_similarity = self.similarity(p) if up_cache else None
        req = self._request(i, p)
        a = self.policy.decide(req, plan, view)
        if a.dropped or a.level is None:
            self.status[i] = DROPPED
            return
        self._serve(i, p, t, a.level, plan, stage=0, worker=a.worker)

    def _would_finish(
        self, i: int, p: int, t: float, level_id: str, plan: Plan | None, worker: str | None = None
    ) -> float:
        """When arrival ``i`` (prompt ``p``) would finish had it been queued at ``level_id`` at
        ``t``, as :meth:`_serve` would place it (nothing changes): the counterfactual behind the
        false-refusal count."""
        lv = self.levels.get(level_id)
        if lv is None:
            return INF
        served, extra = lv, 0.0
        if lv.strategy is Strategy.AC and lv.skip > 0:
            if self.cache_down and not self.cache_up(t):
                served, extra = self.levels[self.ac_base[level_id]], self.cfg.cache_timeout_s
            else:
                extra = self.cfg.cache_latency_s
                if self.similarity(p) < self.cfg.cache_min_similarity:
                    served = self.levels[self.ac_base[level_id]]
        spec = self.specs.get(served.id)
        if spec is not None:
            extra += spec.discriminator_latency_s
        bsize = plan.batch_sizes.get(served.id, 1) if plan is not None and plan.batch_sizes else 1
        rank = self._rank_l[i]
        w = self._deliver_to(worker)
        if w is None:
            w = self._puller(level_id, served, t, bsize, rank)
        if w is None:
            w = self._pick_up_worker(lv, t)
            if w is None:
                return INF
        jit = self.jit[i] if self.jit is not None else 1.0
        dq = self.dq[w]
        while dq and dq[0].finish <= t:
            self.qlen[w] -= dq.popleft().size
            self.qd[self.wids[w]] = self.qlen[w]
        start, k, join = self._slot(w, served, t, bsize, rank)
        if join:
            b = dq[k]
            return b.start + served.latency(b.size + 1) * b.jit + max(b.extra, extra)
        if k == len(dq):
            ready = self.resident[w].get(served.model)
            start = max(self.free_at[w], t, ready if ready is not None else t + served.load_time_s)
        if self.slow:
            jit *= self._speed(w, start)
        return start + served.latency(1) * jit + extra

    def _speed(self, w: int, t: float) -> float:
        """How many times slower than profiled worker ``w`` runs a batch that starts at ``t``."""
        f = 1.0
        for s, e, n, factor in self.slow:
            if w < n and s <= t < e:
                f *= factor
        return f

    def _measured(self, t: float) -> dict[str, float]:
        """Feed the batches finished by ``t`` to the latency estimator, as workers report them;
        the estimate per level (``ClusterStats.latency_scale``)."""
        ran = self._ran
        est = self.latency
        while ran and ran[0].finish <= t:
            b = ran.popleft()
            if b.finish <= b.start:  # cut short by a failure: no measurement
                continue
            lv = self.levels[b.level]
            prof = lv.latency(b.size)
            est.observe(b.level, prof * b.jit, prof)
        return est.scales()

    def _admit(self, i: int, level_id: str, plan: Plan | None, t: float, verdict=None) -> Decision:
        """Admission (argusdiff.admission) of arrival ``i`` routed to ``level_id``: the requests
        queued or in service on the up workers serving the level that it waits behind (those of
        its tier or a higher one: workers pull the highest-priority tier first), as the service's
        in-flight count of the level and tier."""
        if plan is None:
            return ADMITTED
        adm = self.admission
        if verdict is not None:  # the policy judged the deadline: admission takes its verdict
            return adm.check(
                level_id, plan=plan, queued=0, workers=0, now_s=t,
                arrival_s=self._arr_l[i], slo_s=self._slo_l[i], verdict=verdict,
            )  # fmt: skip
        if self._adm_key[0] is not plan or self._adm_key[1] != self._upv:
            self._adm_key = (plan, self._upv)
            self._adm_ws = {}
        ws = self._adm_ws.get(level_id)
        if ws is None:
            ws = self._adm_ws[level_id] = adm.workers(plan, level_id, self.view.up)
        rank = self._rank_l[i]
        queued = 0
        if rank >= self.max_rank:
            qd = self.qd
            queued = sum([qd[w] for w in ws])
        else:
            ranks = self._rank_l
            widx = self.widx
            for wid in ws:
                w = widx.get(wid)
                if w is None or not self.up[w]:
                    continue
                for b in self.dq[w]:
                    if b.finish > t and b.rank <= rank:
                        queued += sum(1 for m in b.members if ranks[m] <= rank)
        return adm.check(
            level_id, plan=plan, queued=queued, workers=len(ws),
            now_s=t, arrival_s=self._arr_l[i], slo_s=self._slo_l[i], verdict=verdict,
        )  # fmt: skip

    def _defer(self, i: int, t: float, plan: Plan | None, light: str) -> None:
        p = int(self.wl.prompt_idx[i])
        view = self.view
        view.now_s = t
        req = self._request(i, p)
        view.deferred_from = light  # which pair's heavy level the policy picks
        a = self.policy.decide_heavy(req, plan, view)
        view.deferred_from = None
        if a.level is None and not a.dropped:
            return  # the policy keeps the light image
        self.deferred[i] = True
        if a.dropped or a.level is None:
            self.status[i] = DROPPED
            self.level_arr[i] = -1
            return
        self._serve(i, p, t, a.level, plan, stage=1, worker=a.worker)

    # ---- data path mechanism ---------------------------------------------------------------

    def _slot(self, w: int, served: ApproxLevel, t: float, bsize: int, rank: int) -> tuple[float, int, bool]:
        """Where a request of tier rank ``rank`` at ``served`` goes on worker ``w``'s queue:
        ``(start, k, join)``. The worker pulls the highest-priority tier first, so the request goes
        ahead of the batches at the tail that have not started and hold only lower-priority work
        of the same model (``k`` is the first of them; ``len(dq)`` when there is none, or when the
        worker has a model load queued after its work). ``join``: it joins the batch at ``k - 1``
        (greedy batching, when that batch has not started, runs ``served`` and has room), else
        the one at ``k`` when that runs ``served`` and has room (``k < len(dq)``), else it starts
        a new batch there."""
        dq = self.dq[w]
        n = len(dq)
        k = n
        ready = self.resident[w].get(served.model)
        if n and ready is not None and self.free_at[w] == dq[-1].finish:
            levels = self.levels
            model = served.model
            while k > 0:
                b = dq[k - 1]
                if b.start <= t or b.rank <= rank or levels[b.level].model != model:
                    break
                k -= 1
        if bsize > 1 and k > 0:
            prev = dq[k - 1]
            if prev.start > t and prev.level == served.id and prev.size < bsize:
                return prev.start, k - 1, True
        if k == n:
            free = max(self.free_at[w], t)
            start = free + served.load_time_s if ready is None else max(free, ready)
            return start, k, False
        nxt = dq[k]
        if bsize > 1 and nxt.level == served.id and nxt.size < bsize:
            return nxt.start, k, True
        start = max(t, dq[k - 1].finish if k > 0 else t, ready if ready is not None else t)
        return start, k, False

    def _shift(self, w: int, k: int) -> None:
        """Start the batches of ``w`` from index ``k`` on no earlier than the batch before each
        finishes (after a request went ahead of them); the worker frees up when the last does."""
        dq = self.dq[w]
        prev = dq[k - 1].finish
        for j in range(k, len(dq)):
            b = dq[j]
            if b.start < prev:
                b.finish += prev - b.start
                b.start = prev
                heapq.heappush(self._fin, (b.finish, w))
            prev = b.finish
        self.free_at[w] = prev
        self.view.busy_until[self.wids[w]] = prev

    def _puller(self, level_id: str, served: ApproxLevel, t: float, bsize: int, rank: int) -> int | None:
        """The up worker that pulls ``level_id``'s queue (its planned workers, or the workers of an
        AC sibling level when the plan gives it none) and starts this request first (``_slot``:
        a higher-priority tier goes ahead of queued lower-priority work)."""
        best = None
        best_key = INF
        up, dqs, free_at, resident = self.up, self.dq, self.free_at, self.resident
        model, sid, load = served.model, served.id, served.load_time_s
        # no worker starts it before ``t`` (with a load time >= 0): the first that starts it at
        # ``t`` wins (ties go to the first), so the scan stops there
        now = t if load >= 0 else -INF
        for w in self.pullers.get(level_id, ()):
            if not up[w]:
                continue
            dq = dqs[w]
            if dq:
                last = dq[-1]
                if last.start > t and last.rank > rank:
                    key = self._slot(w, served, t, bsize, rank)[0]  # it may go ahead of queued work
                    if key < best_key:
                        best_key, best = key, w
                        if key <= now:
                            break
                    continue
                # _slot at the tail of the queue (k == len(dq)), inlined: the common case
                if bsize > 1 and last.start > t and last.level == sid and last.size < bsize:
                    if last.start < best_key:
                        best_key, best = last.start, w
                    continue
            f = free_at[w]
            free = f if f > t else t
            ready = resident[w].get(model)
            key = free + load if ready is None else (ready if ready > free else free)
            if key < best_key:
                best_key, best = key, w
                if key <= now:
                    break
        return best

    def _pick_up_worker(self, level: ApproxLevel, t: float) -> int | None:
        """The up worker that would start ``level`` first (a model load counted when needed)."""
        best = None
        best_key = INF
        for w in range(len(self.wids)):
            if not self.up[w]:
                continue
            ready = self.resident[w].get(level.model)
            key = max(self.free_at[w], t) + level.load_time_s if ready is None else max(self.free_at[w], t, ready)
            if key < best_key:
                best_key, best = key, w
        return best

    def _deliver_to(self, worker: str | None) -> int | None:
        """The worker whose own queue a request waits in (``Delivery.PER_WORKER``): the policy's
        pick while it is up; None: the level's shared pull (``Delivery.SHARED``, or no pick)."""
        if not self.per_worker or worker is None:
            return None
        w = self.widx.get(worker)
        return w if w is not None and self.up[w] else None

    def _serve(
        self, i: int, p: int, t: float, level_id: str, plan: Plan | None, stage: int, worker: str | None = None
    ) -> None:
        lv = self.levels.get(level_id)
        if lv is None:
            raise ConfigError(f"policy {self.policy.name!r} routed to unknown level {level_id!r}")
        served = lv
        extra = 0.0
        hit = False
        if lv.strategy is Strategy.AC and lv.skip > 0:
            if self.cache_down and not self.cache_up(t):
                extra = self.cfg.cache_timeout_s
                served = self.levels[self.ac_base[level_id]]
            else:
                extra = self.cfg.cache_latency_s
                hit = bool(self.similarity(p) >= self.cfg.cache_min_similarity)
                self.period.looked_up(hit)
                if not hit:
                    served = self.levels[self.ac_base[level_id]]
        bsize = plan.batch_sizes.get(served.id, 1) if plan is not None and plan.batch_sizes else 1
        # the policy's delivery: the queue of the worker it picked (PER_WORKER), or, as the service's
        # shared per-level queues, the worker of its level that starts it first (FIFO over the
        # level's workers; the policy's worker is then an estimate)
        rank = self._rank_l[i]
        w = self._deliver_to(worker)
        if w is None:
            w = self._puller(level_id, served, t, bsize, rank)
        if w is None:
            w = self._pick_up_worker(lv, t)
            if w is None:
                # no worker is up: accepted work waits for the first one to come back
                self.status[i] = PENDING
                self.waiting.append(i)
                return
        self.period.routed(level_id)
        ready = self._need(w, served, t)
        spec = self.specs.get(served.id) if stage == 0 else None
        if spec is not None:
            extra += spec.discriminator_latency_s
        jit = self.jit[i] if self.jit is not None else 1.0
        dq = self.dq[w]
        # bring the queue up to date before touching its tail
        now = t
        while dq and dq[0].finish <= now:
            self.qlen[w] -= dq.popleft().size
        start, k, join = self._slot(w, served, t, bsize, rank)
        if join:
            batch = dq[k]
            batch.size += 1
            batch.members.append(i)
            batch.finish = batch.start + served.latency(batch.size) * batch.jit + max(batch.extra, extra)
            batch.extra = max(batch.extra, extra)
            batch.rank = min(batch.rank, rank)
            k += 1
        else:
            if k == len(dq):
                start = max(self.free_at[w], t, ready)
            if self.slow:
                jit *= self._speed(w, start)
            finish = start + served.latency(1) * jit + extra
            batch = _Batch(start, finish, 1, served.id, [i], w, jit, extra, rank)
            dq.insert(k, batch)
            self.busy.append(batch)
            self._ran.append(batch)
            k += 1
        self.qlen[w] += 1
        self.qd[self.wids[w]] = self.qlen[w]
        heapq.heappush(self._fin, (batch.finish, w))
        if k < len(dq):
            self._shift(w, k)  # the lower-priority work it went ahead of starts later
        else:
            self.free_at[w] = batch.finish
            self.view.busy_until[self.wids[w]] = batch.finish
        self.req_batch[i] = batch
        self.worker_arr[i] = w
        self.status[i] = SERVED
        self.level_arr[i] = self.cat_index[served.id]
        self.quality[i] = self.wl.quality[served.id][p]
        self.relative[i] = self.wl.relative[served.id][p]
        self.hit[i] = hit
        self.miss[i] = served is not lv
        if served.strategy is Strategy.AC:
            self.cached[p] = True
        if spec is not None:
            threshold = plan.thresholds.get(served.id, 0.0) if plan is not None else 0.0
            if self.confidences[served.id][p] < threshold:
                self._push(batch.finish, "defer", i, int(self.epoch[i]), batch)


def simulate(
    policy: Policy,
    workload: Workload,
    config: SimConfig | None = None,
    *,
    progress: Callable[[float], None] | None = None,
) -> SimResult:
    """Replay ``workload`` through ``policy`` on a simulated cluster."""
    return Simulator(policy, workload, config, progress=progress).run()
