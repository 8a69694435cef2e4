#!/usr/bin/env python
"""Median solve times of the allocation formulations, ODA/PASM, the cascade MILP and the unified plan.

For 8, 64, 256, 1024 and 10,000 workers x 6 and 12 levels it prints the median wall time of:

* ``exact``        branch and bound on the aggregated counts (the control loop's fast path)
* ``exact+sw``     the same with a current assignment (switch-cost pass included)
* ``agg/highs``    aggregated MILP on HiGHS (highspy), model build included
* ``agg/gurobi``   aggregated MILP on gurobipy (bundled size-limited licence)
* ``paper/highs``  ARGUS Eq. 1 as written (binary x per worker and level) on HiGHS
* ``paper/gurobi`` the same on gurobipy where it fits the licence (<= 2000 variables/constraints)
* ``oda``          ODA -> PASM
* ``exact+oda``    allocation + PASM, the number the targets are about

followed by the cascade MILP's median solve time on the three shipped cascades, and the unified
plan (``solver.unified``: AC levels, smaller models and cascades in one plan per SLO tier) on
:func:`unified_instance` for 8 to 10,000 workers and loads of 20 to 100 QPM per worker: ``plan``
from scratch, ``replan`` from the plan made for 90% of the load (switch-cost pass included).
``--unified-only`` runs that section alone; ``--unified-milp`` adds the same instance solved by the
MILP formulation (seconds: it has a column per threshold and class) and checks the search against
it (the script fails if the search's plan is worse than the MILP's by more than the 1e-4 gap).

Levels: 6 = the shipped ``sdxl-ac-a100`` profile; 12 = the same SD-XL latency model with
K in {0, 4, ..., 44} (0.2 s + (50 - K) * 0.08 s) and a smooth quality curve. Demand: 75% of the
way from the all-best to the all-fastest capacity, so plans mix levels. Every formulation's
quality is checked against ``exact`` (the script fails if any differs).

The ``exact+sw`` column uses ``backend=auto`` (gurobipy when licensed) for its switch-cost MILP.

``--oda-study N`` instead compares ODA with the exact Eq. 2 LP on N random (H, F) pairs per
degradation exponent (D(g) = g^p, g = level gap): share of instances where ODA costs more, and
the mean/max relative excess.

Usage: python scripts/bench_solver.py [--repeats 7] [--paper-max-vars 1000] [--quick] [--oda-study N]
       python scripts/bench_solver.py --unified-only [--unified-milp] [--quick]
"""

from __future__ import annotations

import argparse
import logging
import platform
import statistics
import sys
import time
from datetime import UTC, datetime

from argusdiff.domain import ApproxLevel, Strategy
from argusdiff.profile import load_profile
from solver import backends
from solver.allocate import allocate
from solver.oda import oda


def levels_12() -> tuple[ApproxLevel, ...]:
    out = []
    for k in range(0, 48, 4):
        q = 1.0 - 0.1 * (k / 44) ** 1.5
        out.append(
            ApproxLevel(f"k{k}", Strategy.AC, "sdxl", 50, k, {1: round(0.2 + (50 - k) * 0.08, 4)}, round(q, 4), 9.42)
        )
    return tuple(out)


def median_time(fn, repeats: int) -> tuple[float, object]:
    times = []
    result = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


COLS = ["exact", "exact+sw", "agg/highs", "agg/gurobi", "paper/highs", "paper/gurobi", "oda", "exact+oda"]


