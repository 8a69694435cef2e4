#!/usr/bin/env python
"""The control plane past this machine: 10,000 workers and 50 routers against one real
redis-server, with the service's own code for every Redis operation.

Measured (prints one table):

* **plan** — ``policy.plan()`` (argus, sm-a100, HiGHS) for the cluster, the plan's JSON size in
  Redis and the policy state's;
* **publish** — one fenced plan write (:class:`FencedPlanStore`: the Lua script that checks the
  token, the lease and the version, then writes plan, version, state and the log entry);
* **follow** — what each follower router does when the version changes (read the version, read and
  parse the plan), what a worker reads (its slice: the plan view and its own entry), and the bytes
  Redis sends per new plan version;
* **stats per period** — every router's heartbeat flush (HINCRBY of its counts + its heartbeat),
  then the leader's side: flush-and-drain, the routers' heartbeats, the workers' heartbeats
  (10,000 HGETALL), queue depths;
* **worker heartbeats** — 10,000 workers' HSET + PEXPIRE + SADD + ZADD, i.e. one heartbeat
  interval's load on Redis, and the leader's membership check (one sorted set) every heartbeat;
* **failover** — ``--routers`` contender threads, each with its own Redis client, running the
  leader loop's lease and publish steps (:class:`LeaderLease`, :class:`FencedPlanStore`) at a
  scaled period; the leader stops without releasing the lease (a crash) and the time to the
  first plan written under the next token is measured, ``--trials`` times.

The routers and workers here are the service's Redis calls without their HTTP servers and models;
Redis runs on the same 2 cores as the client, so the Redis-side times include this process's
Python overhead and are upper bounds for a dedicated Redis host.

    python scripts/sim_control_plane.py                   # 10,000 workers, 50 routers
    python scripts/sim_control_plane.py --workers 1000 --routers 10 --trials 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _redis(workdir: str) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir,
         "--protected-mode", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    import redis

    for _ in range(500):
        try:
            if redis.Redis.from_url(url).ping():
                return proc, url
        except redis.ConnectionError:
            time.sleep(0.01)
    raise SystemExit("redis-server did not start")


def _ms(values: list[float]) -> str:
    med = statistics.median(values) * 1000
    p95 = sorted(values)[min(len(values) - 1, int(0.95 * len(values)))] * 1000
    return f"{med:.2f} ms (p95 {p95:.2f})"


def _timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=10_000)
    ap.add_argument("--routers", type=int, default=50)
    ap.add_argument("--trials", type=int, default=5, help="failover trials")
    ap.add_argument("--period", type=float, default=1.0, help="control period of the failover trials (s)")
    ap.add_argument("--repeat", type=int, default=20, help="repetitions of each timed Redis step")
    args = ap.parse_args()

    import numpy as np
    import redis

    from argusdiff.domain import ClusterStats
    from argusdiff.policies import make_policy
    from argusdiff.policies.state import export_state
    from argusdiff.profile import load_profile
    from argusdiff.service.cluster import ClusterBus
    from argusdiff.service.leader import FencedPlanStore, LeaderLease, StaleLeader
    from argusdiff.service.plans import plan_from_dict, plan_to_dict
    from argusdiff.service.transport.redis_control import RedisControlStore
    from argusdiff.service.transport.redis_streams import RedisWorkQueue

    rows: list[tuple[str, str]] = []
    tmp = tempfile.mkdtemp(prefix="argusdiff-sim-")
    proc, url = _redis(tmp)
    try:
        r = redis.Redis.from_url(url)
        profile = load_profile("sm-a100")
        W = args.workers
        workers = tuple(f"gpu-node-{i // 8:04d}-{i % 8}" for i in range(W))
        policy = make_policy(
            "argus", profile, rng=np.random.default_rng(0), config={"period_s": 10.0, "backend": "highs"}
        )
        ids = profile.ids

        # -- plan ---------------------------------------------------------------------------
        current: dict = {}
        plan_times = []
        for t in range(6):
            qpm = 30_000 + 60_000 * (t % 3)  # 3-9 QPM per worker: the solver has to mix levels
            stats = ClusterStats(now_s=10.0 * t, period_s=10.0, arrivals=int(qpm / 6), workers=workers,
                                 current=current, affinity={ids[i]: 100 + 50 * i for i in range(len(ids))})  # fmt: skip
            t0 = time.perf_counter()
            plan = policy.plan(stats)
            plan_times.append(time.perf_counter() - t0)
            current = dict(plan.assignment)
        plan_json = json.dumps(plan_to_dict(plan))
        state_json = json.dumps(export_state(policy))
        rows.append((f"policy.plan() for {W:,} workers (argus, sm-a100, HiGHS)", _ms(plan_times[1:])))
        rows.append(("plan JSON in Redis", f"{len(plan_json) / 1024:.0f} KiB"))
        rows.append(("policy state JSON in Redis", f"{len(state_json) / 1024:.1f} KiB"))

        # -- publish ------------------------------------------------------------------------
        queue = RedisWorkQueue(url, consumer="sim")
        lease = LeaderLease(redis.Redis.from_url(url), "argusdiff", "leader", lease_s=60)
        lease.step()
        control = RedisControlStore.sharing(queue)
        store = FencedPlanStore(control, lease, lambda: export_state(policy))
        import dataclasses

        version = [plan.version]

        def publish():
            version[0] += 1
            store.publish_plan(dataclasses.replace(plan, version=version[0]))

        rows.append(
            (
                "fenced plan publish (Lua: token, lease, version; plan + state + worker slices + log)",
                _ms(_timed(publish, args.repeat)),
            )
        )

        # -- follow -------------------------------------------------------------------------
        fr = redis.Redis.from_url(url)

        def follower_read():
            fr.get("argusdiff:plan:version")
            plan_from_dict(json.loads(fr.get("argusdiff:plan")))

        follow = _timed(follower_read, args.repeat)
        rows.append(("one follower: version + plan read + parse", _ms(follow)))
        rows.append(
            (
                f"{args.routers} followers per new plan (sequential sum)",
                f"{statistics.median(follow) * args.routers * 1000:.0f} ms",
            )
        )
        unchanged = _timed(lambda: fr.get("argusdiff:plan:version"), args.repeat)
        rows.append(("one router or worker poll, plan unchanged (GET version)", _ms(unchanged)))
        wq = RedisControlStore(url)
        me = workers[W // 2]

        def worker_read():
            wq._view_cache = None  # as after a new version: read the slice
            wq.read_plan_data_for(me)

        rows.append(
            (
                "one worker per new plan: its slice (version + plan view + own entry)",
                _ms(_timed(worker_read, args.repeat)),
            )
        )
        slice_bytes = len(r.get("argusdiff:plan:view") or b"") + len(r.hget("argusdiff:plan:assign", me) or b"")
        rows.append(("a worker's slice of the plan", f"{slice_bytes / 1024:.1f} KiB"))
        fanout = args.routers * len(plan_json) + W * slice_bytes
        rows.append(
            (
                f"bytes out of Redis per new plan: {args.routers} routers (whole plan) + {W:,} workers (slice)",
                f"{fanout / 2**20:,.1f} MiB",
            )
        )
        rows.append(
            ("  ... if every worker read the whole plan", f"{(args.routers + W) * len(plan_json) / 2**20:,.0f} MiB")
        )

        # -- worker heartbeats -------------------------------------------------------------
        info = {"level": ids[0], "loading": None, "done": 123, "failed": 0, "plan_version": version[0], "pid": 4242,
                "host": "gpu-node", "started_s": time.time(), "last_error": None, "threshold": None}  # fmt: skip

        def beat_all():
            pipe = r.pipeline(transaction=False)
            now = time.time()
            for w in workers:
                mapping = {k: json.dumps(v) for k, v in {**info, "ts": now}.items()}
                key = f"argusdiff:hb:{w}"
                pipe.hset(key, mapping=mapping)
                pipe.pexpire(key, 5000)
                pipe.sadd("argusdiff:workers", w)
                pipe.zadd("argusdiff:workers:beat", {w: now + 5.0})
            pipe.execute()

        beats = _timed(beat_all, 3)
        rows.append((f"{W:,} worker heartbeats (HSET+PEXPIRE+SADD+ZADD, pipelined): one interval", _ms(beats)))
        rows.append(
            (
                f"leader: membership check, every heartbeat ({W:,} workers, one sorted set)",
                _ms(_timed(control.membership, args.repeat)),
            )
        )

        # -- stats per period ----------------------------------------------------------------
        buses = [ClusterBus(redis.Redis.from_url(url), "argusdiff", f"router-{i:02d}") for i in range(args.routers)]
        local = (1200, Counter({lv: 200 for lv in ids}), Counter({lv: 200 for lv in ids}))
        summary = {"role": "follower", "plan_version": version[0], "level_load": {lv: 12 for lv in ids},
                   "inflight": 72, "accepted": 10_000, "completed": 9_928,
                   "cache": {"samples": 50, "errors": 0, "median_latency_s": 0.01, "epoch": 0}}  # fmt: skip

        def routers_flush():
            for bus in buses:
                bus.flush(local)
                bus.beat_router(summary, 3.0)

        flush = _timed(routers_flush, max(3, args.repeat // 4))
        rows.append((f"{args.routers} routers: counts + heartbeat (each router's share: 1/{args.routers})", _ms(flush)))
        leader_bus = buses[0]

        def leader_side():
            leader_bus.flush_and_drain(local)
            leader_bus.routers()
            control.heartbeats()
            for lv in ids:
                queue.qsize(lv)
                queue.pending(lv)

        def drain_only():
            routers_flush()
            t0 = time.perf_counter()
            leader_bus.flush_and_drain(local)
            return time.perf_counter() - t0

        drains = [drain_only() for _ in range(3)]
        rows.append((f"leader: flush-and-drain the {args.routers} routers' counts (one script)", _ms(drains)))
        rows.append(
            (f"leader: routers' heartbeats ({args.routers}, MGET)", _ms(_timed(leader_bus.routers, args.repeat)))
        )
        rows.append(
            (
                f"leader: workers' heartbeats, once per period ({W:,} HGETALL + parse)",
                _ms(_timed(control.heartbeats, 3)),
            )
        )
        rows.append(
            ("leader: whole statistics step per period (drain, routers, workers, queues)", _ms(_timed(leader_side, 3)))
        )

        # -- failover ----------------------------------------------------------------------
        results = _failover(url, args.routers, args.trials, args.period, plan, LeaderLease, FencedPlanStore,
                            RedisControlStore, StaleLeader)  # fmt: skip
        lease_s = 0.75 * args.period
        poll = min(1.0, lease_s / 4)
        rows.append((
            f"failover, {args.routers} routers, period {args.period:g} s (lease {lease_s:.2f} s, poll {poll:.2f} s): "
            f"crash -> first plan of the next token, {len(results)} trials",
            f"median {statistics.median(results):.2f} s, max {max(results):.2f} s",
        ))  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)

    width = max(len(a) for a, _ in rows)
    print(f"control plane: {args.workers:,} workers, {args.routers} routers, one redis-server "
          f"({os.cpu_count()} cores shared with this process)")  # fmt: skip
    print(f"| {'step':<{width}} | measured |")
    print(f"|{'-' * (width + 2)}|---|")
    for a, b in rows:
        print(f"| {a:<{width}} | {b} |")


def _failover(url, n, trials, period, plan, LeaderLease, FencedPlanStore, RedisControlStore, StaleLeader):
    """Contenders running the leader loop's lease/publish steps; the leader crashes each trial."""
    kinds = (LeaderLease, FencedPlanStore, RedisControlStore, StaleLeader)
    out = []
    for trial in range(trials):
        took = _trial(url, f"sim{trial}", n, period, plan, *kinds)
        if took is not None:
            out.append(took)
    return out


