"""``argusdiff quality synth|show|calibrate``: QualityTables (synthetic or measured)."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    synth = sub.add_parser(
        "synth",
        help="write a SYNTHETIC quality table calibrated to ARGUS for a prompt set and profile",
        description="write a SYNTHETIC (not measured) quality table calibrated to ARGUS's published numbers",
    )
    synth.add_argument("--profile", default=None, help="profile name or TOML (default: [profile] of the config)")
    synth.add_argument("--prompts", default=None, help="'builtin' or a text/TSV/CSV file (default: [traces] prompts)")
    synth.add_argument("--seed", type=int, default=None, help="seed (default: [traces] quality_seed)")
    synth.add_argument("--out", "-o", required=True, help="output CSV (QualityTable format)")
    synth.add_argument("--json", action="store_true", help="print the calibration report as JSON")
    synth.set_defaults(run=run_synth)

    show = sub.add_parser("show", help="summarize a quality table", description="summarize a quality table")
    show.add_argument("table", help="QualityTable CSV")
    show.add_argument("--ratio", type=float, default=None, help="optimal-level ratio (default: [traces] optimal_ratio)")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(run=run_show)

    cal = sub.add_parser(
        "calibrate",
        help="compare the synthetic generator with ARGUS's numbers on a prompt set (or fit its parameters)",
        description="compare the synthetic generator with ARGUS §5.5 / Fig. 8 on a prompt set; --fit refits it",
    )
    cal.add_argument("--profile", default=None, help="profile name or TOML (default: [profile] of the config)")
    cal.add_argument("--prompts", default=None, help="'builtin' or a text/TSV/CSV file (default: [traces] prompts)")
    cal.add_argument("--seed", type=int, default=None, help="seed (default: [traces] quality_seed)")
    cal.add_argument("--fit", action="store_true", help="fit the parameters to the targets on these prompts")
    cal.add_argument(
        "--by",
        choices=("category", "challenge"),
        help="also break the optimal level down by the prompt set's category or challenge labels (e.g. PartiPrompts)",
    )
    cal.add_argument("--json", action="store_true", help="machine-readable output")
    cal.set_defaults(run=run_calibrate)


def _context(args):
    from argusdiff.config import load_settings
    from argusdiff.profile import load_profile
    from traces.prompts import load_prompts

    settings = load_settings()
    profile = load_profile(args.profile or settings.profile)
    prompts = load_prompts(args.prompts or settings.traces.prompts)
    seed = settings.traces.quality_seed if args.seed is None else args.seed
    return settings, profile, prompts, seed


def _target_for(profile):
    from argusdiff.domain import Strategy
    from traces.synthetic import TARGETS

    return TARGETS["ac"] if {lv.strategy for lv in profile.levels} == {Strategy.AC} else TARGETS["sm"]


def _print_report(rep: dict) -> None:
    print(f"{rep['prompts']} prompts x {len(rep['levels'])} levels; synthetic: {rep['synthetic']}")
    print(f"source: {rep['source']}")
    print(f"{'level':<18}{'mean':>8}{'rel.mean':>10}{'rel.p10':>9}{'optimal share':>15}")
    for i, lv in enumerate(rep["levels"]):
        print(
            f"{lv:<18}{rep['level_mean'][i]:>8.2f}{rep['level_relative_mean'][i]:>10.3f}"
            f"{rep['level_relative_p10'][i]:>9.3f}{rep['optimal_share'][i]:>15.3f}"
        )
    line = (
        f"mean score: optimal-level routing {rep['oracle_mean']:.2f}, random routing {rep['random_mean']:.2f}, "
        f"best level {rep['best_level_mean']:.2f} (optimal = fastest level >= {rep['ratio']} x best)"
    )
    print(line)
    if "target" in rep:
        t = rep["target"]
        shares = "" if t["shares"] is None else f", shares {t['shares']}"
        print(f"target ({t['citation']}): optimal {t['oracle']}, random {t['random']}{shares}")
        print(f"error: {rep['error']}")


def run_synth(args: argparse.Namespace) -> int:
    from argusdiff.errors import ConfigError
    from traces.synthetic import calibration_report, synthetic_quality_table

    settings, profile, prompts, seed = _context(args)
    table = synthetic_quality_table(prompts, profile, seed=seed)
    try:
        table.to_csv(args.out)
    except OSError as exc:
        raise ConfigError(f"--out: cannot write {args.out}: {exc.strerror}") from None
    rep = calibration_report(table, ratio=settings.traces.optimal_ratio, target=_target_for(profile))
    if args.json:
        print(json.dumps({**rep, "out": args.out}, indent=2))
        return 0
    _print_report(rep)
    print(f"wrote SYNTHETIC quality table ({len(table)} prompts, profile {profile.name}) to {args.out}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from argusdiff.config import load_settings
    from traces.quality import QualityTable
    from traces.synthetic import calibration_report

    table = QualityTable.from_csv(args.table)
    ratio = load_settings().traces.optimal_ratio if args.ratio is None else args.ratio
    rep = calibration_report(table, ratio=ratio)
    rep.update({"metric": table.metric, "profile": table.profile})
    if args.json:
        print(json.dumps(rep, indent=2))
        return 0
    print(f"{args.table}: metric {table.metric}, profile {table.profile or '-'}")
    _print_report(rep)
    return 0


def run_calibrate(args: argparse.Namespace) -> int:
    from argusdiff.errors import ConfigError
    from traces.synthetic import calibration_report, fit_params, params_for, synthetic_quality_table

    _settings, profile, prompts, seed = _context(args)
    target = _target_for(profile)
    labels = None
    if args.by:
        labels = prompts.categories if args.by == "category" else prompts.challenges
        if labels is None:
            raise ConfigError(f"--by {args.by}: prompt set {prompts.name!r} has no {args.by} labels")
    params = fit_params(prompts, profile, target, seed=seed)[0] if args.fit else params_for(profile)
    table = synthetic_quality_table(prompts, profile, seed=seed, params=params)
    rep = calibration_report(table, ratio=target.ratio, target=target, categories=labels)
    if args.json:
        print(json.dumps({**rep, "params": params.to_dict(), "fitted": args.fit}, indent=2))
        return 0
    _print_report(rep)
    if "by_category" in rep:
        print(f"by {args.by} (sorted by mean optimal level; 0 = best level):")
        for label, row in sorted(rep["by_category"].items(), key=lambda kv: kv[1]["mean_optimal_level"]):
            print(
                f"  {label:<28} {row['prompts']:>6} prompts  mean optimal level {row['mean_optimal_level']:.2f}  "
                f"best-level share {row['share_best_level']:.2f}  fastest-level share {row['share_fastest_level']:.2f}"
            )
    print(("fitted" if args.fit else "default") + f" parameters: {json.dumps(params.to_dict())}")
    return 0
