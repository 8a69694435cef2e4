#!/usr/bin/env python
"""Router overhead per request: validate → route (policy + PASM + worker selector) → admission →
enqueue, in process, embedded queues and Redis Streams.

Prints, per mode: p50/p99 of one ``Router.submit`` (sequential), and the requests/s routed with
``--concurrency`` submits in flight. Workers are stand-ins (TEST MODE, profiled latency x SCALE)
so queues drain; the timed path never waits for an image.

    python scripts/bench_service.py                      # embedded only
    python scripts/bench_service.py --redis auto         # also Redis (starts redis-server on a free port)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _bench(settings, n: int, concurrency: int) -> dict:
    from argusdiff.service.app import Service
    from argusdiff.service.schemas import parse_native
    from argusdiff.service.worker import wait_until

    service = Service(settings)
    await service.start()
    try:
        ok = await asyncio.to_thread(
            wait_until, lambda: service.ready() and len(service.control.alive) == settings.service.workers, 30
        )
        if not ok:
            raise SystemExit("service did not become ready")
        router = service.router
        body = {"prompt": "a photo of a cat wearing a hat", "wait": False}
        spec = parse_native(body, router.limits)
        for _ in range(200):  # warm up
            await router.submit(spec)
        lat = []
        t_seq = time.perf_counter()
        for _ in range(n):
            t0 = time.perf_counter()
            parse_native(body, router.limits)
            await router.submit(spec)
            lat.append(time.perf_counter() - t0)
        t_seq = time.perf_counter() - t_seq

        async def one() -> None:
            await router.submit(parse_native(body, router.limits))

        t0 = time.perf_counter()
        done = 0
        while done < n:
            k = min(concurrency, n - done)
            await asyncio.gather(*(one() for _ in range(k)))
            done += k
        t_conc = time.perf_counter() - t0
        accepted = router.accepted

        def drained() -> bool:
            return router.completed >= accepted

        await asyncio.to_thread(wait_until, drained, 120, 0.05)
        return {
            "p50_ms": 1000 * statistics.median(lat),
            "p99_ms": 1000 * _quantile(lat, 0.99),
            "seq_rps": n / t_seq,
            "conc_rps": n / t_conc,
            "accepted": accepted,
            "completed": router.completed,
        }
    finally:
        await service.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="sdxl-ac-a100")
    ap.add_argument("--policy", default="argus")
    ap.add_argument("-n", type=int, default=5000, help="requests per measurement")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--workers", type=int, default=8, help="stand-in workers")
    ap.add_argument("--scale", type=float, default=0.0001, help="stand-in latency scale (TEST MODE)")
    ap.add_argument("--redis", help="redis URL, or 'auto' to start a redis-server")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from argusdiff.config import Settings

    def settings(redis_url: str | None) -> Settings:
        return Settings.model_validate(
            {
                "profile": args.profile,
                "solver": {"backend": "highs"},
                "service": {
                    "policy": args.policy,
                    "workers": args.workers,
                    "stand_in_scale": args.scale,
                    "redis_url": redis_url,
                    "control_period_s": 5.0,
                    "heartbeat_s": 0.5,
                    "worker_timeout_s": 5.0,
                    "namespace": f"bench{os.getpid()}",
                },
            }
        )

    rows = [("embedded", asyncio.run(_bench(settings(None), args.n, args.concurrency)))]
    proc = None
    tmp = None
    if args.redis:
        url = args.redis
        if url == "auto":
            binary = shutil.which("redis-server")
            if binary is None:
                raise SystemExit("redis-server is not installed")
            port = _free_port()
            tmp = tempfile.mkdtemp(prefix="bench-redis-")
            proc = subprocess.Popen(
                [binary, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", tmp],
                stdout=subprocess.DEVNULL,
            )
            time.sleep(0.5)
            url = f"redis://127.0.0.1:{port}/0"
        try:
            rows.append(("redis", asyncio.run(_bench(settings(url), args.n, args.concurrency))))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait()
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
    print(f"router overhead: profile {args.profile}, policy {args.policy}, {args.workers} stand-in workers, "
          f"n={args.n}, concurrency {args.concurrency}")  # fmt: skip
    print(f"{'mode':<10}{'p50 ms':>9}{'p99 ms':>9}{'seq req/s':>11}{'conc req/s':>12}{'accepted':>10}{'completed':>11}")
    for name, r in rows:
        print(
            f"{name:<10}{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}{r['seq_rps']:>11.0f}{r['conc_rps']:>12.0f}"
            f"{r['accepted']:>10}{r['completed']:>11}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
