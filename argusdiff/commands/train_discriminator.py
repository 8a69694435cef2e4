"""``argusdiff train-discriminator``: real vs generated images -> ROC-AUC and f(t)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--real", required=True, help="folder of real images (png, jpg, webp)")
    gen = parser.add_mutually_exclusive_group(required=True)
    gen.add_argument("--generated", help="folder of the light model's generated images")
    gen.add_argument(
        "--prompts", help="prompt set (file or 'builtin'): generate the light level's images now (needs --profile)"
    )
    parser.add_argument("--limit", type=int, help="with --prompts: use the first N prompts")
    parser.add_argument("--out", required=True, help="directory to write the trained discriminator to")
    parser.add_argument("--profile", help="cascade profile (name or TOML): records its light/heavy levels")
    parser.add_argument("--config", help="settings TOML ([classifier] section)")
    parser.add_argument("--variant", help="timm model (default: [classifier] discriminator_variant)")
    parser.add_argument(
        "--pretrained",
        metavar="PATH",
        help="local ImageNet weights of the variant to fine-tune from (.safetensors/.pth file or a folder with "
        "model.safetensors); default: [classifier] discriminator_pretrained, else random weights",
    )
    parser.add_argument(
        "--image-size", type=int, help="input size in px (default: [classifier] discriminator_image_size)"
    )
    parser.add_argument("--epochs", type=int, default=10, help="most training epochs")
    parser.add_argument("--batch-size", type=int, default=16, help="images per training step")
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate (AdamW)")
    parser.add_argument("--val-fraction", type=float, default=0.2, help="share of each class held out for validation")
    parser.add_argument("--patience", type=int, default=3, help="early stopping: epochs without improvement")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split, initialisation and shuffling")
    parser.add_argument("--ft-out", help="write f(t) in the profile's [cascade] TOML format to this file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(run=run)


def _generate(args: argparse.Namespace, light: str | None, profile, settings) -> list:
    from argusdiff.errors import ConfigError
    from classifiers.measure import generate_images
    from traces.prompts import load_prompts
    from workers.executor import build_executor
    from workers.registry import ModelRegistry

    if profile is None or light is None:
        raise ConfigError("--prompts needs --profile (a cascade profile: its light level generates the images)")
    prompts = load_prompts(args.prompts)
    if args.limit is not None:
        if args.limit < 2:
            raise ConfigError(f"--limit must be >= 2, got {args.limit}")
        prompts = prompts.head(args.limit)
    registry = ModelRegistry.from_config(settings.workers)
    level = profile.level(light)  # the light level alone, no judge: its raw images
    return generate_images(
        prompts, light, lambda _id: build_executor(level, registry), seed=args.seed, progress=not args.no_progress
    )


def run(args: argparse.Namespace) -> int:
    from argusdiff.config import load_settings
    from argusdiff.errors import ConfigError
    from argusdiff.profile import load_profile
    from classifiers.discriminator import (
        DiscriminatorTrainConfig,
        format_ft_toml,
        list_images,
        pretrained_weights_file,
        train_discriminator,
    )
    from classifiers.errors import ClassifierInputError

    settings = load_settings(args.config).classifier
    for opt, value in (("--epochs", args.epochs), ("--batch-size", args.batch_size), ("--patience", args.patience)):
        if value < 1:
            raise ConfigError(f"{opt} must be >= 1, got {value}")
    if not 0 < args.val_fraction < 1:
        raise ConfigError(f"--val-fraction must be in (0, 1), got {args.val_fraction}")
    pretrained = args.pretrained or settings.discriminator_pretrained
    if pretrained is not None:
        option = "--pretrained" if args.pretrained else "[classifier] discriminator_pretrained"
        try:
            pretrained = str(pretrained_weights_file(pretrained))
        except ClassifierInputError as exc:
            raise ConfigError(f"{option}: {exc}") from None
    light = heavy = profile_name = None
    if args.profile:
        profile = load_profile(args.profile)
        if profile.cascade is None:
            raise ConfigError(f"--profile: {profile.name!r} has no [cascade] section")
        light, heavy, profile_name = profile.cascade.light, profile.cascade.heavy, profile.name
    real = list_images(args.real)
    if args.prompts is not None:
        generated = _generate(args, light, profile if args.profile else None, load_settings(args.config))
    else:
        generated = list_images(args.generated)
    config = DiscriminatorTrainConfig(
        variant=args.variant or settings.discriminator_variant,
        image_size=args.image_size or settings.discriminator_image_size,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        val_fraction=args.val_fraction,
        patience=args.patience,
        seed=args.seed,
        progress=not args.no_progress,
        pretrained=pretrained,
    )
    log = None if args.json else (lambda s: print(s, file=sys.stderr))
    disc, report = train_discriminator(
        real, generated, config=config, profile=profile_name, light=light, heavy=heavy, log=log
    )
    out = disc.save(args.out)
    source = (
        f"f(t) of {len(generated)} generated images ({report.n_val} validation images counted) "
        f"from argusdiff train-discriminator; ROC-AUC {report.roc_auc:.3f}"
    )
    toml = format_ft_toml(report.thresholds, report.deferral, source=source)
    if args.ft_out:
        Path(args.ft_out).write_text(toml, encoding="utf-8")
    if args.json:
        print(json.dumps({"out": str(out), **report.to_dict()}, indent=2))
    else:
        print(report.format())
        print(f"saved to {out}" + (f"; f(t) written to {args.ft_out}" if args.ft_out else ""))
    return 0
