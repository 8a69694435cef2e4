"""``argusdiff serve``: the REST endpoint, router and control loop (embedded workers by default).

With no arguments it serves the ``demo-cpu`` profile (tiny models; SM fallback ``demo-cpu-sm``)
with embedded workers and in-process queues, so it runs on a CPU machine. ``--redis URL``
distributes the work over Redis Streams to ``argusdiff worker`` processes.
"""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_PROFILE = "demo-cpu"
DEFAULT_FALLBACK = "demo-cpu-sm"


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--config", metavar="FILE", help="settings TOML (ARGUSDIFF_* variables override it)")
    parser.add_argument(
        "--profile", help=f"deployment profile name or TOML path (default: the config's, else {DEFAULT_PROFILE})"
    )
    parser.add_argument("--redis", metavar="URL", help="redis://host:port/db: distribute work to `argusdiff worker`s")
    parser.add_argument("--host", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="TCP port (default 8000)")
    parser.add_argument("--workers", type=int, metavar="N", help="embedded workers in this process (default 2)")
    parser.add_argument("--policy", help="routing policy (default argus; see `argusdiff replay --help`)")
    parser.add_argument("--fallback-profile", metavar="NAME", help="SM profile to switch to when the cache degrades")
    parser.add_argument("--api-key", action="append", metavar="KEY", help="accepted Bearer key (repeatable)")
    parser.add_argument(
        "--stand-in-workers",
        type=float,
        metavar="SCALE",
        help="TEST MODE: embedded workers sleep the profiled latency x SCALE instead of running models",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="logging threshold"
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="log lines as text or one JSON object a line; both carry the request id (default: text)",
    )
    parser.set_defaults(run=run)


def settings_from_args(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from argusdiff.config import Settings, load_settings
    from argusdiff.errors import ConfigError

    settings = load_settings(args.config)
    data = settings.model_dump()
    svc = data["service"]
    explicit = {
        "redis_url": args.redis,
        "host": args.host,
        "port": args.port,
        "workers": args.workers,
        "policy": args.policy,
        "fallback_profile": args.fallback_profile,
        "stand_in_scale": args.stand_in_workers,
    }
    svc.update({k: v for k, v in explicit.items() if v is not None})
    if args.api_key:
        svc["api_keys"] = tuple(args.api_key)
    if args.profile:
        data["profile"] = args.profile
    elif not _config_sets_profile(args.config):
        data["profile"] = DEFAULT_PROFILE
        if svc.get("fallback_profile") is None:
            svc["fallback_profile"] = DEFAULT_FALLBACK  # the demo shows the AC -> SM switch too
        if data["classifier"].get("fit_at_start") is None:
            data["classifier"]["fit_at_start"] = True  # the demo routes by prompt
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        options = {f"service.{k}": f"--{k.replace('_', '-')}" for k in explicit}
        options.update({"service.redis_url": "--redis", "service.stand_in_scale": "--stand-in-workers"})
        options.update({"service.api_keys": "--api-key", "profile": "--profile"})
        parts = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            where = options.get(field, f"[{field.replace('.', '] ', 1)}" if "." in field else field)
            parts.append(f"{where}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError("; ".join(parts)) from None


def _config_sets_profile(path: str | None) -> bool:
    import os
    import tomllib

    if os.environ.get("ARGUSDIFF_PROFILE"):
        return True
    if path is None:
        return False
    with open(path, "rb") as fh:
        return "profile" in tomllib.load(fh)


def run(args: argparse.Namespace) -> int:
    import logging

    from argusdiff import tracing
    from argusdiff.service.api import make_server
    from argusdiff.service.app import Service

    tracing.configure_logging(args.log_level, args.log_format)
    settings = settings_from_args(args)
    from argusdiff.commands.worker import start_tracing

    start_tracing(settings, "argusdiff-router")
    cfg = settings.service
    if cfg.redis_url:  # exit 2 naming --redis, as worker and status do (not a traceback at start)
        from argusdiff.commands.worker import check_redis

        check_redis(cfg.redis_url)
    service = Service(settings)
    mode = f"redis {cfg.redis_url}" if cfg.redis_url else "embedded queues"
    workers = f"{cfg.workers} embedded worker(s)" + (" (stand-in TEST MODE)" if cfg.stand_in_scale else "")
    logging.getLogger("argusdiff.service").info(
        "serving profile %s with policy %s, %s, %s on http://%s:%d",
        service.profile.name, cfg.policy, mode, workers, cfg.host, cfg.port,
    )  # fmt: skip
    make_server(service, host=cfg.host, port=cfg.port, log_level=args.log_level).run()
    return 0
