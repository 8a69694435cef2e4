"""``argusdiff replay``: replay a trace through policies on a simulated cluster and compare them.

With no arguments it replays a short embedded bursty trace (30 min at 40↔160 QPM) through every
policy on 8 simulated workers (argus+, the flagship, on the deployment profile that lists every
path, ``unified-a100``), and prints the comparison table with argus+'s domination check.
Admission after the policies (as the service applies it) is on unless ``--no-admission``.
"""

from __future__ import annotations

import argparse
import json
import sys


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise argparse.ArgumentTypeError("no policy given")
    return names


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    _workload_arguments(parser)
    _cluster_arguments(parser)
    _mechanism_arguments(parser)
    _run_arguments(parser)
    _output_arguments(parser)
    parser.set_defaults(run=run)


def _workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload: the trace, its prompts and their quality source."""
    from argusdiff.replay import DEFAULT_TRACE

    parser.add_argument(
        "--trace",
        default=DEFAULT_TRACE,
        help="trace file (format detected) or generator spec, e.g. "
        "diagonal:start=50,end=600,duration=800m or poisson:qpm=120,duration=20m",
    )
    parser.add_argument(
        "--trace-format",
        default=None,
        help="file format when detection is not wanted: argusdiff, diffserve, proteus, azure-minute, azure-hourly",
    )
    parser.add_argument(
        "--prompts",
        default=None,
        help="prompt set: 'diffusiondb' (real, packaged; the default: [traces] prompts), 'builtin' or a file",
    )
    parser.add_argument(
        "--quality",
        default="synthetic",
        help="quality source: synthetic, diffserve (real discriminator confidences for the cascade) "
        "or a QualityTable CSV",
    )


def _cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """The policies and the simulated cluster: workers, profiles, seed, period, SLO, faults."""
    parser.add_argument(
        "--policies",
        type=_policies,
        default=None,
        help="comma-separated policies (default: all): argus,argus+,pac,proteus,nirvana,sommelier,"
        "clipper-ha,clipper-ht,diffserve,diffserve-static",
    )
    parser.add_argument("--gpus", type=int, default=None, help="simulated workers (default from [replay], 8)")
    parser.add_argument("--profile", default="sdxl-ac-a100", help="profile of argus/argus+/pac/nirvana")
    parser.add_argument(
        "--sm-profile", default="sm-a100", help="smaller-model profile (Proteus, Sommelier, Clipper, ARGUS's fallback)"
    )
    parser.add_argument("--cascade-profile", default="cascade-sdxlltn-sdxl", help="profile of the DiffServe policies")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the synthetic quality table, generated traces, the classifier stand-in and jitter",
    )
    parser.add_argument(
        "--period",
        type=float,
        default=None,
        help="control period in seconds for every policy (default: 60 s ARGUS-style, 1 s DiffServe)",
    )
    parser.add_argument("--slo", type=float, default=None, help="SLO in seconds (default: 3 x slowest level)")
    parser.add_argument(
        "--faults",
        default=None,
        help=(
            "fault spec: 'gpus:N@START+DUR;slow:NxF@START+DUR;cache@START+DUR' or 'argus' "
            "(half the GPUs off 40 min twice)"
        ),
    )


def _mechanism_arguments(parser: argparse.ArgumentParser) -> None:
    """The simulated mechanisms: classifier, jitter, cache, demand predictor, load and model loads."""
    parser.add_argument(
        "--classifier",
        default=None,
        help="trained level classifier directory; default: oracle stand-in with --confusion",
    )
    parser.add_argument("--confusion", type=float, default=None, help="oracle stand-in error rate (default 0.1)")
    parser.add_argument("--jitter", type=float, default=None, help="log-normal sigma on service times (default 0)")
    parser.add_argument(
        "--cache-prefill",
        type=float,
        default=None,
        help="share of the prompt set cached before the trace (default 0.5)",
    )
    parser.add_argument(
        "--no-embeddings", action="store_true", help="no MiniLM embeddings: only exact prompt repeats are cache hits"
    )
    parser.add_argument(
        "--predictor",
        default=None,
        help="demand predictor of every policy: peak, quantile, ewma, argus-paper, diffserve-artifact, "
        "proteus-artifact, sommelier-artifact or kind:key=value,... (keys bin, window, alpha, q, margin); "
        "'source': each policy's own paper/artifact reading (default: [predictor] demand)",
    )
    parser.add_argument(
        "--load-fraction",
        type=float,
        default=None,
        help="time-stretch the trace so its peak 1-minute rate is this share of the --profile cluster's maximum",
    )
    parser.add_argument(
        "--load-times",
        choices=("profile", "pytorch", "zero"),
        default="profile",
        help="model load times: the profiles' own (A100: ARGUS Table 2's Accelerate column), Table 2's PyTorch "
        "column, or zero (as the Proteus artifact's simulator)",
    )
    parser.add_argument(
        "--resident-models",
        type=int,
        default=2,
        help="models a simulated worker keeps loaded (default 2, the live [workers] max_loaded_models; the Proteus "
        "artifact hosts 1)",
    )
    parser.add_argument(
        "--static-peak",
        type=float,
        default=None,
        help="anticipated peak (QPM) diffserve-static is provisioned for (default: the trace's highest 1-minute rate)",
    )


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    """Which runs beside each policy's own: baselines on the cascade, ablations, argus+'s profiles,
    admission, the bound."""
    parser.add_argument(
        "--cascade-baselines",
        action="store_true",
        help="run proteus, clipper-ha and clipper-ht on the --cascade-profile's two models (DiffServe's comparison)",
    )
    parser.add_argument(
        "--ablation",
        action="store_true",
        help=(
            "also run argus+ without cascades, AC, SM, tiers or in-period checks, "
            "and argus+ (AC) with each part switched off"
        ),
    )
    parser.add_argument(
        "--unified-profile",
        default="unified-a100",
        help="deployment profile with every path (AC, smaller models, [[cascades]]) argus+ plans; default unified-a100",
    )
    parser.add_argument(
        "--no-unified",
        action="store_true",
        help="argus+ on --profile alone (the AC ladder), not on --unified-profile's every path",
    )
    parser.add_argument(
        "--ac-only",
        action="store_true",
        help="also run argus+ on --profile alone beside the flagship, as 'argus+ (AC)'",
    )
    parser.add_argument(
        "--mixed",
        action="store_true",
        help="also run argus+ on one ladder merging the AC levels of --profile and the models of --sm-profile",
    )
    parser.add_argument(
        "--no-admission",
        action="store_true",
        help="no admission after the policies (each policy alone, as its paper ran it); default: "
        "[admission] replay (on: a request that cannot meet its deadline is refused, as the service does)",
    )
    parser.add_argument(
        "--no-bound",
        action="store_true",
        help="leave out the clairvoyant bound's rows and each policy's gap to it (docs/bound.md)",
    )


def _output_arguments(parser: argparse.ArgumentParser) -> None:
    """Where and how the comparison is written."""
    parser.add_argument("--out", default=None, help="output folder: metrics.csv, summary.json, PNG plots, report.html")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots (report.html without figures)")
    parser.add_argument("--json", action="store_true", help="print summary.json to stdout instead of the table")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _check(args: argparse.Namespace) -> None:
    from argusdiff.errors import ConfigError

    if args.gpus is not None and args.gpus < 1:
        raise ConfigError(f"--gpus: must be >= 1, got {args.gpus}")
    if args.period is not None and not args.period > 0:
        raise ConfigError(f"--period: must be positive, got {args.period}")
    if args.slo is not None and not args.slo > 0:
        raise ConfigError(f"--slo: must be positive, got {args.slo}")
    if args.confusion is not None and not 0.0 <= args.confusion <= 1.0:
        raise ConfigError(f"--confusion: must be in [0, 1], got {args.confusion}")
    if args.jitter is not None and args.jitter < 0:
        raise ConfigError(f"--jitter: must be >= 0, got {args.jitter}")
    if args.cache_prefill is not None and not 0.0 <= args.cache_prefill <= 1.0:
        raise ConfigError(f"--cache-prefill: must be in [0, 1], got {args.cache_prefill}")
    if args.load_fraction is not None and not 0.0 < args.load_fraction <= 10.0:
        raise ConfigError(f"--load-fraction: must be in (0, 10], got {args.load_fraction}")
    if args.resident_models < 1:
        raise ConfigError(f"--resident-models: must be >= 1, got {args.resident_models}")
    if args.static_peak is not None and not args.static_peak > 0:
        raise ConfigError(f"--static-peak: must be a positive QPM, got {args.static_peak}")
    if args.out is not None:
        _check_out(args.out)
    if args.predictor not in (None, "source"):
        from argusdiff.predictors import predictor_spec

        try:
            predictor_spec(args.predictor)
        except ConfigError as exc:
            raise ConfigError(f"--predictor: {exc}") from None


def _check_out(out: str) -> None:
    """``--out`` must name a folder this process can create and write, checked before the
    simulation runs (a replay can take minutes): it is created here when missing."""
    import os
    import tempfile
    from pathlib import Path

    from argusdiff.errors import ConfigError

    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out: {out!r} exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".argusdiff-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"--out: cannot write to folder {out!r}: {exc.strerror or exc}") from None


def _spec(args: argparse.Namespace):
    """The replay's spec from the options and ``[replay]``, ``[admission]``, ``[predictor]`` and
    ``[classifier]`` settings (an option given wins)."""
    from argusdiff.config import load_settings
    from argusdiff.policies import POLICIES
    from argusdiff.replay import DEFAULT_POLICIES, ReplaySpec
    from argusdiff.simulator.drift import DriftSettings

    settings = load_settings()
    cfg = settings.replay
    adm = settings.admission
    admission = adm.mechanism() if adm.replay and adm.enabled and not args.no_admission else False
    policies = args.policies or list(DEFAULT_POLICIES)
    from argusdiff.errors import ConfigError

    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ConfigError(f"--policies: unknown policy {', '.join(unknown)} (known: {', '.join(POLICIES)})")
    spec = ReplaySpec(
        trace=args.trace,
        trace_format=args.trace_format,
        prompts=args.prompts,
        quality=args.quality,
        policies=policies,
        gpus=args.gpus if args.gpus is not None else cfg.gpus,
        profile=args.profile,
        sm_profile=args.sm_profile,
        cascade_profile=args.cascade_profile,
        seed=args.seed,
        period_s=args.period if args.period is not None else None,
        cascade_period_s=cfg.cascade_period_s,
        faults=args.faults,
        slo_s=args.slo,
        slo_factor=cfg.slo_factor,
        tier_slo=dict(cfg.tier_slo_factors),
        classifier=args.classifier,
        confusion=args.confusion if args.confusion is not None else cfg.confusion,
        jitter=args.jitter if args.jitter is not None else cfg.jitter,
        embeddings=not args.no_embeddings,
        progress=not args.quiet,
        cache_latency_s=cfg.cache_latency_s,
        cache_prefill=args.cache_prefill if args.cache_prefill is not None else cfg.cache_prefill,
        ablation=args.ablation,
        mixed=args.mixed,
        unified=not args.no_unified,
        ac_only=args.ac_only,
        unified_profile=args.unified_profile,
        predictor=args.predictor if args.predictor is not None else load_settings().predictor.demand,
        load_fraction=args.load_fraction,
        load_times=args.load_times,
        max_resident_models=args.resident_models,
        static_peak_qpm=args.static_peak,
        cascade_baselines=args.cascade_baselines,
        admission=admission,
        drift=DriftSettings.from_config(settings.classifier),
        bound=not args.no_bound,
    )
    if args.period is None and cfg.period_s != 60.0:
        spec.period_s = cfg.period_s
    return spec


def _progress_bar(args: argparse.Namespace, spec):
    """``(bar, progress)``: a bar over every run of the replay on a terminal, and the callback each
    run reports its progress to; ``(None, None)`` elsewhere or with ``--quiet``."""
    bar = None
    progress = None
    if not args.quiet and sys.stderr.isatty():
        from tqdm import tqdm

        from argusdiff.replay import variant_runs

        n_runs = len(variant_runs(spec))
        bar = tqdm(
            total=n_runs * 100,
            desc="replay",
            unit="%",
            delay=2.0,
            file=sys.stderr,
            leave=False,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}",
        )
        done: dict[str, int] = {}

        def progress(label: str, frac: float) -> None:
            pct = int(frac * 100)
            prev = done.get(label, 0)
            if pct > prev:
                bar.update(pct - prev)
                done[label] = pct
                bar.set_description(f"replay {label}")

    return bar, progress


def run(args: argparse.Namespace) -> int:
    from argusdiff.replay import run_replay

    _check(args)
    spec = _spec(args)
    bar, progress = _progress_bar(args, spec)
    log = None if args.quiet else (lambda m: print(m, file=sys.stderr))
    try:
        result = run_replay(spec, progress=progress, log=log)
    finally:
        if bar is not None:
            bar.close()
    from argusdiff.report import format_table, summary_json, write_outputs

    if args.out:
        files = write_outputs(result, args.out, plots=not args.no_plots)
        if not args.json:
            print(f"wrote {', '.join(str(p) for p in files.values())}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary_json(result), indent=2))
    else:
        print(format_table(result))
    return 0