def bench_case(levels, W: int, args, have_gurobi: bool) -> tuple[dict[str, str], int]:
    """One row of the table: (cells by column, number of quality mismatches)."""
    L = len(levels)
    p_best, p_fast = levels[0].peak_qpm, levels[-1].peak_qpm
    demand = W * (p_best + 0.75 * (p_fast - p_best))
    uniform = [1.0 / L] * L
    row: dict[str, str] = {}
    failures = 0
    t, ref = median_time(lambda: allocate(levels, W, demand, formulation="exact"), args.repeats)
    row["exact"] = f"{t * 1000:.2f}"
    # the control loop's case: the previous period's plan at 95% of this demand
    prev = allocate(levels, W, demand * 0.95, formulation="exact").assignment
    t, _ = median_time(lambda: allocate(levels, W, demand, formulation="exact", current=prev), args.repeats)
    row["exact+sw"] = f"{t * 1000:.2f}"
    t, _ = median_time(lambda: oda(uniform, ref.share), args.repeats)
    row["oda"] = f"{t * 1000:.3f}"
    t, _ = median_time(lambda: oda(uniform, allocate(levels, W, demand, formulation="exact").share), args.repeats)
    row["exact+oda"] = f"{t * 1000:.2f}"
    for form in ("aggregated", "paper"):
        short = "agg" if form == "aggregated" else "paper"
        for be in ("highs", "gurobi"):
            key = f"{short}/{be}"
            n_cols = 2 * L * W + W if form == "paper" else 2 * L
            if be == "gurobi" and not have_gurobi:
                row[key] = "n/a"
                continue
            if be == "gurobi" and n_cols > 2000:
                row[key] = "licence"
                continue
            if form == "paper" and be == "highs" and n_cols > args.paper_max_vars:
                row[key] = "skipped"
                continue
            reps = args.repeats if (form == "aggregated" or W <= 64) else 3
            t, res = median_time(
                lambda f=form, b=be: allocate(levels, W, demand, formulation=f, backend=b, time_limit_s=60), reps
            )
            if abs(res.expected_quality - ref.expected_quality) > 1e-6:
                row[key] = f"{t * 1000:.1f}!"
                failures += 1
                print(
                    f"# MISMATCH {key} L={L} W={W}: {res.expected_quality} vs {ref.expected_quality} {res.notes}",
                    file=sys.stderr,
                )
            else:
                row[key] = f"{t * 1000:.1f}"
    return row, failures


def oda_study(n: int, levels: int = 6, seed: int = 0) -> int:
    """ODA vs the exact Eq. 2 LP on random Dirichlet (H, F) pairs."""
    import numpy as np

    from solver.oda import degradation_matrix, eq2_cost, solve_eq2

    rng = np.random.default_rng(seed)
    print(f"# ODA vs Eq. 2 LP: {n} random (H, F) per exponent, {levels} levels, Dirichlet(1), seed {seed}")
    print(f"{'exponent':>8} {'ODA worse':>10} {'mean excess':>12} {'max excess':>11}")
    pairs = [(rng.dirichlet(np.ones(levels)), rng.dirichlet(np.ones(levels))) for _ in range(n)]
    for p in (0.5, 0.75, 1.0, 1.5, 2.0, 3.0):
        D = degradation_matrix(levels, p)
        excess = []
        for H, F in pairs:
            lp, _ = solve_eq2(H, F, D)
            od = eq2_cost(H, oda(H, F), D)
            excess.append((od - lp) / lp if lp > 1e-12 else 0.0)
        worse = sum(1 for e in excess if e > 1e-6)
        print(f"{p:>8g} {100 * worse / n:>9.1f}% {100 * statistics.mean(excess):>11.2f}% {100 * max(excess):>10.2f}%")
    return 0


