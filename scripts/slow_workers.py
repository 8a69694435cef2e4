"""Workers slower than their profile: does argus+ adapt? (latencies learned online, argusdiff.latency)

Replays a trace with the simulator's ``slow`` fault (by default half the workers run every batch
twice as slowly for 10 minutes) with the product's defaults (admission on), and prints ARGUS and
argus+ (the AC ladder and the unified plan) with measured latencies (the default) and without
(``measured = false``: the profile's latencies, as before), plus the measured scale the last plan
used per level.

Usage: python scripts/slow_workers.py [--trace SPEC] [--gpus 8] [--faults SPEC]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="bursty:low=40,high=160,period=5m,duration=30m")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--faults", default="slow:halfx2@10m+10m")
    args = ap.parse_args(argv)

    from argusdiff.replay import ReplaySpec, run_replay

    print(f"trace {args.trace}, {args.gpus} workers, faults {args.faults}, admission on (defaults)")
    print(f"{'row':34s} {'viol':>6s} {'quality':>8s} {'refused':>8s} {'false':>6s}")
    for opts, suffix in (({}, ""), ({"measured": False}, " (profile latencies)")):
        spec = ReplaySpec(
            trace=args.trace,
            gpus=args.gpus,
            policies=["argus", "argus+"],
            faults=args.faults,
            policy_options=opts,
            ac_only=True,
        )
        res = run_replay(spec)
        for label, s in res.summaries.items():
            if suffix and label == "argus":
                continue
            print(
                f"{label + suffix:34s} {100 * s['slo_violation_ratio']:5.1f}% {100 * s['relative_quality']:7.1f}% "
                f"{s['refused']:8d} {s['false_refusals']:6d}"
            )
        if not suffix:
            for label in ("argus+ (AC)", "argus+"):
                scales = [p.get("latency_scale", {}) for p in res.results[label].plans]
                worst = max(scales, key=lambda d: max(d.values(), default=1.0))
                shown = ", ".join(f"{lv} x{v:.2f}" for lv, v in sorted(worst.items()) if abs(v - 1) > 0.01)
                print(f"  {label}: slowest measured plan: {shown or 'as profiled'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
