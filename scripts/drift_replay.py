"""Drift retraining over a replay (ARGUS §4.1: ~7 retrains over its 800-minute trace): how many
times the loop's rule (argusdiff.simulator.drift) retrains for a grid of its knobs, on one
simulation per policy of the ARGUS diagonal trace (50 -> 600 QPM over 800 min) with 8 workers.

Usage: python scripts/drift_replay.py [--policies argus] [--trace SPEC] [--samples 1,0.1,0.05]
       [--tolerances 0.02,0.05] [--windows 500] [--min-samples 500] [--no-embeddings]

Prints, per policy, the served-quality window medians' spread and one row per setting: scored
images, windows, drift flags, retrains and the minutes they happen at.
"""

from __future__ import annotations

import argparse
import itertools
import os

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="diagonal:start=50,end=600,duration=800m")
    ap.add_argument("--policies", default="argus")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--samples", default="1,0.1,0.05")
    ap.add_argument("--tolerances", default="0.02,0.05,0.1")
    ap.add_argument("--windows", default="500")
    ap.add_argument("--history", type=int, default=5)
    ap.add_argument("--min-samples", type=int, default=500)
    ap.add_argument("--no-embeddings", action="store_true")
    args = ap.parse_args()

    from argusdiff.replay import ReplaySpec, prepare, run_replay
    from argusdiff.simulator.drift import DriftSettings, replay_drift

    spec = ReplaySpec(trace=args.trace, gpus=args.gpus, embeddings=not args.no_embeddings, policies=[])
    prepared = prepare(spec)
    wl = prepared.workload
    print(f"trace {args.trace}: {wl.n_requests} requests, {args.gpus} workers; quality: {wl.quality_source}")
    for name in [p for p in args.policies.split(",") if p]:
        spec.policies = [name]
        res = run_replay(spec, prepared=prepared).results[name]
        base = replay_drift(res, DriftSettings(window=500, tolerance=1e9, min_samples=10**9))
        med = np.array(base.window_medians)
        print(f"\n{name}: {base.scored} served; window-500 medians {med[:3].round(2).tolist()} ... "
              f"{med[-3:].round(2).tolist()} (min {med.min():.2f}, max {med.max():.2f})")  # fmt: skip
        print(f"{'sample':>7}{'window':>8}{'tolerance':>10}{'scored':>9}{'windows':>8}{'flags':>7}{'retrains':>9}"
              f"  retrain minutes")  # fmt: skip
        for sample, window, tol in itertools.product(
            floats(args.samples), floats(args.windows), floats(args.tolerances)
        ):
            s = DriftSettings(
                window=int(window), history=args.history, tolerance=tol, min_samples=args.min_samples, sample=sample
            )
            d = replay_drift(res, s, seed=0)
            mins = ", ".join(f"{m:.0f}" for m in d.retrain_at_min[:8]) + (" ..." if d.retrains > 8 else "")
            print(f"{sample:>7g}{int(window):>8d}{tol:>10g}{d.scored:>9d}{d.windows:>8d}{d.events:>7d}"
                  f"{d.retrains:>9d}  {mins}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
