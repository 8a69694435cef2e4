"""``argusdiff worker --redis URL --gpu N``: one worker taking work from Redis Streams.

The worker follows the plan the router's control loop publishes in Redis (which level to serve),
heartbeats, and acks each item after its result is stored. Without ``--profile`` it serves the
profile the router announces. Its images go into the image store the router announces (with
``[service] image_store = "auto"``, the default; else the one its own settings name): Redis
carries only their keys (:mod:`argusdiff.service.images`).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--redis", metavar="URL", required=True, help="redis://host:port/db of the deployment")
    parser.add_argument("--gpu", type=int, metavar="N", help="CUDA device index (default: [workers] device)")
    parser.add_argument("--id", dest="worker_id", help="worker id (default: host-gpuN-pid)")
    parser.add_argument("--config", metavar="FILE", help="settings TOML (ARGUSDIFF_* variables override it)")
    parser.add_argument("--profile", help="profile name or TOML path (default: the one the router announces)")
    parser.add_argument("--namespace", help="Redis key prefix (default: [service] namespace)")
    parser.add_argument(
        "--stand-in",
        type=float,
        metavar="SCALE",
        help="TEST MODE: sleep the profiled latency x SCALE instead of running models",
    )
    parser.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for the router to announce")
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


def _settings(args: argparse.Namespace) -> Any:
    from argusdiff.config import Settings, load_settings

    settings = load_settings(args.config)
    data = settings.model_dump()
    data["service"]["redis_url"] = args.redis
    if args.namespace:
        data["service"]["namespace"] = args.namespace
    if args.gpu is not None:
        if args.gpu < 0:
            from argusdiff.errors import ConfigError

            raise ConfigError(f"--gpu must be >= 0, got {args.gpu}")
        data["workers"]["device"] = f"cuda:{args.gpu}"
    return Settings.model_validate(data)


def check_redis(url: str, timeout_s: float = 3.0) -> None:
    """Fail at once (exit 2, naming ``--redis``) when ``url`` is malformed, Redis does not answer or
    its topology is unsupported (a cluster node, a replica), instead of waiting ``--wait-s`` for a
    deployment that cannot arrive; log the topology's risks (replicas, no AOF, eviction)."""
    import logging

    import redis

    from argusdiff.errors import ConfigError
    from argusdiff.service.transport.redis_topology import inspect_topology

    shown = _without_password(url)
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    except ValueError as exc:
        raise ConfigError(f"--redis: {shown!r} is not a Redis URL ({exc})") from None
    try:
        client.ping()
        errors, warnings = inspect_topology(client, shown)
    except (redis.RedisError, OSError) as exc:
        raise ConfigError(f"--redis: Redis at {shown} is unreachable: {exc}") from None
    finally:
        client.close()
    if errors:
        raise ConfigError("--redis: " + "; ".join(errors))
    for warning in warnings:
        logging.getLogger("argusdiff.redis").warning("%s", warning)


def _without_password(url: str) -> str:
    """``url`` with its password (if any) shown as ``***``: error messages end up in logs."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if not parts.password:
        return url
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")))


def start_tracing(settings: Any, service_name: str) -> None:
    """OpenTelemetry spans to ``[service] otlp_endpoint`` when it is set (exit 2 without the extra)."""
    endpoint = settings.service.otlp_endpoint
    if not endpoint:
        return
    from argusdiff import tracing
    from argusdiff.errors import ConfigError

    try:
        tracing.configure(endpoint, service_name=service_name)
    except ImportError as exc:
        raise ConfigError(
            f"[service] otlp_endpoint is set but OpenTelemetry is not installed ({exc}): "
            "pip install 'argusdiff[tracing]'"
        ) from exc


def run(args: argparse.Namespace) -> int:
    import logging
    import os
    import random
    import signal
    import socket
    import time

    from argusdiff import tracing
    from argusdiff.errors import ConfigError
    from argusdiff.profile import load_profile
    from argusdiff.service.caches import build_cache
    from argusdiff.service.errors import QueueUnavailable
    from argusdiff.service.images import worker_image_store
    from argusdiff.service.transport.redis_control import RedisControlStore
    from argusdiff.service.transport.redis_streams import RedisWorkQueue
    from argusdiff.service.worker import ServiceWorker
    from workers.executor import ExecutorFactory

    tracing.configure_logging(args.log_level, args.log_format)
    log = logging.getLogger("argusdiff.worker")
    settings = _settings(args)
    start_tracing(settings, "argusdiff-worker")
    cfg = settings.service
    gpu = "cpu" if args.gpu is None else f"gpu{args.gpu}"
    worker_id = args.worker_id or f"{socket.gethostname()}-{gpu}-{os.getpid()}"
    check_redis(args.redis)
    queue = RedisWorkQueue(
        args.redis,
        namespace=cfg.namespace,
        consumer=worker_id,
        result_ttl_s=cfg.result_ttl_s,
        claim_idle_s=max(60.0, 10 * cfg.worker_timeout_s),
    )
    store = RedisControlStore.sharing(queue)
    profile_ref, fallback_ref = args.profile, None
    deployment = None
    if profile_ref is not None:
        try:
            deployment = store.read_deployment()
        except QueueUnavailable:
            deployment = None
    else:
        deadline = time.monotonic() + args.wait_s
        while True:
            try:
                deployment = store.read_deployment()
            except QueueUnavailable:
                deployment = None
            if deployment:
                profile_ref, fallback_ref = deployment["profile"], deployment.get("fallback")
                break
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"no router announced a deployment in redis at {_without_password(args.redis)}: pass --profile"
                )
            time.sleep(0.25 + random.random() / 2)  # jittered: many workers start together
    try:
        images = worker_image_store(settings, deployment)
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"the image store the router announced cannot be used: {exc}") from None
    queue.images = images
    log.info("worker %s: images go to %s", worker_id, images.description)
    profile = load_profile(profile_ref)
    fallback = load_profile(fallback_ref) if fallback_ref else None
    cache = None if args.stand_in else build_cache(settings, profile)
    factory = ExecutorFactory.from_settings(
        profile, settings, fallback=fallback, cache=cache, stand_in_scale=args.stand_in
    )
    worker = ServiceWorker(
        worker_id,
        queue,
        store,
        factory,
        heartbeat_s=cfg.heartbeat_s,
        ttl_s=cfg.worker_timeout_s,
        poll_s=settings.workers.poll_s,
        level_ids=tuple(factory.levels),
    )

    def _stop(signum, frame):  # finish the batch in hand, then leave
        log.info("worker %s: stopping (signal %d)", worker_id, signum)
        worker.stop(timeout=0)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    mode = f"stand-in x{args.stand_in} (TEST MODE)" if args.stand_in else settings.workers.device
    log.info("worker %s: profile %s, %s, redis %s", worker_id, profile.name, mode, _without_password(args.redis))
    worker.run()
    return 0
