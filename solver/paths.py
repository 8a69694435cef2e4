"""Serving paths: the plain inputs of the unified planner (:mod:`solver.unified`).

A request's *class* is its predicted optimal level (the classifier's label). A *path* is one way
to serve it:

* an approximate-caching level (SD-XL resuming at K from a cached latent): on a cache hit it runs
  at its profiled speed and quality; on a miss (share ``1 - hit_rate``) it runs as the K = 0 level
  (the ``miss`` stage) on the same worker;
* a smaller model (one stage);
* a cascade: a light stage judged by a discriminator; at threshold t (a point of the profiled f(t)
  grid) a share f_c(t) of class c's requests is deferred to the ``heavy`` stage. The light stage
  runs for every request, the heavy one for the deferred share. The heavy stage may be a level
  that is also a path of its own (SD-XL at K = 0 serving AC traffic and cascade deferrals).

Every stage runs on a worker *pool*: the workers holding one model (:class:`Pool`). Capacity is
worker-seconds: a stage uses ``service_s`` seconds of one worker per request (the batch latency
divided by the batch size), so levels of one model share their workers' time.

Everything here is plain data (numbers, ids, tuples): :func:`problem_from_profile` builds it from
today's domain types (:class:`argusdiff.domain.Profile`, ``ApproxLevel``, ``CascadeSpec``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from argusdiff.domain import DEFAULT_TIER_SLO, TIER_PRIORITY, ApproxLevel, CascadeSpec, Profile, Strategy, Tier
from argusdiff.errors import ConfigError

__all__ = [
    "DEFAULT_TIER_DEADLINE",
    "Pool",
    "ServingPath",
    "Stage",
    "TierSpec",
    "UnifiedProblem",
    "class_quality_model",
    "merged_profile",
    "nitsum_tiers",
    "problem_from_profile",
    "ranked_deferral",
]


@dataclass(frozen=True, slots=True)
class Stage:
    """One model run of a path."""

    level: str  # the level id that runs (the Plan's key for workers and batch sizes)
    pool: str  # the worker pool (model) it runs on
    service_s: float  # seconds of one worker per request: batch latency / batch size
    latency_s: float  # seconds from the start of its batch to the image (plus lookups, discriminator)
    quality: tuple[float, ...]  # relative quality of the image, per class
    batch: int = 1


@dataclass(frozen=True, slots=True)
class ServingPath:
    """A way to serve a request (see the module doc). ``id`` is the level the router sends to."""

    id: str
    strategy: Strategy
    stage: Stage
    hit_rate: float = 1.0  # AC with K > 0: share of requests that find a cached latent
    miss: Stage | None = None  # AC with K > 0: the K = 0 run a miss falls back to
    heavy: Stage | None = None  # cascade: the fallback stage
    thresholds: tuple[float, ...] = ()  # cascade: the profiled t grid, ascending
    # cascade: f_c(t), the share deferred at each threshold; one row per class, or one row for all
    deferral: tuple[tuple[float, ...], ...] = ()
    # cascade: quality of the light images the discriminator keeps at each threshold, one row per
    # class or one row for all; () means the light stage's quality (a discriminator that knows
    # nothing: then the cascade is never better than sending the same shares straight to each stage)
    accepted: tuple[tuple[float, ...], ...] = ()

    @property
    def is_cascade(self) -> bool:
        return self.heavy is not None


@dataclass(frozen=True, slots=True)
class Pool:
    """The workers that hold one model. ``levels``: the level ids they serve, in plan order."""

    id: str
    model: str
    load_time_s: float
    levels: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TierSpec:
    """An SLO tier (after Nitsum): a share of the demand with its own deadline. Tiers are listed
    highest priority first: capacity goes to the first tier's demand (with its headroom) before
    the next tier's."""

    name: str
    share: float  # share of the demand in this tier
    deadline_s: float  # a request served later than this (from its start) earns nothing
    weight: float = 1.0  # weight of this tier's goodput in the objective
    headroom: float = 1.0  # burst headroom on this tier's demand (>= 1; ρ ≤ 1/headroom)


# Deadline multipliers on the deployment SLO per tier: the simulator's defaults
# (argusdiff.domain.DEFAULT_TIER_SLO: batch work tolerates 4x the delay).
DEFAULT_TIER_DEADLINE: dict[str, float] = DEFAULT_TIER_SLO


