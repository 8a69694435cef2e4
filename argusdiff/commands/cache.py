"""``argusdiff cache stats|ls|verify|clear|warm`` on the configured latent cache.

The cache is the one ``[cache]`` in the settings describes (``--config``, ``ARGUSDIFF_CACHE__*``);
``--path`` overrides its folder. ``stats``, ``ls``, ``verify`` and ``clear`` refuse a folder that
holds no cache (exit 2 naming ``--path`` or ``[cache] path``); only ``warm`` creates one: it fills
the cache by running the profile's full-quality AC level on a prompt set, capturing the latents
every AC level of the profile resumes from.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime

from argusdiff.errors import ConfigError


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--config", help="settings TOML (its [cache] section); ARGUSDIFF_CACHE__* variables override it")
    p.add_argument("--path", help="cache folder (overrides [cache] path)")
    return p


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    common = _common()
    sub = parser.add_subparsers(dest="action", metavar="ACTION")

    p = sub.add_parser("stats", parents=[common], help="prompts, latents, bytes and stored hits per K")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run_stats)

    p = sub.add_parser("ls", parents=[common], help="list cached prompts (ids, model, K latents, size, hits)")
    p.add_argument("--limit", type=int, default=50, help="rows to show (default 50; 0 = all)")
    p.add_argument("--sort", choices=("hits", "created", "size"), default="created", help="order (newest first)")
    p.add_argument("--json", action="store_true", help="machine-readable output (one object per line)")
    p.set_defaults(run=run_ls)

    p = sub.add_parser("verify", parents=[common], help="check index against store; repair unless --dry-run")
    p.add_argument("--deep", action="store_true", help="also read and checksum every blob")
    p.add_argument("--dry-run", action="store_true", help="report only, change nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run_verify)

    p = sub.add_parser("clear", parents=[common], help="delete every cached prompt and latent")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(run=run_clear)

    p = sub.add_parser(
        "warm",
        parents=[common],
        help="fill the cache: run the full-quality AC level on prompts, storing their latents",
    )
    p.add_argument("--profile", help="profile name or TOML (default: the settings' profile)")
    p.add_argument("--level", help="AC level with K = 0 to run (default: the profile's K = 0 AC level)")
    p.add_argument(
        "--prompts", help="prompt set: 'diffusiondb', 'builtin' or a .txt/.tsv/.csv file (default: [traces] prompts)"
    )
    p.add_argument("--limit", type=int, default=20, help="prompts to run (default 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first prompt (the next ones add 1)")
    p.set_defaults(run=run_warm)


def _settings(args: argparse.Namespace):
    from argusdiff.config import load_settings

    settings = load_settings(args.config)
    if args.path:
        settings = settings.model_copy(update={"cache": settings.cache.model_copy(update={"path": args.path})})
    return settings


def _existing(args: argparse.Namespace):
    """The settings of a cache that must already exist: the commands that read, repair or clear a
    cache refuse a folder that holds none (a typo in ``--path`` must not create an empty cache and
    report it). Only ``warm`` creates a cache."""
    from pathlib import Path

    settings = _settings(args)
    cfg = settings.cache
    option = "--path" if args.path else "[cache] path"
    root = Path(cfg.path).expanduser()
    needed = []
    if cfg.index == "hnsw":
        needed.append(root / "index" / "index.sqlite")
    elif not cfg.qdrant_url:
        needed.append(root / "qdrant")
    if cfg.store == "local":
        needed.append(root / "blobs")
    missing = [p for p in needed if not p.exists()]
    if not root.is_dir() or missing:
        what = (
            "no such folder"
            if not root.exists()
            else ("not a folder" if not root.is_dir() else f"no {', '.join(str(p.relative_to(root)) for p in missing)}")
        )
        raise ConfigError(
            f"{option}: {cfg.path} is not a latent cache ({what}; `argusdiff cache warm` fills a new one)"
        )
    return settings


def _open(args: argparse.Namespace, *, read_only: bool = False):
    from cache.latent_cache import LatentCache

    return LatentCache.from_config(_existing(args).cache, read_only=read_only)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def run_stats(args: argparse.Namespace) -> int:
    with _open(args, read_only=True) as cache:
        usage = cache.usage()
        usage["cache"] = cache.description
        usage["thresholds"] = [list(t) for t in cache.policy.thresholds]
    if args.json:
        print(json.dumps(usage, indent=2))
        return 0
    print(f"cache: {usage['cache']}")
    budget = "unlimited" if usage["byte_budget"] is None else _human(usage["byte_budget"])
    print(f"prompts: {usage['prompts']}  latents: {usage['latents']}  size: {_human(usage['bytes'])} (budget {budget})")
    print("thresholds: " + ", ".join(f"sim > {s:g} -> K={k}" for s, k in usage["thresholds"]))
    if usage["latents_by_k"]:
        print(f"{'K':>4}{'latents':>10}{'hits':>10}")
        for k, n in usage["latents_by_k"].items():
            print(f"{k:>4}{n:>10}{usage['hits_by_k'].get(k, 0):>10}")
    return 0


def run_ls(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise ConfigError(f"--limit must be >= 0 (got {args.limit})")
    with _open(args, read_only=True) as cache:
        entries = list(cache.entries())
    key = {"hits": lambda e: e.hits, "created": lambda e: e.created_s, "size": lambda e: e.size_bytes}[args.sort]
    entries.sort(key=key, reverse=True)
    total = len(entries)
    if args.limit:
        entries = entries[: args.limit]
    for e in entries:
        row = {
            "prompt_id": e.prompt_id,
            "model": e.model,
            "created": datetime.fromtimestamp(e.created_s, UTC).isoformat(timespec="seconds"),
            "ks": list(e.ks),
            "bytes": e.size_bytes,
            "hits": {str(k): s.hits for k, s in e.latents.items()},
        }
        if args.json:
            print(json.dumps(row))
        else:
            ks = ",".join(str(k) for k in e.ks)
            size = _human(e.size_bytes)
            print(f"{e.prompt_id}  {e.model:<20} K={ks:<14} {size:>10}  hits={e.hits:<5} {row['created']}")
    if not args.json:
        print(f"({len(entries)} of {total} prompts)", file=sys.stderr)
    return 0


def run_verify(args: argparse.Namespace) -> int:
    with _open(args) as cache:
        report = cache.verify(repair=not args.dry_run, deep=args.deep)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        action = "repaired" if report["repaired"] else "found (dry run)"
        print(
            f"latents: {report['latents']}  blobs: {report['blobs']}  {action}: dangling {report['dangling']}, "
            f"orphans {report['orphans']}, corrupt {report['corrupt']}"
        )
    bad = report["dangling"] + report["orphans"] + report["corrupt"]
    return 1 if (bad and args.dry_run) else 0


def run_clear(args: argparse.Namespace) -> int:
    settings = _existing(args)
    if not args.yes:
        if not sys.stdin.isatty():
            raise ConfigError("clear: pass --yes to delete the cache without a terminal to confirm on")
        answer = input(f"delete every cached latent in {settings.cache.path}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return 1
    from cache.latent_cache import LatentCache

    with LatentCache.from_config(settings.cache) as cache:
        n = cache.clear()
    print(f"deleted {n} latent blobs")
    return 0


def run_warm(args: argparse.Namespace) -> int:
    from argusdiff.domain import Strategy
    from argusdiff.profile import load_profile

    if args.limit < 1:
        raise ConfigError(f"--limit must be >= 1 (got {args.limit})")
    settings = _settings(args)
    profile = load_profile(args.profile or settings.profile)
    if args.level:
        try:
            level = profile.level(args.level)
        except KeyError as exc:
            raise ConfigError(f"--level: {exc.args[0]}") from None
    else:
        full = [lv for lv in profile.levels if lv.strategy is Strategy.AC and lv.skip == 0]
        if not full:
            raise ConfigError(f"--profile: {profile.name!r} has no approximate-caching level with K = 0 to warm from")
        level = full[0]
    if level.strategy is not Strategy.AC or level.skip != 0:
        raise ConfigError(f"--level: {level.id!r} must be an approximate-caching level with K = 0 (runs all N steps)")
    from traces.prompts import load_prompts

    prompts = load_prompts(args.prompts).head(args.limit)

    from cache.latent_cache import LatentCache
    from workers.ac import ApproxCacheExecutor, ac_capture_ks
    from workers.messages import WorkItem
    from workers.registry import ModelRegistry

    ks = ac_capture_ks(profile, level)
    if not ks:
        raise ConfigError(f"--profile: {profile.name!r} has no AC level of model {level.model!r} with K > 0 to serve")
    registry = ModelRegistry.from_config(settings.workers)
    with LatentCache.from_config(settings.cache) as cache:
        executor = ApproxCacheExecutor(level, registry, cache=cache, capture_ks=ks, encoder=settings.cache.encoder)
        executor.embed([prompts[0]])  # fail fast (before any generation) when no prompt encoder loads
        ok = failed = 0
        t0 = time.perf_counter()
        for i, prompt in enumerate(prompts):
            item = WorkItem(request_id=f"warm-{i}", prompt=prompt, level=level.id, seed=args.seed + i)
            (result,) = executor.run([item])
            if result.ok and not result.cache_error:
                ok += 1
            else:
                failed += 1
                print(f"prompt {i}: {result.error or result.cache_error}", file=sys.stderr)
        elapsed = time.perf_counter() - t0
        usage = cache.usage()
    print(
        f"warmed {ok} of {len(prompts)} prompts on {level.id} ({level.model}, K = {', '.join(map(str, ks))}) "
        f"in {elapsed:.1f} s; cache now holds {usage['prompts']} prompts, {usage['latents']} latents, "
        f"{_human(usage['bytes'])}"
    )
    return 0 if failed == 0 else 1