def cascade_times(repeats: int, have_gurobi: bool) -> None:
    """Median solve time of DiffServe's cascade MILP on the shipped cascades (16 workers), without
    queues and with a backlog (16 light, 8 heavy queued: the drain-time rows of the model)."""
    from solver.cascade import solve_cascade

    print("# cascade MILP (DiffServe Eq. 1-5), 16 workers, 201-point f(t) grid, drain queue model, median ms")
    print(f"{'profile':<24} {'load QPM':>8} {'queues':>7} {'highs':>8} {'gurobi':>8} {'t':>6}")
    for name, load in (("cascade-sdturbo-sdv15", 1500), ("cascade-sdxs-sdv15", 1500), ("cascade-sdxlltn-sdxl", 300)):
        p = load_profile(name)
        c = p.cascade
        light, heavy = p.level(c.light), p.level(c.heavy)
        for ql, qh in ((0, 0), (16, 8)):
            cells = {}
            plan = None
            for be in ("highs", "gurobi"):
                if be == "gurobi" and not have_gurobi:
                    cells[be] = "n/a"
                    continue
                args = (c, light, heavy, 16, load, p.default_slo_s())
                kw = {"queue_light": ql, "queue_heavy": qh, "backend": be}
                t, plan = median_time(lambda a=args, k=kw: solve_cascade(*a, **k), repeats)
                cells[be] = f"{t * 1000:.1f}"
            q = f"{ql}/{qh}"
            print(f"{name:<24} {load:>8} {q:>7} {cells['highs']:>8} {cells['gurobi']:>8} {plan.threshold:>6g}")


UNIFIED_LOADS = (20, 40, 60, 80, 100)  # QPM per worker
UNIFIED_MIX = {"interactive": 0.3, "standard": 0.5, "batch": 0.2}
UNIFIED_HEADROOM = {"interactive": 1.3, "standard": 1.1}


def unified_instance(workers: int, per_worker_qpm: float, *, tiered: bool = False, informed: bool = True):
    """The shipped A100 profiles as one deployment: the SD-XL AC ladder, the SM ladder and the
    SDXL-Lightning -> SD-XL and SD-Turbo -> SD-1.5 cascades on the DiffServe f(t) grids
    (:func:`solver.paths.merged_profile`), a discriminator that defers the worst light images first
    (:func:`solver.paths.ranked_deferral`; ``informed=False``: the light level's quality), uniform
    affinity; ``tiered``: interactive/standard/batch tiers (:data:`UNIFIED_MIX`, headroom
    :data:`UNIFIED_HEADROOM`, deadlines from the simulator's tier multipliers)."""
    from solver.paths import merged_profile, nitsum_tiers, problem_from_profile, ranked_deferral

    prof, specs = merged_profile(
        load_profile("sdxl-ac-a100"),
        load_profile("sm-a100"),
        {"sdxl-lightning": load_profile("cascade-sdxlltn-sdxl"), "sdturbo": load_profile("cascade-sdturbo-sdv15")},
    )
    tiers = nitsum_tiers(prof.default_slo_s(), UNIFIED_MIX, headroom=UNIFIED_HEADROOM) if tiered else None
    return problem_from_profile(
        prof,
        workers,
        workers * per_worker_qpm,
        cascades=specs,
        tiers=tiers,
        cascade_tables=ranked_deferral(prof, specs) if informed else None,
    )


