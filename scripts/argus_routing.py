"""ARGUS's routing against PAC's: each level's routed arrivals per minute against its planned capacity.

ARGUS and PAC plan the same allocation (Eq. 1) on the same ladder; only the routing differs (the
classifier's optimal level + ODA's PASM, or F's shares for every prompt). For each run this prints
the SLO violations and refusals, the distribution over (minute, level) of routed arrivals / the
planned level's capacity (workers × 60 / latency) from ``--from-min`` on, the arrivals and refusals
per level and the minutes each level was over its capacity (docs/baselines.md, "ARGUS's routing
against PAC's").

Usage: python scripts/argus_routing.py [--trace diagonal:start=50,end=600,duration=800m] [--gpus 24]
       [--from-min 300]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="diagonal:start=50,end=600,duration=800m")
    ap.add_argument("--gpus", type=int, default=24)
    ap.add_argument("--from-min", type=int, default=300, help="count minutes from this one on (the loaded part)")
    args = ap.parse_args(argv)

    import numpy as np

    from argusdiff.policies.argus import Argus
    from argusdiff.replay import ReplaySpec, prepare
    from argusdiff.replay.runs import _run_policy, _shared_run_settings

    spec = ReplaySpec(trace=args.trace, gpus=args.gpus, policies=["argus", "pac"], bound=False)
    prep = prepare(spec)
    shared = _shared_run_settings(spec, prep)
    wl = prep.workload
    ac = shared.profiles["ac"]
    runs = {label: (name, extra, on) for label, name, extra, on in shared.runs}
    original = Argus.route
    minute = (wl.arrivals_s // 60).astype(int)
    for label in ("argus", "pac"):
        routed: dict[int, tuple[str, int]] = {}

        def route(self, request, plan, view, _routed=routed):  # records each request's level
            a = original(self, request, plan, view)
            _routed[int(request.id)] = (a.level, plan.version)
            return a

        Argus.route = route
        try:
            name, extra, on = runs[label]
            res, _m, s = _run_policy(spec, wl, shared, label, name, extra, on, {}, None)
        finally:
            Argus.route = original
        plans = {p["version"]: p for p in res.plans}
        arrivals: collections.Counter = collections.Counter()
        refused: collections.Counter = collections.Counter()
        cap: dict[tuple[int, str], float] = {}
        for i, (lv, ver) in routed.items():
            if lv is None or minute[i] < args.from_min:
                continue
            key = (int(minute[i]), lv)
            arrivals[key] += 1
            refused[lv] += bool(res.refused[i])
            cap.setdefault(key, plans[ver]["counts"].get(lv, 0) * 60.0 / ac.level(lv).latency(1))
        ratio = np.array([min(a / cap[k], 5.0) if cap[k] else 5.0 for k, a in arrivals.items()])
        per_level: collections.Counter = collections.Counter()
        over: collections.Counter = collections.Counter()
        for (_m, lv), a in arrivals.items():
            per_level[lv] += a
            over[lv] += a > cap[(_m, lv)]
        print(
            f"{label}: {100 * s['slo_violation_ratio']:.1f}% SLO violations, {s['refused']} refused, "
            f"{100 * s['relative_quality']:.1f}% relative quality"
        )
        print(
            f"  arrivals / capacity per (minute, level) from minute {args.from_min}: mean {ratio.mean():.2f}, "
            f"p90 {np.quantile(ratio, 0.9):.2f}, p99 {np.quantile(ratio, 0.99):.2f}, over 1 in {(ratio > 1).mean():.1%}"
        )
        for lv in ac.ids:
            print(
                f"  {lv:10s} arrivals {per_level[lv]:7d}  refused {refused[lv]:6d}  minutes over capacity {over[lv]:4d}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
