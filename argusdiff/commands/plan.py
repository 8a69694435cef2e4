"""``argusdiff plan``: solve one allocation (ARGUS Eq. 1) and its PASM, a cascade MILP, or the unified
plan of a deployment profile that lists AC levels, smaller models and cascades together.

Examples::

    argusdiff plan --profile sdxl-ac-a100 --gpus 8 --load-qpm 120
    argusdiff plan --profile sdxl-ac-a100 --gpus 8 --load-qpm 120 --backend highs
    argusdiff plan --profile sm-a100 --gpus 16 --load-qpm 400 --affinity 0.1,0.1,0.2,0.2,0.2,0.2 --json
    argusdiff plan --profile cascade-sdturbo-sdv15 --gpus 16 --load-qpm 1200
    argusdiff plan --profile unified-a100 --gpus 8 --load-qpm 180 --tiers interactive=0.2,standard=0.5,batch=0.3
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence

from argusdiff.domain import TIER_PRIORITY, Tier
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
        help="allocation formulation (default: settings [solver] formulation, exact; aggregated when --backend "
        "is given)",
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "highs", "gurobi"),
        default=None,
        help="MILP backend that solves the aggregated or paper formulation (and the cascade MILP); the exact "
        "formulation uses it only for its switch-cost pass with --current (default: settings [solver] backend)",
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
    parser.add_argument(
        "--tiers",
        help="unified profiles: the demand's SLO tier mix, e.g. interactive=0.2,standard=0.5,batch=0.3 "
        "(default: every request standard)",
    )
    parser.add_argument(
        "--hit-rate",
        type=_non_negative_float,
        default=1.0,
        help="unified profiles: cache hit rate of the AC levels with K > 0 (a miss runs at K = 0); default 1.0",
    )
    parser.add_argument(
        "--time-limit-s",
        type=_non_negative_float,
        default=None,
        help="wall-clock limit per solve, in seconds (default: none: every solve stops at its backend's "
        "deterministic limits, so the plan is a pure function of the inputs; with a limit a solve cut short "
        "keeps the best plan found by then, which depends on the machine's speed and load)",
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


def _affinity_value(raw: str, option: str = "--affinity", what: str = "values") -> float:
    """A finite number >= 0 of a weight list option (``--affinity`` values, ``--tiers`` shares)."""
    try:
        v = float(raw)
    except ValueError:
        raise ConfigError(f"{option}: {raw.strip()!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise ConfigError(f"{option}: {what} must be finite and >= 0, got {raw.strip()}")
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


def _formulation(args: argparse.Namespace, settings) -> str:
    """The formulation to solve: an explicit ``--backend`` asks for a MILP, so without an explicit
    ``--formulation`` it selects the aggregated MILP; ``--formulation exact`` with ``--backend`` is
    refused unless ``--current`` gives the exact path a switch-cost pass (its only MILP)."""
    if args.formulation is None:
        return "aggregated" if args.backend is not None else settings.solver.formulation
    if args.formulation == "exact" and args.backend is not None and args.current is None:
        raise ConfigError(
            f"--backend: the exact formulation is solved without a MILP backend ({args.backend} would be used "
            "only by the switch-cost pass with --current); drop --backend or pass --formulation aggregated or paper"
        )
    return args.formulation


def _time_limit(args: argparse.Namespace) -> float:
    """The wall-clock limit per solve: ``--time-limit-s``, else none. Not settings' ``[solver]
    time_limit_s`` (the service's bound on a control period's solve): a MILP that needs longer is
    cut at whatever incumbent the machine's load let it reach (the aggregated plan of 6 GPUs at
    150 QPM with a tier mix took 4.3-5.4 s on HiGHS, and its incumbents at 5 s put different levels
    on the workers run to run), so like a replay the command stops only at the backends'
    deterministic limits (``solver.backends.HIGHS_NODE_LIMIT``, ``GUROBI_WORK_LIMIT``) unless asked."""
    if args.time_limit_s is None:
        return math.inf
    if args.time_limit_s <= 0:
        raise ConfigError(f"--time-limit-s: must be > 0, got {args.time_limit_s:g}")
    return args.time_limit_s


def _quality_by_prompt(profile, affinity: Sequence[float], pasm) -> float:
    """The plan's expected quality relative to each prompt's optimal level (ARGUS: no loss at or
    above it, ``quality(served) / quality(optimal)`` below): ``sum_i H_i sum_j PASM_ij q_ij``, the
    measure the unified plan reports (:func:`solver.paths.class_quality_model`)."""
    from solver.paths import class_quality_model

    q = class_quality_model(profile.levels)
    total = float(sum(affinity)) or 1.0
    return sum(
        h / total * sum(p * q[i][j] for j, p in enumerate(row))
        for i, (h, row) in enumerate(zip(affinity, pasm, strict=True))
    )


def run(args: argparse.Namespace) -> int:
    from argusdiff.config import load_settings
    from argusdiff.profile import load_profile

    settings = load_settings(args.config)
    profile = load_profile(args.profile or settings.profile)
    backend = args.backend or settings.solver.backend
    if args.margin < 1:
        raise ConfigError(f"--margin: must be >= 1, got {args.margin:g}")
    if profile.cascades:
        return _run_unified(args, profile, settings, backend)
    if args.tiers is not None:
        raise ConfigError(f"--tiers: only a profile with [[cascades]] plans per tier; {profile.name!r} has none")
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
        formulation=_formulation(args, settings),
        backend=backend,
        switch_tolerance=tol,
        margin=args.margin,
        time_limit_s=_time_limit(args),
    )
    served = args.gpus > 0
    pasm = oda(affinity, alloc.share) if served else None
    by_prompt = _quality_by_prompt(profile, affinity, pasm) if pasm is not None else None
    if args.json:
        out = {
            "profile": profile.name,
            "gpus": args.gpus,
            "load_qpm": args.load_qpm,
            "margin": args.margin,
            "affinity": list(affinity),
            "pasm": [list(r) for r in pasm] if pasm is not None else None,
            **alloc.to_dict(),
            "expected_quality_by_prompt": by_prompt,
        }
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"{profile.name} on {profile.gpu}: {args.gpus} GPUs, load {args.load_qpm:g} QPM"
        + (f" x margin {args.margin:g}" if args.margin != 1 else "")
        + (
            f"; {alloc.formulation} formulation via {alloc.backend}, {alloc.solve_s * 1000:.1f} ms"
            if served
            else "; no GPUs: nothing to solve"
        )
    )
    if not served:
        print(f"SATURATED: short by {alloc.shortfall_qpm:.1f} QPM: no GPU serves anything")
    width = max(len(i) for i in profile.ids) + 2
    print(f"{'level':<{width}}{'workers':>8}{'QPM/worker':>12}{'load QPM':>10}{'F(v)':>8}{'H(v)':>8}{'quality':>9}")
    for i, lv in enumerate(profile.levels):
        print(
            f"{lv.id:<{width}}{alloc.counts[i]:>8}{lv.peak_qpm:>12.2f}{alloc.loads_qpm[i]:>10.1f}"
            f"{alloc.share[i]:>8.3f}{affinity[i]:>8.3f}{lv.quality:>9.3f}"
        )
    if pasm is None:
        print("capacity 0.0 QPM; expected quality: none (nothing is served); PASM: none")
        return 0
    print(
        f"capacity {alloc.capacity_qpm:.1f} QPM; expected mean quality {alloc.expected_quality:.4f} by level "
        "(F(v) x quality(v): relative to the best level)"
    )
    print(
        f"expected quality {by_prompt:.4f} by prompt (relative to each prompt's optimal level, through the PASM: "
        "the unified plan's measure)"
    )
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


def parse_tiers(text: str | None) -> dict[str, float]:
    """``--tiers``: tier=share pairs (interactive, standard, batch): fractions of the demand in
    [0, 1] that sum to 1 (within 0.01). A mix that does not is refused, not normalised: a share of
    2 is a typo or a count, and silently rescaling it would plan for a mix nobody asked for."""
    if text is None:
        return {}
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, raw = part.partition("=")
        name = name.strip()
        if not sep or name not in TIER_PRIORITY:
            raise ConfigError(f"--tiers: expected tier=share with tier interactive, standard or batch, got {part!r}")
        if name in out:
            raise ConfigError(f"--tiers: tier {name} is given twice")
        share = out[name] = _affinity_value(raw, "--tiers", "shares")
        if share > 1:
            raise ConfigError(f"--tiers: {name}={raw.strip()}: a share is a fraction of the demand in [0, 1]")
    total = sum(out.values())
    if total <= 0:
        raise ConfigError("--tiers: at least one share must be > 0")
    if abs(total - 1.0) > 0.01:
        raise ConfigError(
            f"--tiers: the shares must sum to 1 (fractions of the demand), they sum to {total:g}; "
            "e.g. interactive=0.2,standard=0.5,batch=0.3"
        )
    return {k: v / total for k, v in out.items() if v > 0}


def _run_unified(args, profile, settings, backend) -> int:
    """One unified plan (solver.unified) over every path of ``profile``: print its paths, routing
    shares, cascade thresholds and workers."""
    from solver.paths import TierSpec, nitsum_tiers, problem_from_profile, ranked_deferral
    from solver.unified import plan_unified

    if args.margin < 1:
        raise ConfigError(f"--margin: must be >= 1, got {args.margin:g}")
    if args.hit_rate > 1:
        raise ConfigError(f"--hit-rate: must be in [0, 1], got {args.hit_rate:g}")
    tol = settings.solver.switch_tolerance if args.switch_tolerance is None else args.switch_tolerance
    if tol > 1:
        raise ConfigError(f"--switch-tolerance: must be in [0, 1], got {tol:g}")
    affinity = parse_affinity(args.affinity, profile.ids)
    current = _current(args.current, args.gpus, profile.ids)
    slo = args.slo_s if args.slo_s else profile.default_slo_s()
    mix = parse_tiers(args.tiers)
    tiers = (
        nitsum_tiers(slo, mix, headroom=dict.fromkeys(mix, args.margin))
        if mix
        else (TierSpec(Tier.STANDARD.value, 1.0, slo, 1.0, args.margin),)
    )
    specs = list(profile.cascade_specs)
    problem = problem_from_profile(
        profile,
        args.gpus,
        args.load_qpm,
        cascades=specs,
        affinity=affinity,
        current=current,
        tiers=tiers,
        hit_rate=args.hit_rate,
        cascade_tables=ranked_deferral(profile, specs),
    )
    formulation = "milp" if args.formulation in ("aggregated", "paper") else "exact"
    up = plan_unified(
        problem,
        formulation=formulation,
        backend=backend,
        switch_tolerance=tol,
        time_limit_s=_time_limit(args),
    )
    share = up.share()
    counts = {lv: sum(1 for v in up.level_assignment.values() if v == lv) for lv in up.levels}
    heavy = {p.id: p.heavy.level for p in problem.paths if p.heavy is not None}
    if args.json:
        print(json.dumps(_unified_json(args, profile, tiers, up, share, counts, heavy), indent=2))
        return 0
    _print_unified(args, profile, tiers, up, share, counts, heavy)
    return 0


def _unified_json(args, profile, tiers, up, share, counts, heavy) -> dict:
    """The unified plan as ``--json`` prints it."""
    return {
        "profile": profile.name,
        "gpus": args.gpus,
        "load_qpm": args.load_qpm,
        "margin": args.margin,
        "tiers": {t.name: {"share": t.share, "deadline_s": t.deadline_s} for t in tiers},
        "paths": [
            {
                "id": p,
                "strategy": up.path_strategy[p].value,
                "share": share[up.levels.index(p)],
                "workers": counts.get(p, 0),
                **(
                    {"threshold": up.thresholds[p], "deferral": up.deferral[p], "heavy": heavy[p]}
                    if p in up.thresholds
                    else {}
                ),
            }
            for p in up.paths
        ],
        "workers_per_model": dict(up.counts),
        "assignment": dict(up.level_assignment),
        "routing": {f"{t}/{c}": dict(r) for (t, c), r in up.routing.items()},
        "expected_quality": up.expected_quality,
        "goodput": dict(up.goodput),
        "saturated": up.saturated,
        "shortfall_qpm": up.shortfall_qpm,
        "formulation": up.formulation,
        "backend": up.backend,
        "solve_s": up.solve_s,
        "notes": list(up.notes),
    }


def _print_unified(args, profile, tiers, up, share, counts, heavy) -> None:
    """The unified plan as a table: its paths, workers, expected quality and routing shares."""
    print(
        f"{profile.name} on {profile.gpu}: {args.gpus} GPUs, load {args.load_qpm:g} QPM"
        + (f" x margin {args.margin:g}" if args.margin != 1 else "")
        + f"; unified plan ({up.formulation} via {up.backend}), {up.solve_s * 1000:.1f} ms"
    )
    print("tiers: " + ", ".join(f"{t.name} {t.share:.0%} (deadline {t.deadline_s:.1f} s)" for t in tiers))
    width = max(len(i) for i in profile.ids) + 2
    print(f"{'path':<{width}}{'kind':>9}{'share':>8}{'workers':>9}  cascade")
    for p in up.paths:
        extra = ""
        if p in up.thresholds:
            extra = f"t = {up.thresholds[p]:.3f}, defers {up.deferral[p]:.1%} to {heavy[p]}"
        print(
            f"{p:<{width}}{up.path_strategy[p].value:>9}{share[up.levels.index(p)]:>8.3f}{counts.get(p, 0):>9}  {extra}"
        )
    print("workers per model: " + ", ".join(f"{m} {n}" for m, n in up.counts.items() if n))
    if args.gpus == 0:
        print("expected quality: none, in-SLO share: none (no GPUs: nothing is served)")
    else:
        print(
            f"expected quality {up.expected_quality:.4f} by prompt (relative to each prompt's optimal level, as the "
            "AC plan's 'by prompt'); in-SLO share per tier: " + ", ".join(f"{t} {g:.1%}" for t, g in up.goodput.items())
        )
    if up.saturated:
        print(f"SATURATED: {up.shortfall_qpm:.1f} QPM left unplanned (lowest tiers first)")
    for note in up.notes:
        print(f"note: {note}")
    print("routing shares (tier / optimal level -> paths):")
    for (t, c), r in up.routing.items():
        total = sum(r.values())
        if total <= 0:
            continue
        parts = ", ".join(
            f"{p} {q / total:.2f}" for p, q in sorted(r.items(), key=lambda kv: -kv[1]) if q / total >= 0.005
        )
        print(f"  {t}/{c}: {parts}")


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
        time_limit_s=_time_limit(args),
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
