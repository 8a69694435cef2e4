"""How often argus+'s look inside the period (``checks``) re-plans on counting noise alone.

Steady Poisson arrivals at each rate; the default ``peak`` reading (10 s bins, 60 s window) read
at each period's end and at each 10 s check inside it (:meth:`DemandPredictor.peek` is that
reading); a check re-plans when the reading leaves ``band`` of the demand the plan was made for,
plus one request per bin (``ArgusPlus._moved``), and the plan's demand then becomes the reading.
Prints, per band and rate, the share of checks that re-plan upward and downward and the re-plans a
minute that noise alone causes; and how many checks a step burst of 2x takes to re-plan.

Usage: python scripts/band_noise.py [--bands 0.25,0.35,0.5] [--rates 40,60,150,300,600] [--periods 3000]
       [--steps 2,3]
"""

from __future__ import annotations

import argparse

import numpy as np

BIN_S = 10.0
WINDOW = 6  # bins of the 60 s window


def noise(band: float, qpm: float, periods: int, rng: np.random.Generator) -> tuple[float, float]:
    lam = qpm * BIN_S / 60.0
    per_bin = 60.0 / BIN_S
    bins = list(rng.poisson(lam, WINDOW))
    up = down = n = 0
    for _ in range(periods):
        new = list(rng.poisson(lam, WINDOW))
        base = max(bins) * per_bin
        for k in range(1, WINDOW):
            probe = max((bins + new[:k])[-WINDOW:]) * per_bin
            n += 1
            if abs(probe - base) > band * base + per_bin:
                up += probe > base
                down += probe < base
                base = probe
        bins = new
    return up / n, down / n


def first_bin(band: float, qpm: float, factor: float, trials: int, rng: np.random.Generator) -> float:
    """The share of steps from ``qpm`` to ``factor`` x ``qpm`` whose first closed bin re-plans."""
    lam = qpm * BIN_S / 60.0
    per_bin = 60.0 / BIN_S
    base = rng.poisson(lam, (trials, WINDOW)).max(axis=1) * per_bin
    probe = np.maximum(base, rng.poisson(lam * factor, trials) * per_bin)
    return float(np.mean(probe - base > band * base + per_bin))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bands", default="0.25,0.35,0.5")
    ap.add_argument("--rates", default="40,60,150,300,600")
    ap.add_argument("--periods", type=int, default=3000)
    ap.add_argument("--steps", default="2,3")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'band':>5s} {'QPM':>5s} {'up':>7s} {'down':>7s} {'re-plans/min':>13s}")
    for band in (float(b) for b in args.bands.split(",")):
        for qpm in (float(r) for r in args.rates.split(",")):
            up, down = noise(band, qpm, args.periods, rng)
            print(f"{band:5.2f} {qpm:5.0f} {100 * up:6.2f}% {100 * down:6.2f}% {(up + down) * (WINDOW - 1):13.3f}")
    print(f"{'band':>5s} {'QPM':>5s} {'step':>5s} {'first bin':>10s}")
    for band in (float(b) for b in args.bands.split(",")):
        for qpm in (float(r) for r in args.rates.split(",")):
            for f in (float(x) for x in args.steps.split(",")):
                print(f"{band:5.2f} {qpm:5.0f} {f:4.1f}x {first_bin(band, qpm, f, 20000, rng):10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
