#!/usr/bin/env python
"""Fit the synthetic quality generator (traces.synthetic) to ARGUS's published numbers.

Fits, per strategy, on real prompts (default: the first 5k DiffusionDB prompts in ../shared):
  AC on the sdxl-ac-a100 profile -> oracle 20.8, random 17.6 (ARGUS §5.5), Fig. 8 shares (read);
  SM on the sm-a100 profile      -> oracle 20.6, random 18.2 (ARGUS §5.5), same shares.
Prints the fitted parameters (paste into DEFAULT_PARAMS in traces/synthetic.py) and the
calibration report of the SHIPPED defaults on DiffusionDB, the built-in set and PartiPrompts
(with the mean optimal level per PartiPrompts `Challenge`, a sanity check on real labels).

    python scripts/calibrate_synthetic.py [--prompts FILE] [--parti FILE] [--no-fit]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data" / "prompts"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default=str(SHARED / "diffusiondb_2m_first_5k.txt"), help="prompts to fit on")
    ap.add_argument("--parti", default=str(SHARED / "parti_prompts.tsv"), help="PartiPrompts TSV (sanity check)")
    ap.add_argument("--no-fit", action="store_true", help="only report the shipped defaults")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from argusdiff.profile import load_profile
    from traces.prompts import builtin_prompts, load_prompts
    from traces.synthetic import DEFAULT_PARAMS, TARGETS, calibration_report, fit_params, synthetic_quality_table

    if not Path(args.prompts).is_file():
        print(f"{args.prompts}: not found (pass --prompts)", file=sys.stderr)
        return 2
    fit_set = load_prompts(args.prompts)
    sets = {"fit set": fit_set, "builtin": builtin_prompts()}
    parti = load_prompts(args.parti) if Path(args.parti).is_file() else None
    if parti is not None:
        sets["parti"] = parti
    keys = ("optimal_share", "oracle_mean", "random_mean", "best_level_mean", "level_mean")
    for strat, prof_name in (("ac", "sdxl-ac-a100"), ("sm", "sm-a100")):
        profile = load_profile(prof_name)
        target = TARGETS[strat]
        print(f"== {strat.upper()} on {prof_name}; target: {target.citation}")
        if not args.no_fit:
            t0 = time.perf_counter()
            params, rep = fit_params(fit_set, profile, target, seed=args.seed)
            print(f"fitted in {time.perf_counter() - t0:.1f} s on {fit_set.name} ({len(fit_set)} prompts):")
            print("  " + json.dumps({k: round(v, 4) for k, v in params.to_dict().items() if k != "weights"}))
            print("  " + json.dumps({k: rep[k] for k in (*keys, "error")}))
        for name, ps in sets.items():
            table = synthetic_quality_table(ps, profile, seed=args.seed, params=DEFAULT_PARAMS[strat])
            rep = calibration_report(table, target=target)
            print(
                f"shipped defaults on {name} ({len(ps)} prompts): " + json.dumps({k: rep[k] for k in (*keys, "error")})
            )
            if name == "parti" and ps.challenges is not None:
                opt = table.optimal_levels()
                ch = np.array(ps.challenges, dtype=object)
                by = {c: round(float(opt[ch == c].mean()), 2) for c in sorted(set(ps.challenges))}
                print(
                    "  mean optimal level by PartiPrompts Challenge: "
                    + json.dumps(dict(sorted(by.items(), key=lambda x: x[1])))
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
