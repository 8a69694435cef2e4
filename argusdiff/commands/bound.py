"""``argusdiff bound``: the clairvoyant bound of a trace on deployment profiles (docs/bound.md).

Examples::

    argusdiff bound --trace bursty:low=40,high=160,period=5m,duration=30m --gpus 8
    argusdiff bound --trace diagonal:start=50,end=600,duration=800m --profile sdxl-ac-a100,unified-a100 --json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

from argusdiff.errors import ArgusdiffError, ConfigError

DEFAULT_PROFILES = ("unified-a100", "sdxl-ac-a100", "sm-a100", "cascade-sdxlltn-sdxl")


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    from argusdiff.replay import DEFAULT_TRACE

    parser.add_argument(
        "--trace",
        default=DEFAULT_TRACE,
        help="trace file (format detected) or generator spec, as for replay",
    )
    parser.add_argument("--trace-format", default=None, help="file format when detection is not wanted (as for replay)")
    parser.add_argument(
        "--prompts", default=None, help="prompt set: 'diffusiondb', 'builtin' or a file (default: [traces] prompts)"
    )
    parser.add_argument(
        "--quality", default="synthetic", help="quality source: synthetic, diffserve or a QualityTable CSV"
    )
    parser.add_argument(
        "--profile",
        default=",".join(DEFAULT_PROFILES),
        help="comma-separated profiles to bound (shipped names or TOML paths)",
    )
    parser.add_argument("--gpus", default=None, help="workers (default from [replay], 8)")
    parser.add_argument(
        "--slo", default=None, help="deployment SLO in seconds (default: 3 x the slowest level of sdxl-ac-a100)"
    )
    parser.add_argument(
        "--load-fraction",
        default=None,
        help="time-stretch the trace so its peak 1-minute rate is this share of the sdxl-ac-a100 cluster's maximum "
        "(as replay --load-fraction)",
    )
    parser.add_argument("--faults", default=None, help="fault spec as for replay (workers off lower the capacity)")
    parser.add_argument("--seed", default="0", help="seed of the synthetic quality tables and generated traces")
    parser.add_argument("--bin", default=None, help="time bin in seconds (default: the shortest SLO / 8)")
    parser.add_argument("--json", action="store_true", help="print the bounds as JSON")
    parser.set_defaults(run=run)


def _number(text: str | None, option: str, *, whole: bool = False, low: float = 0.0, strict: bool = True):
    if text is None:
        return None
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise ConfigError(f"{option}: expected {kind}, got {text!r}") from None
    if not math.isfinite(value) or (value <= low if strict else value < low):
        raise ConfigError(f"{option}: must be {'>' if strict else '>='} {low:g}, got {text}")
    return value


def _slot(profile) -> str:
    """The replay field a profile takes (its family)."""
    from argusdiff.domain import Strategy

    if profile.cascades:
        return "unified_profile"
    if profile.cascade is not None:
        return "cascade_profile"
    if profile.strategies == {Strategy.SM}:
        return "sm_profile"
    return "profile"


def run(args: argparse.Namespace) -> int:
    from argusdiff.bound import clairvoyant_bound
    from argusdiff.config import load_settings
    from argusdiff.profile import load_profile
    from argusdiff.replay import ReplaySpec, prepare
    from argusdiff.simulator import parse_faults

    cfg = load_settings().replay
    gpus = _number(args.gpus, "--gpus", whole=True, low=1, strict=False)
    gpus = cfg.gpus if gpus is None else gpus
    slo = _number(args.slo, "--slo")
    lf = _number(args.load_fraction, "--load-fraction")
    if lf is not None and lf > 10:
        raise ConfigError(f"--load-fraction: must be in (0, 10], got {args.load_fraction}")
    bin_s = _number(args.bin, "--bin")
    seed = _number(args.seed, "--seed", whole=True, low=0, strict=False)
    names = [n.strip() for n in str(args.profile).split(",") if n.strip()]
    if not names:
        raise ConfigError("--profile: no profile given")
    profiles = []
    for n in names:
        try:
            profiles.append(load_profile(n))
        except ArgusdiffError as exc:
            raise ConfigError(f"--profile: {exc}") from None
    rows = []
    prepared_by_slot: dict[tuple[str, str], object] = {}
    for p in profiles:
        slot = _slot(p)
        key = (slot, p.source or p.name)
        prepared = prepared_by_slot.get(key)
        if prepared is None:
            fields = {slot: str(p.source or p.name)} if slot != "profile" else {"profile": str(p.source or p.name)}
            spec = ReplaySpec(
                trace=args.trace,
                trace_format=args.trace_format,
                prompts=args.prompts,
                quality=args.quality,
                gpus=gpus,
                seed=seed,
                slo_s=slo,
                slo_factor=cfg.slo_factor,
                embeddings=False,
                load_fraction=lf,
                admission=False,
                **fields,
            )
            try:
                prepared = prepare(spec)
            except ArgusdiffError as exc:
                msg = str(exc)
                raise ConfigError(msg if msg.startswith("--") else f"--trace: {msg}") from None
            prepared_by_slot[key] = prepared
        wl = prepared.workload
        primary = prepared.profiles["ac"]
        deploy_slo = slo if slo is not None else primary.default_slo_s(cfg.slo_factor)
        faults = parse_faults(args.faults, gpus=gpus, duration_s=float(prepared.trace.duration_s))
        t0 = time.perf_counter()
        b = clairvoyant_bound(
            wl, p, gpus=gpus, slo_s=deploy_slo, tier_slo=dict(cfg.tier_slo_factors), faults=faults, bin_s=bin_s
        )
        rows.append((p, b, time.perf_counter() - t0, prepared))
    if args.json:
        print(json.dumps(_bounds_json(rows), indent=2, default=lambda x: None if x != x else x))
        return 0
    _print_bounds(rows, gpus)
    sys.stdout.flush()
    return 0


def _bounds_json(rows) -> dict:
    """The bounds as ``--json`` prints them."""
    prov = rows[0][3].provenance
    return {
        "trace": prov["trace_name"],
        "requests": prov["requests"],
        "duration_min": prov["duration_min"],
        "load_scaling": prov.get("load_scaling", ""),
        "bounds": [b.as_dict() for _p, b, _t, _pr in rows],
    }


def _print_bounds(rows, gpus: int) -> None:
    """The bounds as a table, one row per profile, with what each column means."""
    from argusdiff.bound import RELAXED

    prov = rows[0][3].provenance
    print(
        f"clairvoyant bound of {prov['trace_name']} ({prov['requests']} requests, {prov['duration_min']:.0f} min, "
        f"mean {prov['mean_qpm']:.0f} QPM, peak {prov['peak_qpm']:.0f} QPM); {gpus} workers; "
        f"SLO {rows[0][1].slo_s:.1f} s"
    )
    if prov.get("load_scaling"):
        print(f"load: {prov['load_scaling']}")
    head = (
        f"{'profile':<24}{'levels':>7}{'fewest viol':>13}{'rel.qual':>10}{'served q':>10}"
        f"{'bin s':>7}{'windows':>9}{'LP cols':>10}{'LP rows':>9}{'s':>7}"
    )
    print(head)
    print("-" * len(head))
    for p, b, wall, _pr in rows:
        print(
            f"{p.name:<24}{len(p.levels):>7}{100 * b.min_violation:>12.1f}%{100 * b.quality:>9.1f}%"
            f"{100 * b.served_quality:>9.1f}%{b.bin_s:>7.2f}{b.windows:>9}{b.columns:>10}{b.rows:>9}{wall:>7.1f}"
        )
        for note in b.notes:
            print(f"  {p.name}: {note}")
    print(
        "fewest viol: the smallest SLO violation ratio any schedule could have; rel.qual: the best mean relative "
        "quality of the on-time requests at it; served q: the best relative quality per request of the trace "
        "(late requests score 0). Upper bounds, not a policy (docs/bound.md)."
    )
    print("relaxed: " + "; ".join(RELAXED))
