#!/usr/bin/env python
"""Workers benchmark on the tiny demo pipelines (one run; prints medians and ratios).

    python scripts/bench_workers.py [--repeats 7] [--torch-threads 1]

1. Approximate caching: denoising time of a full N-step run vs resuming from step K (tiny SD-XL
   and tiny SD, N = 8), UNet calls, and the share of UNet time saved per K (ideal: K/N).
2. Cascade: light (1 step) vs heavy (8 steps) vs heavy started from the light latent
   (DiffServe's open idea; SDEdit at strength 0.5 → 4 heavy steps).
3. Worker loop: requests/s through the in-process queue at batch 1 and 4 (tiny SD-XL, K = 0).

Random-weight models: the numbers measure the machinery (step counts, overheads), not quality.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def med(fn, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def bench_ac(registry, repeats: int) -> None:
    from workers.pipelines import generate, resume

    print("\n## Approximate caching: resume from step K (denoise only, batch 1)")
    print(f"{'model':<16}{'K':>3}{'N':>3}{'UNet calls':>11}{'denoise ms':>12}{'time saved':>12}{'ideal K/N':>11}")
    for name in ("demo-tiny-sdxl", "demo-tiny-sd"):
        model = registry.load(name)
        n = model.spec.steps
        ks = (2, 4, 6)
        full = generate(model, ["a red cube"], [1], capture=ks, decode_images=False)
        t_full = med(lambda m=model: generate(m, ["a red cube"], [1], decode_images=False), repeats)
        print(f"{name:<16}{0:>3}{n:>3}{full.unet_calls:>11}{t_full * 1000:>12.1f}{'-':>12}{'-':>11}")
        for k in ks:
            lat = full.captured[k]
            calls = resume(model, ["a red cube"], lat, k, [1], decode_images=False).unet_calls
            t = med(lambda m=model, lat=lat, k=k: resume(m, ["a red cube"], lat, k, [1], decode_images=False), repeats)
            print(f"{name:<16}{k:>3}{n:>3}{calls:>11}{t * 1000:>12.1f}{1 - t / t_full:>12.2f}{k / n:>11.2f}")


def bench_cascade(registry, repeats: int) -> None:
    from workers.pipelines import generate, refine_from_latent

    print("\n## Cascade: light, heavy, heavy from the light latent (denoise + decode, batch 1)")
    light = registry.load("demo-tiny-sd-1step")
    heavy = registry.load("demo-tiny-sd")
    lgen = generate(light, ["a cat"], [1])
    t_light = med(lambda: generate(light, ["a cat"], [1]), repeats)
    t_heavy = med(lambda: generate(heavy, ["a cat"], [1]), repeats)
    refine = refine_from_latent(heavy, ["a cat"], lgen.latents, [1], strength=0.5)
    t_refine = med(lambda: refine_from_latent(heavy, ["a cat"], lgen.latents, [1], strength=0.5), repeats)
    print(f"{'path':<34}{'UNet calls':>11}{'ms':>10}{'vs heavy':>10}")
    print(f"{'light (1 step)':<34}{lgen.unet_calls:>11}{t_light * 1000:>10.1f}{t_light / t_heavy:>10.2f}")
    print(f"{'heavy (8 steps)':<34}{heavy.spec.steps:>11}{t_heavy * 1000:>10.1f}{1.0:>10.2f}")
    label = "heavy from light latent (s=0.5)"
    print(f"{label:<34}{refine.unet_calls:>11}{t_refine * 1000:>10.1f}{t_refine / t_heavy:>10.2f}")
    print(
        f"deferred request, light + heavy: {(t_light + t_heavy) * 1000:.1f} ms; "
        f"light + heavy-from-light: {(t_light + t_refine) * 1000:.1f} ms "
        f"({(t_light + t_refine) / (t_light + t_heavy):.2f}x)"
    )


def bench_loop(registry, n_requests: int) -> None:
    from argusdiff.profile import load_profile
    from argusdiff.service.transport.memory import InProcessWorkQueue
    from workers.executor import ExecutorFactory
    from workers.loop import Worker
    from workers.messages import WorkItem

    print(f"\n## Worker loop: {n_requests} requests at xl-k0 through the in-process queue")
    profile = load_profile("demo-cpu")
    factory = ExecutorFactory(profile, registry)
    base = None
    for batch in (1, 4):
        q = InProcessWorkQueue()
        w = Worker("w0", q, factory, level="xl-k0", batch_size=batch, poll_s=0.01)
        w.run_once()  # build the executor / load the model
        for i in range(n_requests):
            q.put("xl-k0", WorkItem(f"r{i}", f"prompt {i}", "xl-k0", seed=i))
        t0 = time.perf_counter()
        done = w.drain()
        elapsed = time.perf_counter() - t0
        rps = done / elapsed
        base = base or rps
        waits = sorted(q.wait_result(f"r{i}", timeout=0).timings["queue_wait_s"] for i in range(n_requests))
        print(
            f"batch {batch}: {rps:.2f} req/s ({rps / base:.2f}x of batch 1), "
            f"median queue wait {statistics.median(waits) * 1000:.0f} ms, batches {w.stats.batches}"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--models-dir", default=None)
    args = ap.parse_args(argv)

    import os
    import platform

    import torch

    torch.set_num_threads(args.torch_threads)
    from workers.registry import ModelRegistry

    print(
        f"bench_workers: {os.cpu_count()}-core {platform.machine()}, torch {torch.__version__}, "
        f"threads {args.torch_threads}, repeats {args.repeats}, {time.strftime('%Y-%m-%d')}"
    )
    registry = ModelRegistry(device="cpu", models_dir=args.models_dir, max_loaded=4)
    bench_ac(registry, args.repeats)
    bench_cascade(registry, args.repeats)
    bench_loop(registry, args.requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
