"""CPU seconds of a single-policy replay of ARGUS's 800-minute diagonal (50 -> 600 QPM, ~260k
requests) on 24 simulated workers, and argus+'s cost against argus's.

Usage: python scripts/bench_replay_cpu.py [--gpus 24] [--trace SPEC] [--policies argus,argus+ (AC),argus+]
       [--repeat 3] [--profile]

For each run (a row of ``argusdiff replay``: ``argus``, ``argus+ (AC)``, ``argus+``) it prints
the process CPU seconds of the whole run (simulation, per-minute metrics, summary, drift check:
``argusdiff.replay.runs._run_policy``) with the product's defaults (admission on, the default prompt
set, predictor and seed); building the workload is shared and timed apart. Each label runs
``--repeat`` times, the labels taking turns (so a change in the machine's load falls on all of
them), and the median is reported, with the CPU seconds spent in the policy's control path
(``plan``) and, within it, in the MILP backend (``solver.backends._solve_once``: Gurobi or
HiGHS); the rest is the data path's (routing, admission, the simulated queues) and the metrics'.
The last lines give each run's ratio to ``argus`` and whether the targets hold (issue 20: <= 12
CPU-s per policy, argus+ at most 2x argus). ``--profile`` prints cProfile's top functions of
each run as well.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import os
import platform
import pstats
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TARGET_S = 12.0
TARGET_RATIO = 2.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="diagonal:start=50,end=600,duration=800m")
    ap.add_argument("--gpus", type=int, default=24)
    ap.add_argument("--policies", default="argus,argus+ (AC),argus+", help="comma-separated run labels")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each label (the median is reported)")
    ap.add_argument("--profile", action="store_true", help="print cProfile's top 25 functions of each run")
    args = ap.parse_args()

    from argusdiff.replay import ReplaySpec, prepare
    from argusdiff.replay.runs import _run_policy, _shared_run_settings

    labels = [p.strip() for p in args.policies.split(",") if p.strip()]
    spec = ReplaySpec(trace=args.trace, gpus=args.gpus, policies=["argus", "argus+"], ac_only=True)
    t0 = time.process_time()
    prepared = prepare(spec)
    t_prep = time.process_time() - t0
    shared = _shared_run_settings(spec, prepared)
    runs = {label: (name, extra, on) for label, name, extra, on in shared.runs}
    missing = [lb for lb in labels if lb not in runs]
    if missing:
        ap.error(f"--policies: no run {', '.join(missing)} (runs: {', '.join(runs)})")
    print(
        f"{datetime.date.today().isoformat()}; {platform.machine()} {os.cpu_count()} cpus; python "
        f"{platform.python_version()}; trace {args.trace}: {prepared.workload.n_requests} requests; "
        f"{args.gpus} workers; admission {prepared.provenance.get('admission', 'on')}; "
        f"workload built in {t_prep:.1f} CPU-s"
    )
    import argusdiff.policies as policies_mod
    import solver.backends as backends

    # CPU seconds in the policy's plan() and in MILP solves (the run builds its policy by name)
    inside = {"plan": 0.0, "milp": 0.0}

    def timed(fn, key):
        def wrapper(*a, **k):
            c = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                inside[key] += time.process_time() - c

        return wrapper

    make_policy = policies_mod.make_policy

    def make_timed_policy(*a, **k):
        policy = make_policy(*a, **k)
        policy.plan = timed(policy.plan, "plan")
        return policy

    policies_mod.make_policy = make_timed_policy
    backends._solve_once = timed(backends._solve_once, "milp")  # every MILP solve_milp hands a backend
    times: dict[str, list[tuple[float, float, float]]] = {label: [] for label in labels}
    summary: dict[str, dict] = {}
    for _ in range(max(1, args.repeat)):
        for label in labels:
            name, extra, on = runs[label]
            prof = cProfile.Profile() if args.profile else None
            inside["plan"] = inside["milp"] = 0.0
            c0 = time.process_time()
            if prof is not None:
                prof.enable()
            _res, _m, summary[label] = _run_policy(spec, prepared.workload, shared, label, name, extra, on, {}, None)
            if prof is not None:
                prof.disable()
            times[label].append((time.process_time() - c0, inside["plan"], inside["milp"]))
            if prof is not None:
                print(label)
                pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    cpu: dict[str, float] = {}
    for label in labels:
        total, plan, milp = (statistics.median(x[k] for x in times[label]) for k in range(3))
        cpu[label] = total
        s = summary[label]
        runs_s = ", ".join(f"{x[0]:.2f}" for x in times[label])
        print(
            f"{label:<20} {total:7.2f} CPU-s median of [{runs_s}]; plan {plan:.2f} (MILP backend {milp:.2f}), "
            f"the rest {total - plan:.2f}  (SLO viol {100 * s['slo_violation_ratio']:.1f}%, {s['plans']} plans, "
            f"{s['requests']} requests)",
            flush=True,
        )
    base = cpu.get("argus")
    ok = True
    for label, c in cpu.items():
        ratio = f"{c / base:.2f}x argus" if base else "-"
        meets = c <= TARGET_S and (label == "argus" or base is None or c <= TARGET_RATIO * base)
        ok &= meets
        print(f"{label:<20} {c:7.2f} CPU-s  {ratio:>12}  {'meets' if meets else 'MISSES'} the target")
    print(
        f"target: <= {TARGET_S:g} CPU-s per policy, argus+ at most {TARGET_RATIO:g}x argus: "
        f"{'met' if ok else 'NOT met'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