def nitsum_tiers(
    slo_s: float,
    mix: Mapping[str, float],
    *,
    deadline_factor: Mapping[str, float] | None = None,
    weight: Mapping[str, float] | None = None,
    headroom: Mapping[str, float] | None = None,
) -> tuple[TierSpec, ...]:
    """Tiers for a demand ``mix`` (tier name -> share), ordered interactive, standard, batch (then
    any other name in the order given). Deadlines are ``slo_s`` times :data:`DEFAULT_TIER_DEADLINE`
    (or ``deadline_factor``); weights and headroom default to 1."""
    order = [t for t in TIER_PRIORITY if t in mix] + [t for t in mix if t not in TIER_PRIORITY]
    factors = dict(DEFAULT_TIER_DEADLINE, **(deadline_factor or {}))
    out = []
    for t in order:
        if t not in factors:
            raise ConfigError(f"tiers: no deadline factor for tier {t!r}")
        out.append(
            TierSpec(
                name=t,
                share=float(mix[t]),
                deadline_s=float(slo_s) * float(factors[t]),
                weight=float((weight or {}).get(t, 1.0)),
                headroom=float((headroom or {}).get(t, 1.0)),
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class UnifiedProblem:
    """Everything the unified planner reads, as plain data.

    ``affinity`` is H, the share of the demand per class (normalised by the planner).
    ``current`` maps a worker to the pool it runs now (None: idle); ``resident`` to the models
    held in its GPU memory besides that one (moving to a resident model loads nothing).
    ``levels`` is the plan's level order (default: the classes, then any path or stage level that
    is not a class). ``current_thresholds``: the running plan's threshold per cascade path id (with
    ``current``, what :func:`solver.unified.plan_unified` may keep; ids of no cascade path here,
    e.g. one an ablation dropped, are ignored).
    """

    classes: tuple[str, ...]
    affinity: tuple[float, ...]
    paths: tuple[ServingPath, ...]
    pools: tuple[Pool, ...]
    workers: tuple[str, ...]
    demand_qpm: float
    tiers: tuple[TierSpec, ...]
    current: Mapping[str, str | None] = field(default_factory=dict)
    resident: Mapping[str, frozenset[str]] = field(default_factory=dict)
    goodput_weight: float = 0.0  # value of a request in its SLO, added to its quality
    levels: tuple[str, ...] = ()
    current_thresholds: Mapping[str, float] = field(default_factory=dict)

    def plan_levels(self) -> tuple[str, ...]:
        if self.levels:
            return self.levels
        out = list(self.classes)
        seen = set(out)
        for p in self.paths:
            for st in (p.stage, p.miss, p.heavy):
                if st is not None and st.level not in seen:
                    out.append(st.level)
                    seen.add(st.level)
        return tuple(out)

    def validate(self) -> None:
        C = len(self.classes)
        if C == 0:
            raise ConfigError("classes: at least one class is required")
        if len(set(self.classes)) != C:
            raise ConfigError(f"classes: duplicate ids in {list(self.classes)}")
        if len(self.affinity) != C:
            raise ConfigError(f"affinity: {len(self.affinity)} values for {C} classes")
        if any(not (math.isfinite(a) and a >= 0) for a in self.affinity):
            raise ConfigError(f"affinity: values must be finite and >= 0, got {list(self.affinity)}")
        if not self.paths:
            raise ConfigError("paths: at least one serving path is required")
        ids = [p.id for p in self.paths]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"paths: duplicate path ids in {ids}")
        pool_ids = {p.id for p in self.pools}
        if len(pool_ids) != len(self.pools):
            raise ConfigError("pools: duplicate pool ids")
        for pool in self.pools:
            if not (math.isfinite(pool.load_time_s) and pool.load_time_s >= 0):
                raise ConfigError(f"pool {pool.id!r}: load_time_s must be >= 0, got {pool.load_time_s}")
        pools = frozenset(pool_ids)
        for p in self.paths:
            _check_path(p, C, pools)
        if not (math.isfinite(self.demand_qpm) and self.demand_qpm >= 0):
            raise ConfigError(f"demand_qpm: must be a finite number >= 0, got {self.demand_qpm}")
        if len(set(self.workers)) != len(self.workers):
            raise ConfigError("workers: duplicate worker ids")
        if not self.tiers:
            raise ConfigError("tiers: at least one tier is required")
        if len({t.name for t in self.tiers}) != len(self.tiers):
            raise ConfigError("tiers: duplicate tier names")
        for t in self.tiers:
            if not (math.isfinite(t.share) and t.share >= 0):
                raise ConfigError(f"tier {t.name!r}: share must be >= 0, got {t.share}")
            if not (math.isfinite(t.deadline_s) and t.deadline_s > 0):
                raise ConfigError(f"tier {t.name!r}: deadline_s must be > 0, got {t.deadline_s}")
            if not (math.isfinite(t.weight) and t.weight >= 0):
                raise ConfigError(f"tier {t.name!r}: weight must be >= 0, got {t.weight}")
            if not (math.isfinite(t.headroom) and t.headroom >= 1.0):
                raise ConfigError(f"tier {t.name!r}: headroom must be >= 1, got {t.headroom}")
        if sum(t.share for t in self.tiers) <= 0:
            raise ConfigError("tiers: the shares sum to 0")
        unknown = sorted({v for v in self.current.values() if v is not None and v not in pool_ids})
        if unknown:
            raise ConfigError(f"current: unknown pool id(s) {', '.join(unknown)}; pools: {', '.join(sorted(pool_ids))}")
        if not (math.isfinite(self.goodput_weight) and self.goodput_weight >= 0):
            raise ConfigError(f"goodput_weight: must be >= 0, got {self.goodput_weight}")
        levels = self.plan_levels()
        if len(set(levels)) != len(levels):
            raise ConfigError(f"levels: duplicate ids in {list(levels)}")
        missing = sorted(
            {st.level for p in self.paths for st in (p.stage, p.miss, p.heavy) if st is not None} - set(levels)
        )
        if missing or not set(self.classes) <= set(levels):
            raise ConfigError(f"levels: the plan levels must hold every class and stage level (missing {missing})")


def _check_stage(st: Stage, C: int, pools: frozenset[str], where: str) -> None:
    if st.pool not in pools:
        raise ConfigError(f"{where}: unknown pool {st.pool!r}")
    for name in ("service_s", "latency_s"):
        v = getattr(st, name)
        if not (math.isfinite(v) and v > 0):
            raise ConfigError(f"{where}: {name} must be > 0, got {v}")
    if len(st.quality) != C:
        raise ConfigError(f"{where}: quality has {len(st.quality)} values for {C} classes")
    if any(not (math.isfinite(q) and 0 <= q <= 1) for q in st.quality):
        raise ConfigError(f"{where}: quality values must be in [0, 1]")
    if st.batch < 1:
        raise ConfigError(f"{where}: batch must be >= 1, got {st.batch}")


@functools.lru_cache(maxsize=1024)
def _check_path(p: ServingPath, C: int, pools: frozenset[str]) -> None:
    """Raises ConfigError naming the field; cached (paths repeat from one period to the next)."""
    where = f"path {p.id!r}"
    _check_stage(p.stage, C, pools, where)
    if not (0.0 <= p.hit_rate <= 1.0):
        raise ConfigError(f"{where}: hit_rate must be in [0, 1], got {p.hit_rate}")
    if p.miss is not None:
        _check_stage(p.miss, C, pools, f"{where} (miss)")
    elif p.hit_rate < 1.0:
        raise ConfigError(f"{where}: hit_rate < 1 needs a miss stage")
    if p.heavy is None:
        if p.thresholds or p.deferral or p.accepted:
            raise ConfigError(f"{where}: thresholds/deferral/accepted need a heavy stage")
        return
    _check_stage(p.heavy, C, pools, f"{where} (heavy)")
    K = len(p.thresholds)
    if K == 0:
        raise ConfigError(f"{where}: a cascade needs its threshold grid")
    if any(b <= a for a, b in itertools.pairwise(p.thresholds)):
        raise ConfigError(f"{where}: thresholds must be strictly increasing")
    for name, table in (("deferral", p.deferral), ("accepted", p.accepted)):
        if name == "accepted" and not table:
            continue
        if len(table) not in (1, C):
            raise ConfigError(f"{where}: {name} needs one row or one row per class, got {len(table)}")
        for row in table:
            if len(row) != K:
                raise ConfigError(f"{where}: {name} rows need {K} values (one per threshold), got {len(row)}")
            if any(not (math.isfinite(v) and 0 <= v <= 1) for v in row):
                raise ConfigError(f"{where}: {name} values must be in [0, 1]")
    for row in p.deferral:
        if any(b < a - 1e-12 for a, b in itertools.pairwise(row)):
            raise ConfigError(f"{where}: deferral must be non-decreasing in t")


# --- the adapter from today's domain types ---------------------------------------------------------


def class_quality_model(levels: Sequence[ApproxLevel]) -> list[list[float]]:
    """Default per-class quality q[c][j] when no measured table is given: a prompt whose optimal
    level is c keeps full quality at any level at least as good as c (ARGUS: no loss at or above
    the optimal level) and loses in proportion below it, Q_j / Q_c."""
    Q = [lv.quality for lv in levels]
    return [[1.0 if Q[j] >= Q[c] else (Q[j] / Q[c] if Q[c] > 0 else 0.0) for j in range(len(Q))] for c in range(len(Q))]


def _shares(values, ids: Sequence[str], name: str) -> tuple[float, ...]:
    if values is None:
        return tuple(1.0 for _ in ids)
    if isinstance(values, Mapping):
        unknown = sorted(set(values) - set(ids))
        if unknown:
            raise ConfigError(f"{name}: unknown level id(s) {', '.join(unknown)}")
        return tuple(float(values.get(i, 0.0)) for i in ids)
    vals = tuple(float(v) for v in values)
    if len(vals) != len(ids):
        raise ConfigError(f"{name}: {len(vals)} values for {len(ids)} levels")
    return vals


def problem_from_profile(
    profile: Profile,
    workers: int | Sequence[str],
    demand_qpm: float,
    *,
    cascades: Sequence[CascadeSpec] | None = None,
    affinity: Mapping[str, float] | Sequence[float] | None = None,
    current: Mapping[str, str | None] | None = None,
    resident: Mapping[str, Iterable[str]] | None = None,
    current_thresholds: Mapping[str, float] | None = None,
    tiers: Sequence[TierSpec] | None = None,
    hit_rate: float | Mapping[str, float] = 1.0,
    class_quality: Sequence[Sequence[float]] | None = None,
    cascade_tables: Mapping[str, tuple[Sequence[Sequence[float]], Sequence[Sequence[float]]]] | None = None,
    batch_sizes: Mapping[str, int] | None = None,
    cache_latency_s: float = 0.0,
    goodput_weight: float = 0.0,
    headroom: float = 1.0,
) -> UnifiedProblem:
    """The unified problem for one deployment profile.

    * Every level is a path of its own, except a cascade's light level, which is the cascade
      (its lowest threshold defers nothing on the shipped grids: the light model alone).
    * ``cascades``: the light→heavy pairs (default: the profile's one ``cascade``); several pairs
      fit, each naming two levels of the profile.
    * Classes are the profile's levels (the classifier's labels); ``affinity`` their shares
      (mapping level id -> count/share, or a sequence; default uniform).
    * ``class_quality`` (classes × levels): measured per-class quality; default
      :func:`class_quality_model`.
    * ``cascade_tables``: per light level id, ``(deferral, accepted)`` tables (rows per class or
      one row, one column per threshold): f_c(t) and the quality of the kept light images, e.g.
      from a quality table and discriminator confidences. Default: the spec's f(t) for every class
      and, when the spec has a ``quality`` grid (served mix relative to the heavy level), the kept
      images' quality it implies; else the light level's quality (an uninformed discriminator).
    * ``hit_rate``: cache hit rate of the AC levels with K > 0 (one number or per level id).
    * Pools are models; ``current`` maps workers to level ids (mapped to their model's pool);
      ``resident``: models held besides the current one; ``current_thresholds``: the running
      plan's thresholds (``Plan.thresholds``).
    * ``tiers``: default one ``standard`` tier with the profile's default SLO and ``headroom``.
    """
    stages = _StageMaker.of(profile, class_quality, batch_sizes)
    lights = _cascades_by_light(profile, cascades)
    tables = dict(cascade_tables or {})
    unknown = sorted(set(tables) - set(lights))
    if unknown:
        raise ConfigError(f"cascade_tables: no cascade starts at {', '.join(unknown)}")
    paths = _paths(profile, stages, lights, tables, hit_rate, cache_latency_s)
    wids, cur, res = _worker_state(profile, workers, current, resident)
    tier_specs = (
        tuple(tiers) if tiers else (TierSpec(Tier.STANDARD.value, 1.0, profile.default_slo_s(), 1.0, headroom),)
    )
    return UnifiedProblem(
        classes=profile.ids,
        affinity=_shares(affinity, profile.ids, "affinity"),
        paths=tuple(paths),
        pools=_pools(profile.levels),
        workers=wids,
        demand_qpm=float(demand_qpm),
        tiers=tier_specs,
        current=cur,
        resident=res,
        goodput_weight=goodput_weight,
        levels=profile.ids,
        current_thresholds=dict(current_thresholds or {}),
    )


@dataclass(frozen=True, slots=True)
class _StageMaker:
    """The per-class quality table (classes x levels) and the batch sizes of a profile's levels:
    what a :class:`Stage` of one level is made of (:meth:`stage`)."""

    quality: tuple[tuple[float, ...], ...]
    column: Mapping[str, int]  # level id -> its column of ``quality``
    batches: Mapping[str, int]
    clipped: tuple[tuple[float, ...], ...]  # per level (column) each class's quality, clipped to [0, 1]

    @classmethod
    def of(
        cls,
        profile: Profile,
        class_quality: Sequence[Sequence[float]] | None,
        batch_sizes: Mapping[str, int] | None,
    ) -> _StageMaker:
        levels, ids = profile.levels, profile.ids
        C = len(levels)
        q = [list(map(float, row)) for row in (class_quality or class_quality_model(levels))]
        if len(q) != C or any(len(row) != C for row in q):
            raise ConfigError(f"class_quality: expected a {C} x {C} table (classes x levels)")
        batches = dict(batch_sizes or {})
        unknown = sorted(set(batches) - set(ids))
        if unknown:
            raise ConfigError(f"batch_sizes: unknown level id(s) {', '.join(unknown)}")
        clipped = tuple(tuple(min(1.0, max(0.0, row[j])) for row in q) for j in range(C))
        return cls(tuple(tuple(row) for row in q), {lid: j for j, lid in enumerate(ids)}, batches, clipped)

    def batch(self, level_id: str) -> int:
        return int(self.batches.get(level_id, 1))

    def quality_of(self, level_id: str) -> tuple[float, ...]:
        """Each class's quality at ``level_id``, clipped to [0, 1]."""
        return self.clipped[self.column[level_id]]

    def stage(self, lv: ApproxLevel, extra_s: float = 0.0, extra_service_s: float = 0.0) -> Stage:
        b = self.batch(lv.id)
        if b < 1:
            raise ConfigError(f"batch_sizes: {lv.id!r} must be >= 1, got {b}")
        lat = lv.latency(b)
        return Stage(
            level=lv.id,
            pool=lv.model,
            service_s=lat / b + extra_service_s,
            latency_s=lat + extra_s,
            quality=self.quality_of(lv.id),
            batch=b,
        )


def _cascades_by_light(profile: Profile, cascades: Sequence[CascadeSpec] | None) -> dict[str, CascadeSpec]:
    """The cascades of the problem (default: the profile's one ``cascade``) by light level id; each
    names two levels of the profile, and no two start at the same light level."""
    specs = list(cascades) if cascades is not None else ([profile.cascade] if profile.cascade is not None else [])
    ids = set(profile.ids)
    lights: dict[str, CascadeSpec] = {}
    for spec in specs:
        for name in (spec.light, spec.heavy):
            if name not in ids:
                raise ConfigError(f"cascades: level {name!r} is not in profile {profile.name!r}")
        if spec.light in lights:
            raise ConfigError(f"cascades: two cascades start at light level {spec.light!r}")
        lights[spec.light] = spec
    return lights


def _paths(
    profile: Profile,
    stages: _StageMaker,
    lights: Mapping[str, CascadeSpec],
    tables: Mapping[str, tuple[Sequence[Sequence[float]], Sequence[Sequence[float]]]],
    hit_rate: float | Mapping[str, float],
    cache_latency_s: float,
) -> list[ServingPath]:
    """One path per level of ``profile``: the cascade for a light level, an AC path (hit at the
    level, miss at its K = 0 base) for an AC level with K > 0, a one-stage path otherwise."""
    paths: list[ServingPath] = []
    for lv in profile.levels:
        if lv.id in lights:
            paths.append(_cascade_path(profile, stages, lv, lights[lv.id], tables.get(lv.id)))
        elif lv.strategy is Strategy.AC and lv.skip > 0:
            base = profile.ac_base(lv.id)
            h = float(hit_rate.get(lv.id, 1.0)) if isinstance(hit_rate, Mapping) else float(hit_rate)
            if not 0.0 <= h <= 1.0:
                raise ConfigError(f"hit_rate: {lv.id!r} must be in [0, 1], got {h}")
            paths.append(
                ServingPath(
                    id=lv.id,
                    strategy=Strategy.AC,
                    stage=stages.stage(lv, extra_s=cache_latency_s),
                    hit_rate=h,
                    miss=stages.stage(base, extra_s=cache_latency_s) if h < 1.0 else None,
                )
            )
        else:
            paths.append(ServingPath(id=lv.id, strategy=lv.strategy, stage=stages.stage(lv)))
    return paths


def _cascade_path(
    profile: Profile,
    stages: _StageMaker,
    lv: ApproxLevel,
    spec: CascadeSpec,
    table: tuple[Sequence[Sequence[float]], Sequence[Sequence[float]]] | None,
) -> ServingPath:
    """The cascade starting at light level ``lv``: its light stage (the discriminator's time added),
    its heavy stage, and the deferral and kept-image quality per class and threshold (``table``,
    else the spec's f(t) and :func:`_accepted_from_spec`)."""
    heavy = profile.level(spec.heavy)
    d = spec.discriminator_latency_s
    light_stage = stages.stage(lv, extra_s=d * stages.batch(lv.id), extra_service_s=d)
    if table is not None:
        deferral = tuple(tuple(map(float, r)) for r in table[0])
        accepted = tuple(tuple(map(float, r)) for r in table[1])
    else:
        deferral = (tuple(float(f) for f in spec.deferral),)
        accepted = _accepted_from_spec(spec, light_stage.quality, stages.quality_of(heavy.id))
    return ServingPath(
        id=lv.id,
        strategy=Strategy.CASCADE,
        stage=light_stage,
        heavy=stages.stage(heavy),
        thresholds=tuple(float(t) for t in spec.thresholds),
        deferral=deferral,
        accepted=accepted,
    )


def _pools(levels: Sequence[ApproxLevel]) -> tuple[Pool, ...]:
    """One pool per model, holding its levels; its load time the longest of theirs."""
    pools: dict[str, Pool] = {}
    for lv in levels:
        p = pools.get(lv.model)
        if p is None:
            pools[lv.model] = Pool(lv.model, lv.model, float(lv.load_time_s), (lv.id,))
        else:
            pools[lv.model] = Pool(p.id, p.model, max(p.load_time_s, float(lv.load_time_s)), (*p.levels, lv.id))
    return tuple(pools.values())


def _worker_state(
    profile: Profile,
    workers: int | Sequence[str],
    current: Mapping[str, str | None] | None,
    resident: Mapping[str, Iterable[str]] | None,
) -> tuple[tuple[str, ...], dict[str, str | None], dict[str, frozenset[str]]]:
    """The worker ids, each up worker's current model (``current`` gives level ids) and the models
    it holds besides."""
    from solver.allocate import worker_ids

    wids = tuple(worker_ids(workers))
    up = set(wids)
    cur: dict[str, str | None] = {}
    if current:
        ids = set(profile.ids)
        bad = sorted({v for v in current.values() if v is not None and v not in ids})
        if bad:
            raise ConfigError(f"current: unknown level id(s) {', '.join(bad)}; levels: {', '.join(profile.ids)}")
        cur = {w: (profile.level(v).model if v is not None else None) for w, v in current.items() if w in up}
    res = {w: frozenset(ms) for w, ms in (resident or {}).items() if w in up}
    return wids, cur, res


def _accepted_from_spec(
    spec: CascadeSpec, light_q: tuple[float, ...], heavy_q: tuple[float, ...]
) -> tuple[tuple[float, ...], ...]:
    """Quality of the kept light images per class and threshold. With a ``quality`` grid (the served
    mix relative to the heavy level, Q(t)), the kept images' quality is (Q(t) - f(t)) / (1 - f(t))
    relative to the heavy level, scaled by each class's heavy quality; without it, () (the light
    level's quality)."""
    if spec.quality is None:
        return ()
    rows = []
    for c in range(len(light_q)):
        row = []
        for Q, f in zip(spec.quality, spec.deferral, strict=True):
            rel = (Q - f) / (1.0 - f) if f < 1.0 - 1e-12 else Q
            row.append(min(1.0, max(0.0, rel * heavy_q[c])))
        rows.append(tuple(row))
    return tuple(rows)


def merged_profile(ac: Profile, sm: Profile, cascades: Mapping[str, Profile]) -> tuple[Profile, list[CascadeSpec]]:
    """One profile with ``ac``'s AC levels, ``sm``'s smaller models (except the AC model, whose
    full-quality level is the AC ladder's K = 0) and the light level of each cascade profile in
    ``cascades`` (light level id -> profile with that ``cascade``), best quality first, plus the
    cascade specs with each heavy level mapped onto the merged level that runs the same model at
    K = 0 (SD-XL of the AC ladder, SD-1.5 of the SM ladder). Until a deployment profile lists every
    path itself, this puts the shipped profiles together; a cascade whose heavy model no merged
    level runs keeps its own heavy level."""
    levels = list(ac.levels)
    ac_models = {lv.model for lv in ac.levels}
    levels += [lv for lv in sm.levels if lv.model not in ac_models]
    specs: list[CascadeSpec] = []
    for light, prof in cascades.items():
        spec = prof.cascade
        if spec is None or spec.light != light:
            raise ConfigError(f"cascades: profile {prof.name!r} has no cascade starting at {light!r}")
        if any(lv.id == light for lv in levels):
            raise ConfigError(f"cascades: level id {light!r} is already in the merged profile")
        levels.append(prof.level(light))
        heavy_model = prof.level(spec.heavy).model
        heavy = next((lv.id for lv in levels if lv.model == heavy_model and lv.skip == 0), None)
        if heavy is None:
            levels.append(prof.level(spec.heavy))
            heavy = spec.heavy
        specs.append(dataclasses.replace(spec, heavy=heavy))
    levels.sort(key=lambda lv: (-lv.quality, -lv.latency(1)))
    merged = Profile(
        name=f"{ac.name}+{sm.name}+" + "+".join(p.name for p in cascades.values()),
        gpu=ac.gpu,
        levels=tuple(levels),
        description="AC ladder, smaller models and cascades merged (solver.paths.merged_profile)",
        slo_s=ac.slo_s,
    )
    return merged, specs


def ranked_deferral(
    profile: Profile, specs: Sequence[CascadeSpec], strength: float = 0.8
) -> dict[str, tuple[tuple[tuple[float, ...], ...], tuple[tuple[float, ...], ...]]]:
    """``cascade_tables`` for a discriminator that defers the worst light images first: f(t) from
    each spec for every class, and the kept images' quality rising from the light level's quality
    (per class, :func:`class_quality_model`) toward 1 as f grows, closing ``strength`` of the gap at
    f = 1. A stand-in until tables measured from a quality table and discriminator confidences are
    passed (the replay's synthetic confidences rank light images the same way)."""
    if not 0.0 <= strength <= 1.0:
        raise ConfigError(f"strength: must be in [0, 1], got {strength}")
    cq = class_quality_model(profile.levels)
    out = {}
    for spec in specs:
        j = profile.index(spec.light)
        acc = tuple(tuple(min(1.0, row[j] + (1.0 - row[j]) * strength * f) for f in spec.deferral) for row in cq)
        out[spec.light] = ((tuple(float(f) for f in spec.deferral),), acc)
    return out
