#!/usr/bin/env python
"""Routed requests/s with one ``argusdiff serve --redis`` router process vs two, on this machine.

Starts a redis-server, ``--workers`` stand-in ``argusdiff worker`` processes (TEST MODE, scale
``--scale``: they drain the streams, the timed path never waits for an image) and 1 or 2 router
processes, and drives ``POST /v1/argusdiff/generations`` with ``"wait": false`` (202: validated,
routed, admitted and enqueued) closed-loop from ``--clients`` client processes with ``--concurrency``
requests in flight each, spread round-robin over the routers. Trials alternate 1, 2, 1, 2, ...;
the table gives the median requests/s of each, their ratio, and where the CPU went (share of the
machine's cores used by the routers, the clients, redis, the workers, and any other process on the
machine during the trial).

A "client ceiling" row drives ``GET /healthz`` of one router the same way: what the clients and
HTTP stack manage with no routing work at all.

    python scripts/bench_routers.py                  # 3 trials each, 10 s
    python scripts/bench_routers.py --trials 5 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            parts = fh.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (all processes, all cores) since boot."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _client(urls: list[str], path: str, duration: float, concurrency: int, offset: int, out) -> None:
    async def main() -> int:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        done = 0
        async with httpx.AsyncClient(limits=limits, timeout=30) as client:
            end = time.monotonic() + duration

            async def loop(k: int) -> None:
                nonlocal done
                i = k
                while time.monotonic() < end:
                    url = urls[(i + offset) % len(urls)]
                    i += 1
                    try:
                        if path == "/healthz":
                            r = await client.get(url + path)
                            ok = r.status_code == 200
                        else:
                            body = {"prompt": f"bench prompt {i % 101}", "wait": False}
                            r = await client.post(url + path, json=body)
                            ok = r.status_code == 202
                    except httpx.HTTPError:
                        ok = False
                    done += ok

            await asyncio.gather(*(loop(k) for k in range(concurrency)))
        return done

    out.put(asyncio.run(main()))


def _drive(urls: list[str], path: str, args, pids: dict[str, list[int]]) -> tuple[float, dict[str, float]]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_client, args=(urls, path, args.duration, args.concurrency, i, q))
             for i in range(args.clients)]  # fmt: skip
    for p in procs:
        p.start()
    time.sleep(0.5)  # spawn + imports, outside the measured CPU window
    before = {k: sum(_cpu_s(p) for p in v) for k, v in pids.items()}
    clients_before = sum(_cpu_s(p.pid) for p in procs)
    busy_before = _machine_busy_s()
    total = sum(q.get(timeout=args.duration + 120) for _ in procs)
    cpu = {k: sum(_cpu_s(p) for p in v) - before[k] for k, v in pids.items()}
    cpu["clients"] = sum(_cpu_s(p.pid) for p in procs) - clients_before
    cpu["other processes"] = max(0.0, _machine_busy_s() - busy_before - sum(cpu.values()))
    for p in procs:
        p.join(10)
    cores = os.cpu_count() or 1
    return total / args.duration, {k: v / (args.duration * cores) for k, v in cpu.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=2, help="client processes")
    ap.add_argument("--concurrency", type=int, default=32, help="requests in flight per client process")
    ap.add_argument("--workers", type=int, default=2, help="stand-in worker processes")
    ap.add_argument("--scale", type=float, default=0.0001, help="stand-in latency scale")
    ap.add_argument("--profile", default="sm-a100")
    ap.add_argument("--policy", default="argus")
    args = ap.parse_args()

    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed")
    tmp = tempfile.mkdtemp(prefix="argusdiff-bench-routers-")
    port = _free_port()
    redis_url = f"redis://127.0.0.1:{port}/0"
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "ARGUSDIFF_SERVICE__HEARTBEAT_S": "0.5", "ARGUSDIFF_SOLVER__BACKEND": "highs",
           "ARGUSDIFF_SERVICE__CONTROL_PERIOD_S": "2"}  # fmt: skip
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    try:
        redis_proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no", "--dir", tmp], **quiet)  # fmt: skip
        procs.append(redis_proc)
        time.sleep(0.3)
        worker_pids = []
        for i in range(args.workers):
            p = subprocess.Popen([sys.executable, "-m", "argusdiff", "worker", "--redis", redis_url, "--id", f"bw{i}",
                                  "--stand-in", str(args.scale), "--log-level", "error"], env=env, **quiet)  # fmt: skip
            procs.append(p)
            worker_pids.append(p.pid)

        def routers(n: int) -> list[tuple[subprocess.Popen, str]]:
            out = []
            for _ in range(n):
                rport = _free_port()
                p = subprocess.Popen([sys.executable, "-m", "argusdiff", "serve", "--redis", redis_url, "--port",
                                      str(rport), "--workers", "0", "--profile", args.profile, "--policy", args.policy,
                                      "--log-level", "error"], env=env, **quiet)  # fmt: skip
                out.append((p, f"http://127.0.0.1:{rport}"))
            deadline = time.monotonic() + 60
            for _p, url in out:
                while True:
                    try:
                        if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise SystemExit("a router did not become ready")
                    time.sleep(0.1)
            return out

        def stop(rs) -> None:
            for p, _ in rs:
                p.terminate()
            for p, _ in rs:
                p.wait(timeout=30)

        results: dict[int, list[tuple[float, dict]]] = {1: [], 2: []}
        ceiling = []
        for t in range(args.trials):
            for n in (1, 2):
                rs = routers(n)
                pids = {"routers": [p.pid for p, _ in rs], "redis": [redis_proc.pid], "workers": worker_pids}
                rps, cpu = _drive([u for _, u in rs], "/v1/argusdiff/generations", args, pids)
                results[n].append((rps, cpu))
                print(f"trial {t + 1}: {n} router(s): {rps:,.0f} req/s  cpu " +
                      ", ".join(f"{k} {v:.0%}" for k, v in cpu.items()), flush=True)  # fmt: skip
                if n == 1:
                    hz, _ = _drive([u for _, u in rs], "/healthz", args, pids)
                    ceiling.append(hz)
                stop(rs)
        date = time.strftime("%Y-%m-%d")
        print(
            f"\n{date}, {os.cpu_count()}-core machine; {args.clients} client processes x {args.concurrency} in "
            f"flight, {args.workers} stand-in workers, {args.duration:g} s per trial, {args.trials} trials\n"
        )
        print("| routers | routed req/s (median) | share of the machine's CPU: routers / clients / redis / workers / "
              "other processes |")  # fmt: skip
        print("|---|---|---|")
        med = {}
        for n in (1, 2):
            rps = [x for x, _ in results[n]]
            med[n] = statistics.median(rps)
            cpu = {k: statistics.median(c[k] for _, c in results[n]) for k in results[n][0][1]}
            shares = " / ".join(f"{cpu[k]:.0%}" for k in ("routers", "clients", "redis", "workers", "other processes"))
            print(f"| {n} | {med[n]:,.0f} (trials: {', '.join(f'{x:,.0f}' for x in rps)}) | {shares} |")
        print(f"\nratio 2 routers / 1 router: {med[2] / med[1]:.2f}")
        print(f"client ceiling (GET /healthz on 1 router, no routing): {statistics.median(ceiling):,.0f} req/s "
              f"(trials: {', '.join(f'{x:,.0f}' for x in ceiling)})")  # fmt: skip
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
