#!/usr/bin/env python
"""Overload: the live service at a multiple of its capacity, admission on vs off.

A service in process (router, control loop, embedded queues) whose stand-in workers (TEST MODE)
sleep a profile's latencies with time compressed by ``--time-scale`` (latencies, load times and
the SLO all scaled, as ``bench_service.py --fidelity``) takes an open-loop burst at ``--load`` x
the most the cluster can serve (every worker at the profile's fastest level), for ``--duration``
seconds, through ``Router.submit`` (what the HTTP endpoints call; a refusal is the ApiError the
API answers with: 429 ``overloaded`` + ``Retry-After``). Then it waits until nothing is in flight
and sends one more request.

Prints per run (admission on, then off): requests sent, refused, the first refusal's delay after
the backlog of a level passed its deadline (sampled every 5 ms: in-flight > what the serving
workers finish by the SLO), Retry-After range, p50/p99 latency of the admitted requests against
the SLO and the share within it, the most in flight at a level vs what can finish by the deadline,
process RSS before/after, and recovery (burst end to nothing in flight, and to the next request
served).

    python scripts/bench_overload.py                 # sm-a100, argus, 2 workers, 2x for 20 s
    python scripts/bench_overload.py --no-compare    # admission on only
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def _run(args, admission: bool) -> dict:
    from argusdiff.config import Settings
    from argusdiff.profile import load_profile
    from argusdiff.service.app import Service
    from argusdiff.service.errors import ApiError
    from argusdiff.service.schemas import GenerationSpec
    from argusdiff.service.worker import wait_until

    profile = load_profile(args.profile).time_scaled(args.time_scale)
    slo = profile.default_slo_s()
    capacity = args.workers / min(lv.latency(1) for lv in profile.levels)  # requests/s
    rate = args.load * capacity
    settings = Settings.model_validate(
        {
            "profile": args.profile,
            "solver": {"backend": "highs"},
            "service": {
                "policy": args.policy,
                "workers": args.workers,
                "stand_in_scale": 1.0,
                "control_period_s": 0.5,
                "heartbeat_s": 0.1,
                "worker_timeout_s": 5.0,
                "sizes": ["512x512"],
            },
            "admission": {"enabled": admission, "deadline_factor": args.deadline_factor},
        }
    )
    service = Service(settings, profile=profile)
    await service.start()
    try:
        ok = await asyncio.to_thread(
            wait_until, lambda: service.ready() and len(service.control.alive) == args.workers, 30
        )
        if not ok:
            raise SystemExit("service did not become ready")
        router = service.router
        adm = router.admission
        rss0 = _rss_mb()
        served: list[tuple[float, bool]] = []
        refused: list[tuple[float, int]] = []  # (time, Retry-After)
        passed_at: list[float] = []  # when a level's backlog first passed its deadline
        peak: dict[str, tuple[int, int]] = {}  # level -> (most in flight, most that can finish in time)

        async def one(k: int) -> None:
            spec = GenerationSpec(prompt=f"a lighthouse in a storm {k}", response_format="b64_json")
            t0 = time.monotonic()
            try:
                sub = await router.submit(spec)
            except ApiError as exc:
                if exc.status != 429:
                    raise
                refused.append((t0, int(exc.headers["Retry-After"])))
                return
            await router.wait(sub, 600)
            lat = time.monotonic() - t0
            served.append((lat, lat <= slo))

        async def sample(stop: asyncio.Event) -> None:
            while not stop.is_set():
                plan = router.plan
                if plan is not None:
                    for lv, q in list(router.level_load.items()):
                        w = len(adm.workers(plan, lv, router.up or None))
                        if not w:
                            continue
                        fits = adm.most_admitted(lv, plan=plan, workers=w, slo_s=slo) + 1  # held at most
                        most, bound = peak.get(lv, (0, 0))
                        peak[lv] = (max(most, q), max(bound, fits))
                        if q >= fits and not passed_at:  # the next request would be late
                            passed_at.append(time.monotonic())
                await asyncio.sleep(0.005)

        stop = asyncio.Event()
        sampler = asyncio.create_task(sample(stop))
        n = int(rate * args.duration)
        start = time.monotonic()
        tasks = []
        for k in range(n):
            delay = start + k / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(k)))
        burst_end = time.monotonic()
        await asyncio.gather(*tasks)
        drained = await asyncio.to_thread(wait_until, lambda: sum(router.level_load.values()) == 0, 300, 0.01)
        t_idle = time.monotonic()
        stop.set()
        await sampler
        lats = [lat for lat, _ in served]
        within = sum(1 for _, ok in served if ok) / max(1, len(served))
        before = len(served)
        await one(-1)
        probe_ok = len(served) == before + 1
        t_served = time.monotonic()
        rss1 = _rss_mb()
        first_refusal = min((t for t, _ in refused), default=float("nan"))
        onset = first_refusal - passed_at[0] if passed_at else float("nan")
        return {
            "admission": "on" if admission else "off",
            "rate": rate,
            "capacity": capacity,
            "slo": slo,
            "sent": n,
            "refused": len(refused),
            "retry": (min((r for _, r in refused), default=0), max((r for _, r in refused), default=0)),
            "onset_s": onset,
            "p50": statistics.median(lats) if lats else float("nan"),
            "p99": _quantile(lats, 0.99),
            "within": within,
            "peak": peak,
            "rss": (rss0, rss1),
            "drain_s": t_idle - burst_end if drained else float("inf"),
            "recover_s": t_served - burst_end,
            "probe_ok": probe_ok,
        }
    finally:
        await service.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="sm-a100")
    ap.add_argument("--policy", default="argus")
    ap.add_argument("--workers", type=int, default=2, help="stand-in workers")
    ap.add_argument("--time-scale", type=float, default=0.05, help="live time compression (latencies, SLO)")
    ap.add_argument("--load", type=float, default=2.0, help="offered load as a multiple of the cluster's maximum")
    ap.add_argument("--duration", type=float, default=20.0, help="burst length (s)")
    ap.add_argument(
        "--deadline-factor", type=float, default=None, help="[admission] deadline_factor (default: the configured one)"
    )
    ap.add_argument("--no-compare", action="store_true", help="admission on only (no run with it off)")
    args = ap.parse_args()
    if args.deadline_factor is None:
        from argusdiff.config import load_settings

        args.deadline_factor = load_settings().admission.deadline_factor
    runs = [asyncio.run(_run(args, True))]
    if not args.no_compare:
        runs.append(asyncio.run(_run(args, False)))
    r0 = runs[0]
    print(f"overload: {args.profile} x{args.time_scale:g} time scale, policy {args.policy}, {args.workers} stand-in "
          f"workers; capacity {r0['capacity']:.1f} req/s (every worker at the fastest level), offered "
          f"{r0['rate']:.1f} req/s ({args.load:g}x) for {args.duration:g} s; SLO {r0['slo']:.2f} s; "
          f"admission deadline factor {args.deadline_factor:g}; "
          f"{platform.machine()} {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")  # fmt: skip
    rows = [
        ("requests sent", lambda r: f"{r['sent']}"),
        ("refused (429)", lambda r: f"{r['refused']} ({r['refused'] / max(1, r['sent']):.0%})"),
        ("first 429 after backlog > deadline", lambda r: f"{r['onset_s'] * 1000:.0f} ms"),
        ("Retry-After min..max", lambda r: f"{r['retry'][0]}..{r['retry'][1]} s" if r["refused"] else "-"),
        ("admitted p50 / p99", lambda r: f"{r['p50']:.2f} / {r['p99']:.2f} s"),
        ("admitted p99 / SLO", lambda r: f"{r['p99'] / r['slo']:.2f}"),
        ("admitted within SLO", lambda r: f"{r['within']:.1%}"),
        (
            "most in flight / fits (level)",
            lambda r: ", ".join(f"{lv} {m}/{b}" for lv, (m, b) in sorted(r["peak"].items()) if m) or "-",
        ),
        ("RSS before -> after", lambda r: f"{r['rss'][0]:.0f} -> {r['rss'][1]:.0f} MiB"),
        ("burst end -> nothing in flight", lambda r: f"{r['drain_s']:.1f} s"),
        (
            "burst end -> next request served",
            lambda r: f"{r['recover_s']:.1f} s" + ("" if r["probe_ok"] else " (refused)"),
        ),
    ]
    print(f"{'':<36}" + "".join(f"{'admission ' + r['admission']:>26}" for r in runs))
    for name, f in rows:
        print(f"{name:<36}" + "".join(f"{f(r):>26}" for r in runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
