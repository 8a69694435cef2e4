"""``argusdiff train-classifier``: train the prompt -> level classifier from a quality table."""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--table", help="QualityTable CSV (prompt_id,prompt,<level id>...)")
    src.add_argument(
        "--prompts", help="prompt set (file or 'builtin'): generate each at every level of --profile and score it"
    )
    parser.add_argument("--out", required=True, help="directory to write the trained classifier to")
    parser.add_argument(
        "--profile", help="profile (name or TOML) whose levels the classifier is for; default: the table's profile"
    )
    parser.add_argument("--strategy", choices=("ac", "sm", "cascade"), help="train for this strategy's levels only")
    parser.add_argument("--config", help="settings TOML ([classifier] section)")
    parser.add_argument("--mode", choices=("head", "full"), help="frozen encoder + head (fast) or full fine-tune")
    parser.add_argument("--pooling", choices=("mean", "cls"), help="mean of token states (default) or [CLS]")
    parser.add_argument(
        "--class-weighting",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="inverse-frequency class weights in the loss (default off)",
    )
    parser.add_argument("--backbone", help="transformers id or folder (default: the packaged MiniLM BERT)")
    parser.add_argument("--ratio", type=float, help="optimal level = fastest with quality >= ratio x best (0.9)")
    parser.add_argument("--epochs", type=int, default=30, help="most training epochs")
    parser.add_argument("--batch-size", type=int, default=32, help="prompts per training step")
    parser.add_argument("--lr", type=float, help="learning rate (default 3e-4 head, 3e-5 full)")
    parser.add_argument("--val-fraction", type=float, default=0.2, help="share of prompts held out for validation")
    parser.add_argument("--patience", type=int, default=4, help="early stopping: epochs without improvement")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split, initialisation and shuffling")
    parser.add_argument("--max-length", type=int, help="truncate prompts at this many word pieces (128)")
    parser.add_argument("--checkpoint", help="checkpoint directory: resume from it, save after every epoch")
    parser.add_argument("--limit", type=int, help="with --prompts: use the first N prompts")
    parser.add_argument("--metric", choices=("pickscore", "clipscore"), help="with --prompts: quality scorer")
    parser.add_argument("--scorer-model", help="with --prompts: open_clip architecture or model-config JSON")
    parser.add_argument("--scorer-weights", help="with --prompts: scorer weights file or open_clip pretrained tag")
    parser.add_argument("--save-table", help="with --prompts: also write the measured QualityTable CSV here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(run=run)


def _levels_for(profile, strategy: str | None) -> tuple[tuple[str, ...], str | None]:
    from argusdiff.errors import ConfigError

    strategies = sorted({lv.strategy.value for lv in profile.levels})
    if strategy is None:
        if len(strategies) > 1:
            raise ConfigError(
                f"--strategy: profile {profile.name!r} mixes strategies {strategies}; train one model per strategy"
            )
        strategy = strategies[0]
    ids = tuple(lv.id for lv in profile.levels if lv.strategy.value == strategy)
    if len(ids) < 2:
        raise ConfigError(f"--strategy: profile {profile.name!r} has {len(ids)} level(s) of strategy {strategy!r}")
    return ids, strategy


def _measure(args: argparse.Namespace, settings):
    """Generate the prompt set at every level of the profile with the workers and score it."""
    from argusdiff.errors import ConfigError
    from argusdiff.profile import load_profile
    from classifiers.measure import measure_quality_table
    from classifiers.scorers import make_scorer
    from traces.prompts import load_prompts
    from workers.executor import ExecutorFactory
    from workers.registry import ModelRegistry

    if not args.profile:
        raise ConfigError("--prompts needs --profile (the levels to generate at)")
    profile = load_profile(args.profile)
    prompts = load_prompts(args.prompts)
    if args.limit is not None:
        if args.limit < 2:
            raise ConfigError(f"--limit must be >= 2, got {args.limit}")
        prompts = prompts.head(args.limit)
    c = settings.classifier
    scorer = make_scorer(
        args.metric or c.scorer_metric, args.scorer_model or c.scorer_model, args.scorer_weights or c.scorer_pretrained
    )
    registry = ModelRegistry.from_config(settings.workers)
    table = measure_quality_table(
        prompts, profile, scorer, ExecutorFactory(profile, registry), seed=args.seed, progress=not args.no_progress
    )
    if args.save_table:
        table.to_csv(args.save_table)
    return table


def run(args: argparse.Namespace) -> int:
    from argusdiff.config import load_settings
    from argusdiff.errors import ConfigError
    from argusdiff.profile import load_profile
    from classifiers.labelling import select_levels
    from traces.quality import QualityTable

    settings = load_settings(args.config).classifier
    for opt, value in (("--epochs", args.epochs), ("--batch-size", args.batch_size), ("--patience", args.patience)):
        if value < 1:
            raise ConfigError(f"{opt} must be >= 1, got {value}")
    if not 0 < args.val_fraction < 1:
        raise ConfigError(f"--val-fraction must be in (0, 1), got {args.val_fraction}")
    ratio = settings.ratio if args.ratio is None else args.ratio
    if not 0 < ratio <= 1:
        raise ConfigError(f"--ratio must be in (0, 1], got {ratio}")
    if args.prompts is not None:
        table = _measure(args, load_settings(args.config))
    else:
        table = QualityTable.from_csv(args.table)
    profile_name = args.profile or table.profile
    strategy = args.strategy
    if profile_name:
        try:
            profile = load_profile(profile_name)
        except ConfigError:
            if args.profile:
                raise
            profile = None  # the table names a profile this install does not ship: use its levels
        if profile is not None:
            ids, strategy = _levels_for(profile, strategy)
            table = select_levels(table, ids)
            profile_name = profile.name

    from classifiers.train import TrainConfig, train_level_classifier

    config = TrainConfig(
        mode=args.mode or settings.mode,
        pooling=args.pooling or settings.pooling,
        class_weighting=settings.class_weighting if args.class_weighting is None else args.class_weighting,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        val_fraction=args.val_fraction,
        patience=args.patience,
        seed=args.seed,
        ratio=ratio,
        max_length=args.max_length or settings.max_length,
        backbone=args.backbone or settings.backbone,
        progress=not args.no_progress,
        checkpoint_dir=args.checkpoint,
    )
    log = None if args.json else (lambda s: print(s, file=sys.stderr))
    clf, report = train_level_classifier(table, config=config, profile=profile_name, strategy=strategy, log=log)
    out = clf.save(args.out)
    if args.json:
        print(json.dumps({"out": str(out), **report.to_dict()}, indent=2))
    else:
        print(report.format())
        print(f"saved to {out}")
    return 0