def _trial(url, ns, n, period, plan, LeaderLease, FencedPlanStore, RedisControlStore, StaleLeader):
    import dataclasses

    import redis

    lease_s = 0.75 * period
    poll = min(1.0, lease_s / 4)
    stop = threading.Event()
    crashed: dict[str, object] = {}
    first_new: dict[str, float] = {}
    lock = threading.Lock()

    def contender(i: int) -> None:
        lease = LeaderLease(redis.Redis.from_url(url), ns, f"router-{i:02d}", lease_s)
        store = FencedPlanStore(RedisControlStore(url, namespace=ns), lease)
        leading = False
        next_tick = 0.0
        while not stop.is_set():
            if crashed.get("who") == lease.router_id:
                return  # crashed: no release, no more renewals
            token = lease.step()
            now = time.monotonic()
            if token and not leading:
                leading, next_tick = True, now  # take over: plan at once
            elif not token:
                leading = False
            if leading and now >= next_tick:
                try:
                    v = store.published_version() + 1
                    store.publish_plan(dataclasses.replace(plan, version=v, created_s=time.time()))
                    with lock:
                        if "t" in crashed and "t" not in first_new and lease.router_id != crashed["who"]:
                            first_new["t"] = time.time()
                except StaleLeader:
                    leading = False
                next_tick = now + period
            stop.wait(poll if not leading else max(0.0, min(poll, next_tick - time.monotonic())))

    threads = [threading.Thread(target=contender, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    r = redis.Redis.from_url(url)
    deadline = time.monotonic() + 30
    while r.get(f"{ns}:plan:version") is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(1.5 * period)  # a few plans under the first leader
    holder = r.get(f"{ns}:leader").decode().rpartition("|")[0]
    with lock:
        crashed["who"] = holder
        crashed["t"] = time.time()
    while "t" not in first_new and time.monotonic() < deadline + 30:
        time.sleep(0.005)
    stop.set()
    for t in threads:
        t.join(5)
    return first_new["t"] - float(crashed["t"]) if "t" in first_new else None


if __name__ == "__main__":
    main()
