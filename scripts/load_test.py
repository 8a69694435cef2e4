#!/usr/bin/env python
"""HTTP load test of a live ``argusdiff serve`` with stand-in workers (TEST MODE: each worker
sleeps the profiled latency x SCALE instead of running a model).

Starts the server (embedded queues, or ``--redis auto`` = a redis-server plus ``--workers``
``argusdiff worker`` processes), drives ``POST /v1/argusdiff/generations`` closed-loop
(``--concurrency`` clients) or open-loop (``--rate`` requests/s), and prints requests/s, latency
p50/p99, status counts, lost requests (accepted but never answered) and the server's RSS at
start and end (a soak checks it stays flat).

    python scripts/load_test.py --duration 30
    python scripts/load_test.py --redis auto --duration 30
    python scripts/load_test.py --rate 200 --duration 600      # soak
    # memory soak with real-size images (1024² PNGs of ~1.8 MB), the default 1 h result TTL
    python scripts/load_test.py --image full --size 1024x1024 --rate 5 --duration 600 \
        --workers 2 --scale 0.1 --response-format mix --result-memory-mb 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _dir_mb(path: str) -> float:
    return sum(e.stat().st_size for e in os.scandir(path) if e.is_file()) / 2**20


def _redis_mb(url: str | None) -> float:
    if not url:
        return float("nan")
    import redis

    try:
        return redis.Redis.from_url(url).info("memory")["used_memory"] / 2**20
    except Exception:
        return float("nan")


def _q(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _drive(url: str, args) -> dict:
    conns = max(args.concurrency, 64)
    limits = httpx.Limits(max_connections=conns, max_keepalive_connections=conns)
    statuses: Counter[int] = Counter()
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        formats = {"b64_json": ["b64_json"], "url": ["url"], "mix": ["b64_json", "url"]}[args.response_format]

        async def one(i: int) -> None:
            fmt = formats[i % len(formats)]
            body = {"prompt": f"load test prompt {i % 97}", "seed": i % 1000, "response_format": fmt}
            t0 = time.perf_counter()
            try:
                r = await client.post("/v1/argusdiff/generations", json=body)
            except httpx.HTTPError as exc:
                errors[type(exc).__name__] += 1
                return
            statuses[r.status_code] += 1
            if r.status_code == 200:
                latencies.append(time.perf_counter() - t0)

        t_start = time.perf_counter()
        end = t_start + args.duration
        sent = 0
        if args.rate:
            tasks = set()
            interval = 1.0 / args.rate
            next_t = t_start
            while time.perf_counter() < end:
                task = asyncio.create_task(one(sent))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += 1
                next_t += interval
                delay = next_t - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            await asyncio.gather(*tasks)
        else:

            async def client_loop(c: int) -> None:
                nonlocal sent
                while time.perf_counter() < end:
                    i = sent
                    sent += 1
                    await one(i)

            await asyncio.gather(*(client_loop(c) for c in range(args.concurrency)))
        elapsed = time.perf_counter() - t_start
    return {
        "sent": sent,
        "elapsed": elapsed,
        "statuses": dict(statuses),
        "errors": dict(errors),
        "ok": statuses.get(200, 0),
        "p50": _q(latencies, 0.5),
        "p99": _q(latencies, 0.99),
        "mean": statistics.fmean(latencies) if latencies else float("nan"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="sdxl-ac-a100")
    ap.add_argument("--policy", default="argus")
    ap.add_argument("--workers", type=int, default=8, help="stand-in workers (embedded threads or processes)")
    ap.add_argument("--scale", type=float, default=0.001, help="stand-in latency scale (TEST MODE)")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of load")
    ap.add_argument("--concurrency", type=int, default=32, help="closed-loop clients")
    ap.add_argument("--rate", type=float, help="open loop: requests/s instead of closed-loop clients")
    ap.add_argument("--redis", help="redis URL, or 'auto' to start a redis-server and worker processes")
    ap.add_argument("--result-ttl", type=float, help="[service] result_ttl_s of the server (soak: keep it short)")
    ap.add_argument("--rss-every", type=float, default=60.0, help="print the server's RSS this often (s)")
    ap.add_argument(
        "--image",
        choices=["tiny", "full"],
        default="tiny",
        help="stand-in images: 8x8 (tiny) or the requested size with a real image's bytes (full)",
    )
    ap.add_argument("--size", help="the one image size served (WxH), e.g. 1024x1024")
    ap.add_argument(
        "--response-format",
        choices=["b64_json", "url", "mix"],
        default="b64_json",
        help="what the clients ask for (mix: alternate)",
    )
    ap.add_argument("--result-memory-mb", type=float, help="[service] result_memory_mb of the server")
    args = ap.parse_args()

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(
        ARGUSDIFF_SERVICE__CONTROL_PERIOD_S="5",
        ARGUSDIFF_SERVICE__HEARTBEAT_S="0.5",
        ARGUSDIFF_SOLVER__BACKEND="highs",
        ARGUSDIFF_SERVICE__NAMESPACE=f"load{os.getpid()}",
    )
    if args.result_ttl:
        env["ARGUSDIFF_SERVICE__RESULT_TTL_S"] = str(args.result_ttl)
    if args.result_memory_mb:
        env["ARGUSDIFF_SERVICE__RESULT_MEMORY_MB"] = str(args.result_memory_mb)
    if args.size:
        env["ARGUSDIFF_SERVICE__SIZES"] = f'["{args.size}"]'
    env["ARGUSDIFF_SERVICE__STAND_IN_IMAGE"] = f'"{args.image}"'
    images = tempfile.mkdtemp(prefix="load-images-")
    env["ARGUSDIFF_SERVICE__IMAGE_PATH"] = images
    procs: list[subprocess.Popen] = []
    tmp = None
    port = _free_port()
    cmd = [sys.executable, "-m", "argusdiff", "serve", "--profile", args.profile, "--policy", args.policy,
           "--port", str(port), "--stand-in-workers", str(args.scale), "--log-level", "warning"]  # fmt: skip
    redis_url = args.redis
    try:
        if redis_url:
            if redis_url == "auto":
                tmp = tempfile.mkdtemp(prefix="load-redis-")
                rport = _free_port()
                procs.append(
                    subprocess.Popen(
                        ["redis-server", "--port", str(rport), "--save", "", "--appendonly", "no", "--dir", tmp],
                        stdout=subprocess.DEVNULL,
                    )
                )
                time.sleep(0.5)
                redis_url = f"redis://127.0.0.1:{rport}/0"
            cmd += ["--redis", redis_url, "--workers", "0"]
        else:
            cmd += ["--workers", str(args.workers)]
        server = subprocess.Popen(cmd, env=env)
        procs.append(server)
        if redis_url:
            for i in range(args.workers):
                wcmd = [sys.executable, "-m", "argusdiff", "worker", "--redis", redis_url, "--id", f"load-w{i}",
                        "--stand-in", str(args.scale), "--log-level", "warning"]  # fmt: skip
                procs.append(subprocess.Popen(wcmd, env=env))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                ready = httpx.get(f"{url}/readyz", timeout=2).json()
                if ready["ready"] and ready["workers_up"] >= args.workers:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("server did not become ready")
            time.sleep(0.2)
        rss0 = _rss_mb(server.pid)
        redis0 = _redis_mb(redis_url)
        stop_rss = threading.Event()

        def sample_rss() -> None:
            t0 = time.monotonic()
            while not stop_rss.wait(args.rss_every):
                print(f"  t={time.monotonic() - t0:5.0f} s  server RSS {_rss_mb(server.pid):.0f} MiB", flush=True)

        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()
        res = asyncio.run(_drive(url, args))
        stop_rss.set()
        rss1 = _rss_mb(server.pid)
        answered = sum(res["statuses"].values())
        lost = res["sent"] - answered - sum(res["errors"].values())
        mode = f"redis ({args.workers} worker processes)" if redis_url else f"embedded ({args.workers} worker threads)"
        load = f"open loop {args.rate:g} req/s" if args.rate else f"closed loop, {args.concurrency} clients"
        print(f"load test: {mode}, profile {args.profile}, stand-in scale {args.scale:g}, {load}")
        print(f"  duration {res['elapsed']:.0f} s")
        print(f"  sent {res['sent']}, answered 200: {res['ok']} -> {res['ok'] / res['elapsed']:.0f} req/s")
        print(f"  latency (200s): p50 {1000 * res['p50']:.1f} ms, p99 {1000 * res['p99']:.1f} ms")
        print(f"  statuses {res['statuses']}, client errors {res['errors']}, unanswered {lost}")
        print(f"  server RSS: {rss0:.0f} MiB at start, {rss1:.0f} MiB at end")
        metrics = httpx.get(f"{url}/metrics").text
        held = next(ln.split()[-1] for ln in metrics.splitlines() if ln.startswith("argusdiff_result_memory_bytes"))
        print(f"  router result memory {float(held) / 2**20:.0f} MiB; image store {_dir_mb(images):.0f} MiB on disk")
        if redis_url:
            print(f"  redis used_memory: {redis0:.0f} MiB at start, {_redis_mb(redis_url):.0f} MiB at end")
        return 0
    finally:
        for p in reversed(procs):  # workers and server first, redis last
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(images, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