def unified_times(repeats: int, sizes, milp: bool) -> int:
    """Median solve times of the unified plan; returns the number of search/MILP mismatches."""
    import dataclasses

    from solver.unified import DEFAULT_GAP, plan_unified

    print(
        "# unified plan (solver.unified, exact search, gap 1e-4): merged A100 profiles, 14 levels, 8 models, "
        "2 cascades on 201-point f(t) grids; load = QPM per worker; median ms"
    )
    print(
        f"{'workers':>7} {'tiers':>5} {'load':>5} {'plan':>8} {'nodes':>6} {'replan':>8} {'nodes':>6} "
        f"{'moved':>6} {'quality':>8}  thresholds"
    )
    failures = 0
    summary: dict[tuple[int, bool], list[tuple[float, float]]] = {}
    for W in sizes:
        for tiered in (False, True):
            for load in UNIFIED_LOADS:
                p = unified_instance(W, load, tiered=tiered)
                t_plan, r = median_time(lambda p=p: plan_unified(p), repeats)
                prev = plan_unified(unified_instance(W, 0.9 * load, tiered=tiered))
                q = dataclasses.replace(p, current=dict(prev.assignment))
                t_re, rr = median_time(lambda q=q: plan_unified(q), repeats)
                summary.setdefault((W, tiered), []).append((t_plan, t_re))
                thr = " ".join(f"{k}={v:g}" for k, v in r.thresholds.items())
                print(
                    f"{W:>7} {'3' if tiered else '1':>5} {load:>5} {t_plan * 1000:>8.1f} {r.nodes:>6} "
                    f"{t_re * 1000:>8.1f} {rr.nodes:>6} {rr.moved_workers:>6} {r.expected_quality:>8.4f}  {thr}",
                    flush=True,
                )
                if milp and W in (64, 1024) and load == 60:
                    t_m, m = median_time(lambda p=p: plan_unified(p, formulation="milp", time_limit_s=120), 1)
                    ok = r.objective >= m.objective * (1 - DEFAULT_GAP) - 1e-9
                    failures += 0 if ok else 1
                    print(
                        f"#   milp ({m.backend}) {t_m * 1000:.0f} ms, objective {m.objective:.3f} vs search "
                        f"{r.objective:.3f}{'' if ok else '  MISMATCH'}",
                        flush=True,
                    )
    print("# median over the loads (plan / replan ms):")
    for (W, tiered), times in summary.items():
        plan = statistics.median(t for t, _ in times) * 1000
        replan = statistics.median(t for _, t in times) * 1000
        print(f"#   {W:>6} workers, {'3 tiers' if tiered else '1 tier '}: {plan:.1f} / {replan:.1f}")
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument(
        "--paper-max-vars",
        type=int,
        default=1000,
        help="skip the paper formulation on HiGHS above this many columns (2*L*W + W); "
        "12 levels x 64 workers (1600 columns) took 48 s",
    )
    ap.add_argument("--quick", action="store_true", help="8 and 64 workers only")
    ap.add_argument("--cascade-only", action="store_true", help="only the cascade MILP timings")
    ap.add_argument("--unified-only", action="store_true", help="only the unified-plan timings")
    ap.add_argument("--unified-milp", action="store_true", help="also solve the unified plan by its MILP (slow)")
    ap.add_argument(
        "--oda-study",
        type=int,
        default=0,
        metavar="N",
        help="compare ODA with the Eq. 2 LP on N random instances per exponent, then exit",
    )
    args = ap.parse_args(argv)
    if args.oda_study:
        return oda_study(args.oda_study)
    logging.basicConfig(level=logging.ERROR)
    backends.preload()
    have_gurobi = backends.gurobi_available()
    if args.cascade_only:
        cascade_times(args.repeats, have_gurobi)
        return 0
    sets = {6: load_profile("sdxl-ac-a100").levels, 12: levels_12()}
    sizes = (8, 64) if args.quick else (8, 64, 256, 1024, 10000)
    print(
        f"# bench_solver  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC  {platform.machine()}  python "
        f"{platform.python_version()}  gurobipy={'yes' if have_gurobi else 'no'}  repeats={args.repeats}"
    )
    if args.unified_only:
        return 1 if unified_times(args.repeats, sizes, args.unified_milp) else 0
    print(f"{'L':>3} {'W':>6} " + " ".join(f"{c:>12}" for c in COLS) + "   (median ms)")
    failures = 0
    for L, levels in sets.items():
        for W in sizes:
            row, bad = bench_case(levels, W, args, have_gurobi)
            failures += bad
            print(f"{L:>3} {W:>6} " + " ".join(f"{row[c]:>12}" for c in COLS), flush=True)
    print(
        "# licence: model exceeds the size-limited gurobipy licence (2000 variables/constraints); such a "
        "solve falls back to HiGHS.  skipped: paper formulation on HiGHS above --paper-max-vars columns "
        "(its symmetric binaries make HiGHS take tens of seconds)."
    )
    cascade_times(args.repeats, have_gurobi)
    failures += unified_times(args.repeats, sizes, args.unified_milp)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
