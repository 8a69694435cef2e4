#!/usr/bin/env python
"""Dump what a behaviour-preserving refactor must leave unchanged, as one JSON document.

    python scripts/check_refactor_equal.py --out before.json     # before the change
    python scripts/check_refactor_equal.py --out after.json      # after it
    python scripts/check_refactor_equal.py --compare before.json after.json   # exit 1 on a difference

It holds the unified plans of ``argusdiff plan --profile unified-a100 --json`` for several loads,
tier mixes, worker counts, a current assignment (the switch-cost pass), a partial hit rate and the
MILP formulation; DiffServe's cascade MILP (``--profile cascade-sdxlltn-sdxl``) with and without
queues, by both queue models; and the replay summaries of ``argusdiff replay --json`` on two short traces (one
with slow workers, so the measured latencies feed the plans) for ARGUS, argus+, argus+ (AC)
and DiffServe. Wall-clock fields (``solve_s``, ``wall_s``) are left out: they are the only ones a
refactor may change.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from argusdiff.cli import main as cli  # noqa: E402

TIERS = "interactive=0.2,standard=0.5,batch=0.3"
PLANS: tuple[tuple[str, ...], ...] = (
    ("--gpus", "8", "--load-qpm", "120"),
    ("--gpus", "8", "--load-qpm", "120", "--tiers", TIERS),
    ("--gpus", "4", "--load-qpm", "30", "--tiers", TIERS),
    ("--gpus", "16", "--load-qpm", "400", "--tiers", TIERS),
    ("--gpus", "8", "--load-qpm", "900", "--tiers", TIERS),
    ("--gpus", "8", "--load-qpm", "0"),  # no demand: the nominal plan
    ("--gpus", "4", "--load-qpm", "20000", "--tiers", TIERS),  # over capacity: shortfall by tier
    ("--gpus", "0", "--load-qpm", "60"),  # no workers
    ("--gpus", "8", "--load-qpm", "200", "--hit-rate", "0.6", "--margin", "1.2"),
    ("--gpus", "6", "--load-qpm", "150", "--tiers", TIERS, "--formulation", "aggregated"),
    (
        "--gpus",
        "8",
        "--load-qpm",
        "160",
        "--tiers",
        TIERS,
        "--current",
        "sdxl-k0,sdxl-k0,sdxl-k5,sdxl-k5,sd-1.5,sd-1.5,sdturbo,-",
    ),
)
CASCADE_PLANS: tuple[tuple[str, ...], ...] = (
    ("--gpus", "8", "--load-qpm", "200"),
    ("--gpus", "8", "--load-qpm", "300", "--queue-light", "10", "--queue-heavy", "4"),
    ("--gpus", "4", "--load-qpm", "150", "--queue-light", "6", "--queue-heavy", "2", "--queue-model", "little"),
)
REPLAYS: tuple[tuple[str, ...], ...] = (
    ("--trace", "bursty:low=40,high=160,period=5m,duration=8m", "--policies", "argus,argus+,diffserve", "--ac-only"),
    (
        "--trace",
        "poisson:qpm=100,duration=6m",
        "--policies",
        "argus+,diffserve",
        "--faults",
        "slow:2x2@1m+3m",
        "--seed",
        "3",
        "--ac-only",
    ),
)
WALL = {"solve_s", "wall_s"}


def _run(argv: list[str]) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli(argv)
    if rc != 0:
        raise SystemExit(f"argusdiff {' '.join(argv)} exited {rc}")
    return json.loads(buf.getvalue())


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in WALL}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def dump() -> dict:
    out: dict[str, dict] = {"plans": {}, "replays": {}}
    for args in PLANS:
        out["plans"][" ".join(args)] = _strip(_run(["plan", "--profile", "unified-a100", *args, "--json"]))
    for args in CASCADE_PLANS:
        out["plans"]["cascade " + " ".join(args)] = _strip(
            _run(["plan", "--profile", "cascade-sdxlltn-sdxl", *args, "--json"])
        )
    for args in REPLAYS:
        out["replays"][" ".join(args)] = _strip(_run(["replay", *args, "--json", "--quiet", "--no-plots"]))
    return out


def compare(a: dict, b: dict, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        diffs = [f"{path}/{k}: only in one" for k in sorted(set(a) ^ set(b))]
        for k in a.keys() & b.keys():
            diffs += compare(a[k], b[k], f"{path}/{k}")
        return diffs
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in compare(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the dump here (default: stdout)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two dumps")
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        diffs = compare(a, b)
        for d in diffs[:50]:
            print(d)
        print(f"{len(diffs)} difference(s)")
        return 1 if diffs else 0
    text = json.dumps(dump(), indent=1, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
