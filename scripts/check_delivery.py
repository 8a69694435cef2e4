"""What each baseline's own delivery costs: Proteus, NIRVANA and Sommelier with the per-worker
queues their sources use (``Policy.delivery``) against the same policies on the shared per-level
pull, with PAC (SM) (Proteus's allocation, ARGUS's worker selector, shared pull) beside them.

Traces and load as scripts/run_results.py's ARGUS comparison (8 workers, highest 1-minute rate at
90% of the AC cluster's capacity), admission off (the papers' setting). Prints SLO violations (%)
per trace; docs/results.md's finding on Proteus's worker choice quotes it.

    python scripts/check_delivery.py [--traces twitter,azure,bursty] [--policies proteus,nirvana,sommelier]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="twitter,azure,bursty")
    ap.add_argument("--policies", default="proteus,nirvana,sommelier")
    args = ap.parse_args()

    from run_results import FRACTION, GPUS, SHARED, scaled_trace

    from argusdiff.domain import Delivery
    from argusdiff.policies.base import REGISTRY
    from argusdiff.profile import load_profile
    from argusdiff.replay import ReplaySpec, cluster_capacity_qpm, run_replay

    tmp = Path(tempfile.mkdtemp(prefix="argusdiff-delivery-"))
    peak = FRACTION * cluster_capacity_qpm(load_profile("sdxl-ac-a100"), GPUS)
    sources = {
        "twitter": (str(SHARED / "data" / "traces" / "twitter_proteus_normal-high_load_300.txt"), True),
        "azure": ("diurnal:shape=azure,low=40,high=200,duration=6h", False),
        "bursty": ("bursty:low=40,high=160,period=10m,duration=2h", False),
    }
    traces = [t for t in args.traces.split(",") if t]
    policies = [p for p in args.policies.split(",") if p]
    rows: dict[str, dict[str, float]] = {}
    for key in traces:
        src, drop_slo = sources[key]
        path = tmp / f"{key}.csv"
        scaled_trace(src, peak, path, drop_slo=drop_slo)
        for name in [*policies, "pac"]:
            cls = REGISTRY[name]
            # PAC on the SM ladder: Proteus's allocation with ARGUS's worker selector on the shared pull
            profile = "sm-a100" if cls.family == "sm" or name == "pac" else "sdxl-ac-a100"
            own = cls.delivery
            deliveries = [own] if own is Delivery.SHARED else [own, Delivery.SHARED]
            for d in deliveries:
                cls.delivery = d
                try:
                    t0 = time.process_time()
                    spec = ReplaySpec(
                        trace=str(path), policies=[name], profile=profile, gpus=GPUS, seed=0,
                        admission=False, unified=False,
                    )  # fmt: skip
                    res = run_replay(spec)
                finally:
                    cls.delivery = own
                label = f"{name} ({'SM' if profile == 'sm-a100' else 'AC'}), {d.value}{' (own)' if d is own else ''}"
                v = next(s for lb, s in res.summaries.items() if lb.startswith(name))["slo_violation_ratio"]
                rows.setdefault(label, {})[key] = 100 * v
                print(f"{key:8s} {label:40s} {100 * v:5.1f}%  ({time.process_time() - t0:.0f} CPU-s)", flush=True)
    print()
    print("| policy, delivery | " + " | ".join(traces) + " |")
    print("|---|" + "---|" * len(traces))
    for label, vals in rows.items():
        print(f"| {label} | " + " | ".join(f"{vals.get(k, float('nan')):.1f}%" for k in traces) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
