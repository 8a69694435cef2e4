"""``argusdiff status``: the routers, the leader, the workers (level, heartbeat) and the plan.

Reads Redis directly (``--redis``), so it works while every router is down; or asks one router's
``GET /v1/cluster`` (``--url``), which also covers an embedded deployment.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--redis", metavar="URL", help="redis://host:port/db of the deployment")
    src.add_argument("--url", metavar="URL", help="a router's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--namespace", help="Redis key prefix (default: [service] namespace)")
    parser.add_argument("--config", metavar="FILE", help="settings TOML (for the namespace and profile)")
    parser.add_argument("--api-key", metavar="KEY", help="Bearer key for --url")
    parser.add_argument("--plan-writes", type=int, default=10, metavar="N", help="recent plan writes shown")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)


def _from_router(args: argparse.Namespace) -> dict:
    import httpx

    from argusdiff.errors import ConfigError

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        r = httpx.get(f"{args.url.rstrip('/')}/v1/cluster", headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        raise ConfigError(f"--url: cannot reach {args.url}: {exc}") from None
    if r.status_code != 200:
        raise ConfigError(f"--url: {args.url}/v1/cluster answered {r.status_code}: {r.text[:200]}")
    return r.json()


def _from_redis(args: argparse.Namespace) -> dict:
    from redis.exceptions import RedisError

    from argusdiff.config import load_settings
    from argusdiff.errors import ConfigError
    from argusdiff.service.cluster import cluster_status
    from argusdiff.service.errors import QueueUnavailable
    from argusdiff.service.transport.redis_control import RedisControlStore

    settings = load_settings(args.config)
    ns = args.namespace or settings.service.namespace
    store = RedisControlStore(args.redis, namespace=ns, socket_timeout_s=5.0)
    if args.plan_writes < 0:
        raise ConfigError(f"--plan-writes must be >= 0, got {args.plan_writes}")
    levels = None
    try:
        deployment = store.read_deployment()
        if deployment:
            from argusdiff.domain import level_catalogue
            from argusdiff.profile import load_profile

            fallback = deployment.get("fallback")
            levels = level_catalogue(load_profile(deployment["profile"]), load_profile(fallback) if fallback else None)
        return cluster_status(store, levels=levels, plan_log=args.plan_writes)
    except QueueUnavailable as exc:
        raise ConfigError(f"--redis: {exc}") from None
    except (RedisError, OSError) as exc:
        raise ConfigError(f"--redis: cannot reach {args.redis}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    import json

    from argusdiff.service.cluster import format_status

    status = _from_router(args) if args.url else _from_redis(args)
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return 0
