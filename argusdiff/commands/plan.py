"""``argusdiff plan``: solve one allocation (ARGUS Eq. 1) and its PASM, or a cascade MILP.

Examples::

    argusdiff plan --profile sdxl-ac-a100 --gpus 8 --load-qpm 300
    argusdiff plan --profile sm-a100 --gpus 16 --load-qpm 400 --affinity 0.1,0.1,0.2,0.2,0.2,0.2 --json
    argusdiff plan --profile cascade-sdturbo-sdv15 --gpus 16 --load-qpm 1200
"""

from __future__ import annotations

import argparse
import json
import math

from argusdiff.errors import ConfigError


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--profile", help="shipped profile name or path to a profile TOML (default: settings)")
    parser.add_argument("--gpus", type=_non_negative_int, required=True, help="workers (GPUs) in the cluster")
    parser.add_argument("--load-qpm", type=_non_negative_float, required=True, help="predicted load (QPM)")
    parser.add_argument(
        "--affinity",
        help="H: share of prompts whose optimal level is each level, slowest first, comma-separated "
        "(shares or counts; 'id=value' pairs also work); default uniform",
    )
    parser.add_argument(
        "--formulation",
        choices=("exact", "aggregated", "paper"),
        default=None,
        help="allocation formulation (default: settings [solver] formulation, exact)",
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "highs", "gurobi"),
        default=None,
        help="MILP backend (default: settings [solver] backend)",
    )
    parser.add_argument("--margin", type=_non_negative_float, default=1.0, help="capacity factor on the load (>= 1)")
    parser.add_argument(
        "--switch-tolerance",
        type=_non_negative_float,
        default=None,
        help="relative quality a plan may give up to move fewer workers (with --current)",
    )
    parser.add_argument("--current", help="current level per worker, comma-separated level ids ('-' for idle)")
    parser.add_argument(
        "--slo-s", type=_non_negative_float, default=None, help="cascade latency SLO (default: profile)"
    )
    parser.add_argument("--queue-light", type=_non_negative_int, default=0, help="cascade: queued light requests")
    parser.add_argument("--queue-heavy", type=_non_negative_int, default=0, help="cascade: queued heavy requests")
    parser.add_argument(
        "--queue-model",
        choices=("drain", "little"),
        default="drain",
        help="cascade queueing delay: drain time of the plan's workers (default) or Little's law",
    )
    parser.add_argument("--config", help="settings TOML file")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run)


def parse_affinity(text: str | None, level_ids: tuple[str, ...]) -> tuple[float, ...]:
    n = len(level_ids)
    if text is None:
        return tuple(1.0 / n for _ in level_ids)
    parts = [p.strip() for p in text.split(",") if p.strip()]
    values: list[float]
    if parts and all("=" in p for p in parts):
        got: dict[str, float] = {}
        for p in parts:
            key, _, raw = p.partition("=")
            key = key.strip()
            if key not in level_ids:
                raise ConfigError(f"--affinity: unknown level {key!r}; levels: {', '.join(level_ids)}")
            got[key] = _affinity_value(raw)
        values = [got.get(lv, 0.0) for lv in level_ids]
    else:
        if len(parts) != n:
            raise ConfigError(
                f"--affinity: expected {n} values (one per level: {', '.join(level_ids)}), got {len(parts)}"
            )
        values = [_affinity_value(p) for p in parts]
    total = sum(values)
    if total <= 0:
        raise ConfigError("--affinity: at least one value must be > 0")
    return tuple(v / total for v in values)


