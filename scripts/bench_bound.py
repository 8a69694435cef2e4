#!/usr/bin/env python
"""Time the clairvoyant bound (argusdiff.bound) on every trace of docs/results.md, for each profile.

The traces are built as ``scripts/run_results.py`` builds them: the Twitter-derived trace, the Azure
shape and the bursty trace time-stretched to 90% of the 8-worker sdxl-ac-a100 cluster's maximum
(196 QPM peak), the diagonal ramp as generated, the Twitter trace at twice that load, and the three
traces of the papers' load section (``*-papers``: stretched so the highest minute is twice what SD-XL
at K = 0 serves on every worker, 229 QPM; the Twitter trace cut to its 90 minutes around the peak;
the azure shape over 90 min and the bursty trace over 1 h, as run_results.py builds them). Quality:
the synthetic tables (``argusdiff replay``'s default), SLO 12.6 s, 8 workers. Prints a markdown
table: requests, levels, LP size, the bound's three numbers and the wall time of one
``clairvoyant_bound`` call (three LP solves, or four beyond capacity), with the machine and date.

Usage: python scripts/bench_bound.py [--traces twitter,azure,...,twitter-papers,...] [--profiles ...]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
PROFILES = ("unified-a100", "sdxl-ac-a100", "sm-a100", "cascade-sdxlltn-sdxl")
GPUS = 8
FRACTION = 0.9
PAPER_LOAD = 2.0  # run_results.py's PAPER_LOAD: the papers' load section's peak, x SD-XL's K = 0 capacity


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--traces", default="twitter,azure,bursty,diagonal,twitter-2x,twitter-papers,azure-papers,bursty-papers"
    )
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--twitter", default=str(SHARED / "data" / "traces" / "twitter_proteus_normal-high_load_300.txt"))
    args = ap.parse_args()

    from argusdiff.bound import clairvoyant_bound
    from argusdiff.profile import load_profile
    from argusdiff.replay import ReplaySpec, cluster_capacity_qpm, prepare, scale_to_peak
    from traces.formats import load_trace, write_trace

    tmp = Path(tempfile.mkdtemp(prefix="argusdiff-bound-"))
    peak = FRACTION * cluster_capacity_qpm(load_profile("sdxl-ac-a100"), GPUS)

    ac = load_profile("sdxl-ac-a100")
    papers_peak = PAPER_LOAD * GPUS * ac.best.peak_qpm

    def scaled(source: str, qpm: float, name: str, window_min: float | None = None) -> str:
        path = tmp / f"{name}.csv"
        tr = load_trace(source, seed=0)
        if tr.slo_s is not None:  # the Twitter trace's deadlines are classification-scale (run_results.py drops them)
            tr = tr.replace(slo_s=None)
        tr = scale_to_peak(tr, qpm)
        if window_min is not None:  # the stretch around the highest minute, as run_results.py cuts it
            t_peak = 60.0 * float(np.argmax(np.bincount((tr.arrivals_s // 60).astype(int))))
            start = max(0.0, min(t_peak - 30.0 * window_min, float(tr.duration_s) - 60.0 * window_min))
            tr = tr.window(start, start + 60.0 * window_min)
        write_trace(tr, path)
        return str(path)

    make = {
        "twitter": lambda: scaled(args.twitter, peak, "twitter"),
        "azure": lambda: scaled("diurnal:shape=azure,low=40,high=200,duration=6h", peak, "azure"),
        "bursty": lambda: scaled("bursty:low=40,high=160,period=10m,duration=2h", peak, "bursty"),
        "diagonal": lambda: "diagonal:start=50,end=600,duration=800m",
        "twitter-2x": lambda: scaled(args.twitter, 2 * peak, "twitter-2x"),
        "twitter-papers": lambda: scaled(args.twitter, papers_peak, "twitter-papers", window_min=90),
        "azure-papers": lambda: scaled("diurnal:shape=azure,low=40,high=200,duration=90m", papers_peak, "azure-papers"),
        "bursty-papers": lambda: scaled("bursty:low=40,high=160,period=10m,duration=1h", papers_peak, "bursty-papers"),
    }
    profiles = [load_profile(n) for n in args.profiles.split(",")]
    print(
        f"_{datetime.now(UTC):%Y-%m-%d} on {platform.machine()} ({os.cpu_count()} cores), "
        f"`python scripts/bench_bound.py`; {GPUS} workers, SLO 12.6 s, synthetic quality tables._\n"
    )
    print(
        "| trace | requests | profile | levels | LP columns x rows | fewest viol. | rel. quality | served q. | s |\n"
        "|---|---:|---|---:|---:|---:|---:|---:|---:|"
    )
    for key in args.traces.split(","):
        trace = make[key]()
        prepared = prepare(ReplaySpec(trace=trace, gpus=GPUS, embeddings=False, admission=False))
        wl = prepared.workload
        for p in profiles:
            t0 = time.perf_counter()
            b = clairvoyant_bound(wl, p, gpus=GPUS, slo_s=prepared.profiles["ac"].default_slo_s())
            wall = time.perf_counter() - t0
            print(
                f"| {key} | {wl.n_requests} | {p.name} | {len(p.levels)} | {b.columns} x {b.rows} | "
                f"{100 * b.min_violation:.1f}% | {100 * b.quality:.1f}% | {100 * b.served_quality:.1f}% | {wall:.1f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
