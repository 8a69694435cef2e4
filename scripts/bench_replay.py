"""Simulator speed: simulated requests per second of wall time, per policy, on the ARGUS diagonal
stress trace (50 -> 600 QPM over 800 min, ~300k requests) with 8 workers.

Usage: python scripts/bench_replay.py [--policies argus,pac,...] [--trace SPEC] [--no-embeddings]

Prints one line per policy (requests, wall seconds of the simulation alone, requests/s) and the
median over policies. Building the workload (trace, prompts, synthetic quality, embeddings from the
disk cache) is timed separately. Target (issue 3): <= 30 s per policy for the whole trace.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="diagonal:start=50,end=600,duration=800m")
    ap.add_argument(
        "--policies",
        default="argus,argus+,pac,proteus,nirvana,sommelier,clipper-ha,clipper-ht,diffserve,diffserve-static",
    )
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--no-embeddings", action="store_true")
    ap.add_argument("--no-admission", action="store_true", help="no admission after the policies")
    args = ap.parse_args()

    from argusdiff.replay import ReplaySpec, prepare, run_replay

    spec = ReplaySpec(
        trace=args.trace,
        gpus=args.gpus,
        embeddings=not args.no_embeddings,
        policies=[],
        admission=not args.no_admission,
    )
    t0 = time.perf_counter()
    prepared = prepare(spec)
    t_prep = time.perf_counter() - t0
    wl = prepared.workload
    print(f"machine: {platform.machine()} {os.cpu_count()} cpus; python {platform.python_version()}")
    print(f"trace {args.trace}: {wl.n_requests} requests; workload built in {t_prep:.1f} s; "
          f"admission {'off' if args.no_admission else 'on'}")  # fmt: skip
    rates = []
    walls = []
    for name in [p for p in args.policies.split(",") if p]:
        spec.policies = [name]
        res = run_replay(spec, prepared=prepared)
        r = res.results[name]
        rate = wl.n_requests / r.wall_s
        rates.append(rate)
        walls.append(r.wall_s)
        s = res.summaries[name]
        print(
            f"{name:<18} {wl.n_requests:>8d} req  {r.wall_s:7.2f} s  {rate:9.0f} req/s   "
            f"(SLO viol {100 * s['slo_violation_ratio']:.1f}%, {s['plans']} plans)"
        )
    print(
        f"median: {statistics.median(walls):.2f} s per policy, {statistics.median(rates):.0f} simulated req/s; "
        f"max {max(walls):.2f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