def _affinity_value(raw: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        raise ConfigError(f"--affinity: {raw.strip()!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise ConfigError(f"--affinity: values must be finite and >= 0, got {raw.strip()}")
    return v


def _current(text: str | None, gpus: int, level_ids: tuple[str, ...]) -> dict[str, str | None] | None:
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != gpus:
        raise ConfigError(f"--current: expected {gpus} entries (one per GPU), got {len(parts)}")
    out: dict[str, str | None] = {}
    for i, p in enumerate(parts):
        if p in ("-", ""):
            out[f"w{i}"] = None
        elif p not in level_ids:
            raise ConfigError(f"--current: unknown level {p!r}; levels: {', '.join(level_ids)}")
        else:
            out[f"w{i}"] = p
    return out


def run(args: argparse.Namespace) -> int:
    from argusdiff.config import load_settings
    from argusdiff.profile import load_profile

    settings = load_settings(args.config)
    profile = load_profile(args.profile or settings.profile)
    backend = args.backend or settings.solver.backend
    if args.margin < 1:
        raise ConfigError(f"--margin: must be >= 1, got {args.margin:g}")
    if profile.cascade is not None:
        return _run_cascade(args, profile, settings, backend)

    from solver.allocate import allocate
    from solver.oda import oda

    tol = settings.solver.switch_tolerance if args.switch_tolerance is None else args.switch_tolerance
    if tol > 1:
        raise ConfigError(f"--switch-tolerance: must be in [0, 1], got {tol:g}")
    affinity = parse_affinity(args.affinity, profile.ids)
    current = _current(args.current, args.gpus, profile.ids)
    alloc = allocate(
        profile.levels,
        args.gpus,
        args.load_qpm,
        current=current,
        formulation=args.formulation or settings.solver.formulation,
        backend=backend,
        switch_tolerance=tol,
        margin=args.margin,
        time_limit_s=settings.solver.time_limit_s,
    )
    pasm = (
        oda(affinity, alloc.share)
        if args.gpus > 0
        else tuple(tuple(1.0 if i == j else 0.0 for j in range(len(profile.ids))) for i in range(len(profile.ids)))
    )
    if args.json:
        out = {
            "profile": profile.name,
            "gpus": args.gpus,
            "load_qpm": args.load_qpm,
            "margin": args.margin,
            "affinity": list(affinity),
            "pasm": [list(r) for r in pasm],
            **alloc.to_dict(),
        }
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"{profile.name} on {profile.gpu}: {args.gpus} GPUs, load {args.load_qpm:g} QPM"
        + (f" x margin {args.margin:g}" if args.margin != 1 else "")
        + f"; {alloc.formulation} formulation via {alloc.backend}, {alloc.solve_s * 1000:.1f} ms"
    )
    width = max(len(i) for i in profile.ids) + 2
    print(f"{'level':<{width}}{'workers':>8}{'QPM/worker':>12}{'load QPM':>10}{'F(v)':>8}{'H(v)':>8}{'quality':>9}")
    for i, lv in enumerate(profile.levels):
        print(
            f"{lv.id:<{width}}{alloc.counts[i]:>8}{lv.peak_qpm:>12.2f}{alloc.loads_qpm[i]:>10.1f}"
            f"{alloc.share[i]:>8.3f}{affinity[i]:>8.3f}{lv.quality:>9.3f}"
        )
    print(f"capacity {alloc.capacity_qpm:.1f} QPM; expected mean quality {alloc.expected_quality:.4f}")
    if current is not None:
        print(f"moved workers: {alloc.moved_workers} (switch cost {alloc.switch_cost:.1f})")
    if alloc.saturated:
        print(f"SATURATED: short by {alloc.shortfall_qpm:.1f} QPM even with every GPU at the fastest level")
    for note in alloc.notes:
        print(f"note: {note}")
    print("PASM P(served | optimal): rows = optimal level, columns = served level")
    print(" " * width + "".join(f"{lv[:9]:>10}" for lv in profile.ids))
    for i, row in enumerate(pasm):
        print(f"{profile.ids[i]:<{width}}" + "".join(f"{p:>10.3f}" for p in row))
    return 0


def _run_cascade(args, profile, settings, backend) -> int:
    from solver.cascade import solve_cascade

    c = profile.cascade
    slo = args.slo_s if args.slo_s is not None else profile.default_slo_s()
    if slo <= 0:
        raise ConfigError(f"--slo-s: must be > 0, got {slo:g}")
    plan = solve_cascade(
        c,
        profile.level(c.light),
        profile.level(c.heavy),
        args.gpus,
        args.load_qpm,
        slo,
        queue_light=args.queue_light,
        queue_heavy=args.queue_heavy,
        queue_model=args.queue_model,
        overprovision=settings.solver.overprovision * args.margin,
        backend=backend,
        time_limit_s=settings.solver.time_limit_s,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "profile": profile.name,
                    "gpus": args.gpus,
                    "load_qpm": args.load_qpm,
                    "slo_s": slo,
                    "light": c.light,
                    "heavy": c.heavy,
                    **plan.to_dict(),
                },
                indent=2,
            )
        )
        return 0
    print(
        f"{profile.name} on {profile.gpu}: {args.gpus} GPUs, load {args.load_qpm:g} QPM "
        f"(x {settings.solver.overprovision * args.margin:g} = {plan.demand_qpm:.1f} planned), SLO {slo:g} s; "
        f"cascade MILP via {plan.backend}, {plan.solve_s * 1000:.1f} ms"
    )
    print(f"light {c.light}: {plan.x_light} workers, batch {plan.b_light}, capacity {plan.capacity_light_qpm:.1f} QPM")
    print(f"heavy {c.heavy}: {plan.x_heavy} workers, batch {plan.b_heavy}, capacity {plan.capacity_heavy_qpm:.1f} QPM")
    print(
        f"threshold t = {plan.threshold:g}; deferred f(t) = {plan.deferral:.3f}; latency bound use "
        f"{plan.latency_s:.2f} s of {slo:g} s"
    )
    if plan.saturated:
        tail = "" if plan.feasible else "; latency bound not met"
        print(f"SATURATED: short by {plan.shortfall_qpm:.1f} QPM{tail}")
    for note in plan.notes:
        print(f"note: {note}")
    return 0
