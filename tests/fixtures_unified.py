"""Random and realistic instances of the unified planner for tests and scripts/bench_solver.py."""

from __future__ import annotations

import functools
from pathlib import Path

from hypothesis import strategies as st
from scripts_module import load_script

from argusdiff.domain import Strategy
from solver.paths import Pool, ServingPath, Stage, TierSpec, UnifiedProblem

ROOT = Path(__file__).resolve().parents[1]


@st.composite
def problems(draw, max_classes: int = 3, max_workers: int = 10, max_grid: int = 5, tiers: bool = True):
    """A random unified problem: a few models, AC levels with a cache hit rate, smaller models,
    up to two cascades with short threshold grids, one to three tiers, a current assignment with
    resident models."""
    C = draw(st.integers(1, max_classes))
    n_models = draw(st.integers(1, 3))
    models = [f"m{i}" for i in range(n_models)]
    pools = tuple(Pool(m, m, draw(st.floats(0.0, 10.0)), ()) for m in models)
    qual = st.lists(st.floats(0.3, 1.0), min_size=C, max_size=C).map(tuple)
    paths: list[ServingPath] = []
    n_direct = draw(st.integers(1, 4))
    for i in range(n_direct):
        m = draw(st.sampled_from(models))
        lat = draw(st.floats(0.2, 6.0))
        strategy = draw(st.sampled_from([Strategy.AC, Strategy.SM]))
        stage = Stage(f"p{i}", m, lat, lat, draw(qual))
        if strategy is Strategy.AC and draw(st.booleans()):
            miss_lat = lat * draw(st.floats(1.0, 2.5))
            miss = Stage(f"p{i}", m, miss_lat, miss_lat, draw(qual))
            paths.append(ServingPath(f"p{i}", Strategy.AC, stage, hit_rate=draw(st.floats(0.0, 1.0)), miss=miss))
        else:
            paths.append(ServingPath(f"p{i}", strategy, stage))
    for j in range(draw(st.integers(0, 2))):
        K = draw(st.integers(1, max_grid))
        lm, hm = draw(st.sampled_from(models)), draw(st.sampled_from(models))
        ll, hl = draw(st.floats(0.05, 1.0)), draw(st.floats(0.5, 6.0))
        share = st.one_of(st.just(0.0), st.floats(1e-3, 1.0))  # no grid has shares near solver tolerances
        f = sorted(draw(st.lists(share, min_size=K, max_size=K)))
        per_class = draw(st.booleans())
        deferral = tuple(tuple(sorted(draw(st.lists(share, min_size=K, max_size=K)))) for _ in range(C))
        acc = tuple(tuple(draw(st.lists(st.floats(0.2, 1.0), min_size=K, max_size=K))) for _ in range(C))
        paths.append(
            ServingPath(
                f"c{j}",
                Strategy.CASCADE,
                Stage(f"c{j}", lm, ll, ll, draw(qual)),
                heavy=Stage(f"h{j}", hm, hl, hl, draw(qual)),
                thresholds=tuple(float(t) for t in range(K)),
                deferral=deferral if per_class else (tuple(f),),
                accepted=acc,
            )
        )
    W = draw(st.integers(1, max_workers))
    if tiers and draw(st.booleans()):
        T = draw(st.integers(1, 3))
        tier_specs = tuple(
            TierSpec(
                f"t{i}",
                draw(st.floats(0.1, 1.0)),
                draw(st.floats(0.5, 12.0)),
                draw(st.floats(0.5, 2.0)),
                draw(st.floats(1.0, 1.5)),
            )
            for i in range(T)
        )
    else:
        tier_specs = (TierSpec("standard", 1.0, draw(st.floats(1.0, 12.0))),)
    cheapest = min(
        p.stage.service_s * (p.hit_rate if p.miss is not None else 1.0)
        + ((1 - p.hit_rate) * p.miss.service_s if p.miss is not None else 0.0)
        for p in paths
    )
    demand = draw(st.floats(0.0, 1.3)) * W * 60.0 / cheapest
    workers = tuple(f"w{i}" for i in range(W))
    current = {}
    resident = {}
    if draw(st.booleans()):
        for w in workers:
            current[w] = draw(st.sampled_from([*models, None]))
            resident[w] = frozenset(draw(st.lists(st.sampled_from(models), max_size=2)))
    return UnifiedProblem(
        classes=tuple(f"k{c}" for c in range(C)),
        affinity=tuple(draw(st.lists(st.one_of(st.just(0.0), st.floats(0.01, 1.0)), min_size=C, max_size=C))),
        paths=tuple(paths),
        pools=pools,
        workers=workers,
        demand_qpm=demand,
        tiers=tier_specs,
        current=current,
        resident=resident,
        goodput_weight=draw(st.sampled_from([0.0, 1.0])),
    )


@functools.cache
def _bench():
    return load_script("bench_solver")


def realistic(workers: int, per_worker_qpm: float, *, tiered: bool = False, informed: bool = True) -> UnifiedProblem:
    """scripts/bench_solver.py's unified instance (the shipped A100 profiles as one deployment)."""
    return _bench().unified_instance(workers, per_worker_qpm, tiered=tiered, informed=informed)
