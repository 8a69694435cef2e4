#!/usr/bin/env python
"""Router overhead per request: validate → route (policy + PASM + worker selector) → admission →
enqueue, in process, embedded queues and Redis Streams.

Prints, per mode: p50/p99 of one ``Router.submit`` (sequential), and the requests/s routed with
``--concurrency`` submits in flight. Workers are stand-ins (TEST MODE, profiled latency x SCALE)
so queues drain; the timed path never waits for an image.

    python scripts/bench_service.py                      # embedded only
    python scripts/bench_service.py --redis auto         # also Redis (starts redis-server on a free port)
    python scripts/bench_service.py --fidelity           # simulator vs live service on one trace

``--fidelity`` replays one trace through the simulator and through the live service (router,
control loop, embedded queues) whose stand-in workers sleep the same profiled latencies, with
time compressed by ``--time-scale`` (arrivals, latencies, load times, SLO, control period, demand
bins and window all scaled; default 0.5), and compares the SLO violation ratio and the level mix.
Both use the same policy (the live one fresh, with the simulator's options time-scaled), the same
admission and the same oracle classifier predictions (SYNTHETIC quality table, as ``argusdiff
replay`` without a table), and both start warm: the first plan sees the first period's arrivals,
the live cluster is idle before it (as the simulated one) and then at its levels with the plan's
preloaded models loaded, and the trace starts a control period. ``--plans`` prints both sides'
plans.
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


class _OracleAdapter:
    """The simulator's per-prompt predictions behind the live router's classifier interface."""

    uses = "oracle stand-in (same predictions as the simulator)"

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.description = self.uses

    def submit(self, prompt: str):
        from concurrent.futures import Future

        fut: Future = Future()
        fut.set_result(self.table[prompt])
        return fut


async def _live_replay(service, arrivals, prompts, warm, policy, plans=None) -> list[tuple[float, str | None, bool]]:
    import dataclasses

    from argusdiff.service.errors import ApiError
    from argusdiff.service.schemas import GenerationSpec
    from argusdiff.service.worker import wait_until

    await service.start()
    try:
        await asyncio.to_thread(
            wait_until, lambda: service.ready() and len(service.control.alive) == len(service.workers), 30
        )
        router, control = service.router, service.control
        control.restart_period()  # no full tick of the loop's own until the trace starts
        # the simulator's cluster before the trace: workers at no level, and a policy that has seen
        # no plan (the service's start-up plans were made for 0 QPM)
        ids = [w.worker_id for w in service.workers]
        control._version += 1  # the next plan's version follows this one's
        service.store.publish_plan(
            dataclasses.replace(control.plan, assignment={w: None for w in ids}, version=control._version)
        )

        def idle() -> bool:
            alive, _ = service.store.heartbeats()
            return len(alive) == len(ids) and all(info.get("level") is None for info in alive.values())

        if not await asyncio.to_thread(wait_until, idle, 30):
            raise SystemExit("the live workers did not go idle before the trace")
        service.policy = router.policy = control.policy = policy
        wall0 = time.time()  # the warm plan at 0; re-set when the trace starts
        if plans is not None:  # record each live plan and what it saw, at its trace time (--plans)
            plan_fn = policy.plan

            def recording(stats):
                p = plan_fn(stats)
                plans.append(
                    {
                        "t": stats.now_s - wall0,
                        "qpm": p.predicted_qpm,
                        "assignment": dict(p.assignment),
                        "thresholds": dict(p.thresholds),
                        "current": dict(stats.current),
                        "arrivals": stats.arrivals,
                        "period": stats.period_s,
                        "reason": stats.reason,
                    }
                )
                return p

            policy.plan = recording
        # warm start, as the simulator: the cluster was running before the trace, so the first plan
        # sees the first period's arrivals (at their times) and optimal levels
        now = time.time()
        router.arrivals, router.affinity = warm[0], warm[1]
        router.arrival_times.extend(now - control.period_s + t for t in warm[2])
        control.last_tick = now - control.period_s  # one full period
        plan = await control.tick()

        def adopted() -> bool:
            return all(w.worker.level == plan.assignment.get(w.worker_id) for w in service.workers)

        if not await asyncio.to_thread(wait_until, adopted, 30):
            raise SystemExit("the live workers did not adopt the first plan")
        # ... with the plan's preloaded models resident too (the simulator's warm start loads them),
        # each worker having served each of them once before the trace
        for w in service.workers:
            pre = [lv for lv in plan.preload.get(w.worker_id, ()) if lv != plan.assignment.get(w.worker_id)]
            for lv in [*pre, plan.assignment.get(w.worker_id)] if pre else ():
                w.worker.set_level(lv)
                if not await asyncio.to_thread(wait_until, lambda w=w, lv=lv: w.worker.level == lv, 30):
                    raise SystemExit(f"worker {w.worker_id} did not load {lv} before the trace")
        out: list[tuple[float, str | None, bool]] = [(0.0, None, False)] * len(arrivals)

        async def one(i: int) -> None:
            spec = GenerationSpec(prompt=prompts[i], response_format="b64_json")
            t0 = time.time()
            try:
                sub = await router.submit(spec)
            except ApiError:
                out[i] = (float("inf"), None, False)
                return
            res = (await router.wait(sub, 600))[0]
            lat = time.time() - t0
            if not res.ok:  # dropped by the policy after a cascade deferral
                out[i] = (-1.0, None, False)
                return
            out[i] = (lat, res.level, lat <= sub.deadline_s - sub.arrival_s)

        start = time.monotonic()
        control.restart_period()  # the trace starts a control period, as in the simulator
        wall0 = time.time()
        tasks = []
        for i, t in enumerate(arrivals):
            delay = start + t - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        return out
    finally:
        await service.stop()


def fidelity(args) -> int:
    import dataclasses

    import numpy as np

    from argusdiff.config import Settings
    from argusdiff.policies import make_policy
    from argusdiff.profile import load_profile
    from argusdiff.service.app import Service
    from argusdiff.simulator.engine import SimConfig, simulate
    from argusdiff.simulator.metrics import summarize
    from argusdiff.simulator.workload import quick_workload

    profile = load_profile(args.fid_profile)
    wl = quick_workload(args.trace, [profile], n_prompts=300, seed=0)
    period = args.period
    sim_options = {"period_s": period, "backend": "highs"}
    sim_policy = make_policy(args.policy, profile, rng=np.random.default_rng(0), config=sim_options)
    # the same admission after the policy in both (the service's default; the live run's times are
    # all scaled by --time-scale, so its decisions match the simulator's)
    admission = Settings(admission={"enabled": not args.no_admission}).admission.mechanism()
    # stand-in workers never miss the cache and look nothing up: the simulator starts with every
    # prompt cached, and its lookups cost nothing
    sim_cfg = SimConfig(
        gpus=args.gpus, period_s=period, seed=0, cache_prefill=args.cache_prefill, cache_latency_s=0.0,
        admission=admission,
    )  # fmt: skip
    sim_res = simulate(sim_policy, wl, sim_cfg)
    sim = summarize(sim_res)

    s = args.time_scale
    scaled = profile.time_scaled(s)
    rows = wl.prompt_idx
    prompts = [wl.prompts[r] for r in rows]
    optimal = wl.optimal[profile.ids]
    oracle = _OracleAdapter({wl.prompts[r]: profile.ids[int(optimal[r])] for r in set(rows.tolist())})
    # the simulator's policy options with every time scaled (SLO, period, demand bins and window,
    # DiffServe's re-allocation period): the live policy differs from the simulator's in nothing else
    spec = sim_policy.predictor_spec
    live_options = {
        **sim_options,
        "slo_s": scaled.default_slo_s(),
        "period_s": period * s,
        "predictor": dataclasses.replace(spec, bin_s=spec.bin_s * s, window_s=spec.window_s * s),
    }
    if hasattr(sim_policy.options, "allocation_period_s"):
        live_options["allocation_period_s"] = sim_policy.allocation_period_s * s
    settings = Settings.model_validate(
        {
            "profile": args.fid_profile,
            "solver": {"backend": "highs"},
            "service": {
                "policy": args.policy,
                "workers": args.gpus,
                "stand_in_scale": 1.0,
                "control_period_s": period * s,
                "heartbeat_s": 0.2,
                "worker_timeout_s": 5.0,
                "sizes": ["512x512"],
            },
            "admission": {"enabled": not args.no_admission},
        }
    )
    service = Service(settings, profile=scaled, classifier=oracle)
    live_policy = make_policy(args.policy, scaled, rng=np.random.default_rng(0), classifier=oracle, config=live_options)
    if profile.cascade is not None and wl.confidence is not None:
        # the stand-in light workers judge with the simulator's per-prompt confidences
        conf = {wl.prompts[r]: float(wl.confidence[r]) for r in set(rows.tolist())}
        service.factory.stand_in_judge = lambda item: conf[item.prompt]
    from collections import Counter

    first = wl.arrivals_s < period
    warm = (
        int(first.sum()),
        Counter(profile.ids[int(optimal[r])] for r in rows[first]),
        tuple(float(t) * s for t in wl.arrivals_s[first]),  # when, within the compressed period
    )
    live_plans: list[dict] | None = [] if args.plans else None
    live = asyncio.run(_live_replay(service, wl.arrivals_s * s, prompts, warm, live_policy, live_plans))
    n = len(live)
    ok = sum(1 for _, _, met in live if met)
    mix: dict[str, int] = {}
    for _, lv, _ in live:
        if lv is not None:
            mix[lv] = mix.get(lv, 0) + 1
    served = max(1, sum(mix.values()))
    live_viol = 1 - ok / n
    print(f"simulator fidelity: {args.fid_profile}, policy {args.policy}, {args.gpus} workers, trace {args.trace}, "
          f"{n} requests; live time scale {s:g} (stand-in workers); "
          f"simulated cache prefill {args.cache_prefill:g}; admission {admission.describe()}")  # fmt: skip
    dropped = sum(1 for lat, lv, _ in live if lv is None)
    print(f"{'refused or dropped':<22}{sim.get('dropped', 0) / max(1, n):>10.3f}{dropped / max(1, n):>10.3f}")
    after = int(np.sum(sim_res.deferred & (sim_res.status == 2)))  # dropped after the light stage
    live_after = sum(1 for lat, lv, _ in live if lv is None and lat < 0)
    print(f"{'  of which on arrival':<22}{(sim.get('dropped', 0) - after) / max(1, n):>10.3f}"
          f"{(dropped - live_after) / max(1, n):>10.3f}")  # fmt: skip
    print(f"{'  after the light stage':<22}{after / max(1, n):>10.3f}{live_after / max(1, n):>10.3f}")
    print(f"{'':<22}{'simulator':>10}{'live':>10}{'diff (pp)':>11}")
    print(f"{'SLO violation ratio':<22}{sim['slo_violation_ratio']:>10.3f}{live_viol:>10.3f}"
          f"{100 * (live_viol - sim['slo_violation_ratio']):>11.1f}")  # fmt: skip
    # latency of the requests both serve, in trace seconds (the live one divided by the time scale)
    both = [(f - a, lat / s) for f, a, (lat, lv, _) in zip(sim_res.finish_s, wl.arrivals_s, live, strict=True)
            if np.isfinite(f) and lv is not None]  # fmt: skip
    if both:
        sl, ll = np.array(both).T
        print(f"{'latency p50 (s)':<22}{np.median(sl):>10.2f}{np.median(ll):>10.2f}{'':>11}")
        print(f"{'latency p99 (s)':<22}{np.quantile(sl, 0.99):>10.2f}{np.quantile(ll, 0.99):>10.2f}{'':>11}")
    for lv in profile.ids:
        a = sim["level_mix"].get(lv, 0.0)
        b = mix.get(lv, 0) / served
        print(f"{'mix ' + lv:<22}{a:>10.3f}{b:>10.3f}{100 * (b - a):>11.1f}")
    if live_plans is not None:
        print("plans (trace time s, predicted QPM, workers per level[, thresholds]; live: what it saw)")
        for p in sim_res.plans:
            counts = {k: v for k, v in p["counts"].items() if v}
            th = {k: round(v, 3) for k, v in p["thresholds"].items()}
            print(f"  {'simulator':<10}{p['t']:>8.1f}{p['predicted_qpm']:>8.1f}  {counts} {th or ''}")
        for p in live_plans:
            counts = dict(Counter(v for v in p["assignment"].values() if v))
            th = {k: round(v, 3) for k, v in p["thresholds"].items()}
            cur = dict(Counter(v for v in p["current"].values()))
            print(f"  {'live':<10}{p['t'] / s:>8.1f}{p['qpm'] * s:>8.1f}  {counts} {th or ''}  "
                  f"[{p['reason']}: {p['arrivals']} arrivals in {p['period'] / s:.2f} s; current {cur}]")  # fmt: skip
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="sdxl-ac-a100")
    ap.add_argument("--policy", default="argus")
    ap.add_argument("-n", type=int, default=5000, help="requests per measurement")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--workers", type=int, default=8, help="stand-in workers")
    ap.add_argument("--scale", type=float, default=0.0001, help="stand-in latency scale (TEST MODE)")
    ap.add_argument("--redis", help="redis URL, or 'auto' to start a redis-server")
    ap.add_argument("--fidelity", action="store_true", help="compare the simulator with the live service")
    ap.add_argument("--fid-profile", default="sm-a100", help="profile of the fidelity run")
    ap.add_argument("--trace", default="bursty:low=60,high=240,duration=10m", help="trace of the fidelity run")
    ap.add_argument("--gpus", type=int, default=4, help="workers of the fidelity run")
    ap.add_argument("--period", type=float, default=60.0, help="control period of the fidelity run (s)")
    ap.add_argument(
        "--time-scale",
        type=float,
        default=0.5,
        # docs/benchmarks.md ("One decision path: worker choice and fidelity"): at 0.1 the stand-ins'
        # per-batch overhead on 2 shared cores is a large part of a cascade's 10 ms light batches
        help="live time compression of the fidelity run (0.5: the live run takes half the trace's time)",
    )
    ap.add_argument(
        "--cache-prefill",
        type=float,
        default=1.0,
        help="share of prompts cached before the simulated run (stand-in workers always hit: 1)",
    )
    ap.add_argument("--plans", action="store_true", help="fidelity run: print both sides' plans")
    ap.add_argument("--no-admission", action="store_true", help="fidelity run without admission (both sides)")
    args = ap.parse_args()
    if args.fidelity:
        return fidelity(args)
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
                # the stand-ins run at SCALE x the profile, so the deadline test never refuses here; no
                # queue cap either: the submits outrun the stand-ins and would be refused at the cap
                "admission": {"queue_cap": 0},
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
