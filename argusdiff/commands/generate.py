"""``argusdiff generate "a prompt" [--profile P] [--level L] --out img.png``: one image, locally.

With no ``--profile`` it uses ``demo-cpu``: tiny random-weight pipelines built from configs on
first use (a pipeline check that runs offline on a CPU, not image quality). ``--cache DIR`` serves
approximate-caching levels from a local latent cache in DIR (and fills it on misses).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("prompt", help="the text prompt")
    parser.add_argument("--out", required=True, help="where to write the PNG")
    parser.add_argument(
        "--profile",
        default="demo-cpu",
        help="shipped profile name or TOML path (default: demo-cpu; also demo-cpu-sm, demo-cpu-cascade)",
    )
    parser.add_argument("--level", help="level id of the profile (default: its best level)")
    parser.add_argument("--seed", type=int, help="random seed (default: derived from the prompt)")
    parser.add_argument("--cache", metavar="DIR", help="local latent cache folder for approximate-caching levels")
    parser.add_argument("--config", help="argusdiff TOML config ([workers] device, dtype, model overrides)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (overrides [workers] device)")
    parser.add_argument("--models-dir", help="where demo models are built (overrides [workers] models_dir)")
    parser.add_argument(
        "--discriminator",
        metavar="PATH",
        help="cascade light level: a trained discriminator folder; the request defers to the heavy level "
        "when its confidence is below --threshold",
    )
    parser.add_argument("--threshold", type=float, help="cascade threshold t in [0, 1] (default: middle of f(t))")
    parser.add_argument(
        "--heavy-from-light",
        type=float,
        metavar="STRENGTH",
        help="cascade: start the heavy model from the light latent re-noised to STRENGTH in (0, 1]",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(run=run)


def _profile(name: str):
    from workers.demo import load_demo_profile

    return load_demo_profile(name)


def _checked(args: argparse.Namespace, profile: Any) -> tuple[Any, Path]:
    """The level to run and the image's path, the options checked (each error names its option)."""
    from argusdiff.errors import ConfigError

    if args.level is None:
        level = profile.best
    else:
        try:
            level = profile.level(args.level)
        except KeyError:
            levels = ", ".join(profile.ids)
            raise ConfigError(
                f"option --level: profile {profile.name!r} has no level {args.level!r}; levels: {levels}"
            ) from None
    if args.threshold is not None and not 0.0 <= args.threshold <= 1.0:
        raise ConfigError(f"option --threshold must be in [0, 1], got {args.threshold}")
    if args.heavy_from_light is not None and not 0.0 < args.heavy_from_light <= 1.0:
        raise ConfigError(f"option --heavy-from-light must be in (0, 1], got {args.heavy_from_light}")
    if args.seed is not None and args.seed < 0:
        raise ConfigError(f"option --seed must be >= 0, got {args.seed}")
    out = Path(args.out)
    if out.parent and not out.parent.exists():
        raise ConfigError(f"option --out: folder {str(out.parent)!r} does not exist")
    cascade = profile.cascade
    is_light = cascade is not None and level.id == cascade.light
    if args.discriminator and not is_light:
        raise ConfigError(f"option --discriminator applies to the cascade light level, not {level.id!r}")
    return level, out


def _print_result(out: Path, profile: Any, level: Any, result: Any, cache: Any) -> None:
    """One line on what ran: level, model, seed, UNet calls, times, the cache and the cascade."""
    t = result.timings
    extra = ""
    if level.strategy.value == "ac":
        extra = f", cache {'hit, K=' + str(result.k_used) if result.cache_hit else 'miss'}"
        if result.cache_error:
            extra += f" (cache error: {result.cache_error})"
        elif level.skip and cache is None:
            extra += " (no --cache: ran all steps)"
    if result.confidence is not None:
        extra += f", confidence {result.confidence:.3f}{' -> deferred to ' + result.level if result.deferred else ''}"
    print(
        f"wrote {out} ({profile.name}/{result.level}, model {level.model}, seed {result.seed}, "
        f"{result.unet_calls} UNet calls, denoise {t.get('denoise_s', 0):.3f} s, decode {t.get('decode_s', 0):.3f} s"
        f"{extra})"
    )


def run(args: argparse.Namespace) -> int:
    import os

    from argusdiff.config import load_settings
    from argusdiff.errors import ConfigError

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from argusdiff.service.schemas import prompt_problem

    problem = prompt_problem(args.prompt, load_settings(args.config).service.max_prompt_chars)
    if problem is not None:  # the API's rule (a 400 there)
        raise ConfigError(f"argument prompt {problem[1]}")
    profile = _profile(args.profile)
    level, out = _checked(args, profile)
    settings = load_settings(args.config)
    wcfg = settings.workers
    updates = {}
    if args.device:
        updates["device"] = args.device
    if args.models_dir:
        updates["models_dir"] = args.models_dir
    if updates:
        wcfg = wcfg.model_copy(update=updates)

    from workers.executor import ExecutorFactory
    from workers.messages import WorkItem
    from workers.registry import ModelRegistry

    if wcfg.torch_threads:
        import torch

        torch.set_num_threads(wcfg.torch_threads)
    registry = ModelRegistry.from_config(wcfg)
    model_spec = registry.spec(level.model)  # unknown model: a clear error before anything loads
    cache = None
    if args.cache:
        if level.strategy.value != "ac":
            raise ConfigError(f"option --cache applies to approximate-caching levels, not {level.strategy.value}")
        from cache.latent_cache import LatentCache

        cache = LatentCache.from_config(settings.cache.model_copy(update={"path": args.cache}))
    judge = None
    if args.discriminator:
        from workers.cascade import load_discriminator

        judge = load_discriminator(args.discriminator, light=level.id)
    factory = ExecutorFactory(
        profile,
        registry,
        cache,
        judge=judge,
        threshold=args.threshold,
        inline_heavy=True,
        refine_strength=args.heavy_from_light,
        encoder=settings.cache.encoder,
    )
    executor = factory(level.id)
    item = WorkItem(request_id="cli", prompt=args.prompt, level=level.id, seed=args.seed)
    try:
        result = executor.run([item])[0]
    finally:
        if cache is not None and hasattr(cache, "close"):
            cache.close()
    if not result.ok:
        print(f"argusdiff generate: error: {result.error}", file=sys.stderr)
        return 1
    out.write_bytes(result.image_png or b"")
    loaded = registry.load(level.model)
    summary = {
        "out": str(out),
        "profile": profile.name,
        "level": result.level,
        "requested_level": level.id,
        "model": level.model,
        "seed": result.seed,
        "cache_hit": result.cache_hit,
        "k_used": result.k_used,
        "unet_calls": result.unet_calls,
        "confidence": result.confidence,
        "deferred": result.deferred,
        "cache_error": result.cache_error,
        "timings": dict(result.timings),
        "load_s": round(loaded.load_s, 4),
        "device": loaded.device,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    _print_result(out, profile, level, result, cache)
    if model_spec.source.startswith("demo:"):  # the registry builds it from a config: random weights
        print("note: demo models have random weights: this checks the pipeline, not image quality", file=sys.stderr)
    return 0
