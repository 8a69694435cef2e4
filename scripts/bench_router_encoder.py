#!/usr/bin/env python
"""The router's prompt stage with a level classifier and the cache-similarity view (``argus+`` on
an AC profile), before and after sharing one text-encoder pass (docs/benchmarks.md, "Router
prompt stage").

* before: the classifier (``BatchedClassifier``) and the similarity view (``CacheSimilarity``), each
  micro-batched on its own thread and encoder, awaited together (two MiniLM passes per prompt);
* after: :class:`argusdiff.service.prompt_pass.PromptPass`: one micro-batched MiniLM pass, the
  classifier head and the index query on its rows.

Both run through the live router (``Router._read_prompt``) of a ``Service`` (``argus+``,
``demo-cpu``, no workers) over the packaged MiniLM (float32 unless ``--precision``; an untrained
head: speed only) and an HNSW index of ``--index-size`` random unit vectors (the query costs
~0.2 ms; the encoder is the cost). Built-in prompts, each prompt once per measurement.

Two loads, the variants interleaved in each repetition (medians over ``--reps``):

* closed loop, ``--clients`` concurrent callers: prompts/s and per-prompt latency p50/p99;
* open loop at ``--rate`` prompts/s (Poisson arrivals): latency p50/p99 and the rate achieved.

Usage: python scripts/bench_router_encoder.py [--threads 1] [--reps 3] [--prompts 256] [--device cuda]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


async def closed_loop(read, prompts: list[str], clients: int) -> tuple[float, list[float]]:
    lat: list[float] = []
    it = iter(prompts)

    async def client() -> None:
        for p in it:
            t0 = time.perf_counter()
            await read(p)
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return len(prompts) / (time.perf_counter() - t0), lat


async def open_loop(read, prompts: list[str], rate: float, seed: int) -> tuple[float, list[float]]:
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, len(prompts))
    lat: list[float] = []

    async def one(p: str) -> None:
        t0 = time.perf_counter()
        await read(p)
        lat.append(time.perf_counter() - t0)

    tasks = []
    t_start = time.perf_counter()
    due = t_start
    for p, g in zip(prompts, gaps, strict=True):
        due += g
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(p)))
    await asyncio.gather(*tasks)
    return len(prompts) / (time.perf_counter() - t_start), lat


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs) * 1000.0, q))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the bench's base: 1)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=256, help="prompts per measurement")
    ap.add_argument("--clients", type=int, default=32, help="concurrent callers of the closed loop")
    ap.add_argument("--rate", type=float, default=20.0, help="open-loop arrival rate (prompts/s)")
    ap.add_argument("--index-size", type=int, default=10_000)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--max-wait-s", type=float, default=0.005)
    ap.add_argument("--precision", default="float32", choices=("float32", "bfloat16", "int8", "auto"))
    ap.add_argument("--device", default="cpu", help="where the MiniLM runs: cpu (default), cuda, cuda:1, ...")
    ap.add_argument("--target-rate", type=float, default=300.0, help="the target throughput (prompts/s)")
    ap.add_argument("--target-p99-ms", type=float, default=50.0, help="the target p99 latency (ms)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from argusdiff.config import Settings
    from argusdiff.profile import load_profile
    from argusdiff.service.app import Service
    from argusdiff.service.prompt_pass import PromptPass
    from argusdiff.service.similarity import CacheSimilarity, ac_model
    from cache.index import HnswIndex
    from cache.latent_cache import LatentCache
    from cache.store import LocalDirStore
    from classifiers.level import BatchedClassifier, LevelClassifier
    from traces.embeddings import DIM, PromptEncoder, get_encoder
    from traces.prompts import builtin_prompts

    profile = load_profile("demo-cpu")
    pool = list(builtin_prompts().prompts)
    need = args.prompts * (2 * args.reps + 1) * 2 + 64
    if need > len(pool):
        pool = (pool * (need // len(pool) + 1))[:need]
    tmp = Path(tempfile.mkdtemp(prefix="bench-router-encoder-"))
    cache = LatentCache(HnswIndex(tmp / "index", DIM), LocalDirStore(tmp / "blobs"))
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((args.index_size, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    model = ac_model(profile)
    cache.index.add_many([(f"k{i}", v, model, {2: 1}, 0.0) for i, v in enumerate(vecs)])
    if args.device == "cpu":
        embed = get_encoder(use_cache=False).encode
    else:  # the similarity view's own encoder on the same device as the classifier's
        embed = PromptEncoder(device=args.device, use_cache=False).encode
    clf = LevelClassifier.new(profile.ids, precision=args.precision, device=args.device)
    batched = BatchedClassifier(clf, max_batch=args.max_batch, max_wait_s=args.max_wait_s)
    view = CacheSimilarity(cache, model=model, embed=embed, max_batch=args.max_batch, max_wait_s=args.max_wait_s)
    settings = Settings.model_validate(
        {
            "profile": "demo-cpu",
            "solver": {"backend": "highs"},
            "service": {"policy": "argus+", "workers": 0, "sizes": ["512x512"]},
            "classifier": {"max_batch": args.max_batch, "max_wait_s": args.max_wait_s},
        }
    )
    service = Service(settings, profile=profile, classifier=batched, cache_similarity=view)
    router = service.router
    one_pass = service.prompt_pass
    assert isinstance(one_pass, PromptPass) and router.prompt_pass is one_pass
    shared, why = one_pass.sharing()
    lengths = [len(x) for x in clf.tokenizer(pool[: args.prompts], truncation=True, max_length=128)["input_ids"]]
    print(
        f"router prompt stage, argus+ on demo-cpu: MiniLM-L6 ({clf.precision}, {args.device}"
        f"{' ' + torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith('cuda') else ''}), "
        f"{torch.get_num_threads()} torch "
        f"thread(s), {os.cpu_count()} CPUs, index {len(cache.index)} entries, max batch {args.max_batch}, "
        f"max wait {args.max_wait_s * 1000:g} ms; prompts: built-in, mean {np.mean(lengths):.1f} word pieces"
    )
    print(f"shared encoder: {shared} ({why})")
    batch = pool[: args.max_batch]
    clf.pooled(batch)
    t_enc = []
    for _ in range(3):
        t0 = time.perf_counter()
        clf.pooled(batch, batch_size=len(batch))
        t_enc.append(time.perf_counter() - t0)
    per = statistics.median(t_enc) / len(batch)
    print(f"the encoder alone, one batch of {len(batch)}: {per * 1000:.1f} ms/prompt "
          f"(at most {1 / per:.0f} prompts/s per encoder thread)")  # fmt: skip

    async def before(p: str):
        router.prompt_pass = None
        return await router._read_prompt(p)

    async def after(p: str):
        router.prompt_pass = one_pass
        return await router._read_prompt(p)

    variants = {"before: two passes": before, "after: one pass": after}
    cursor = [64]

    def fresh() -> list[str]:
        out = pool[cursor[0] : cursor[0] + args.prompts]
        cursor[0] += args.prompts
        return out

    async def run() -> dict:
        res: dict = {name: {"closed": [], "closed_p50": [], "closed_p99": [], "open_p50": [], "open_p99": [],
                            "open_rate": []} for name in variants}  # fmt: skip
        for fn in variants.values():  # warm-up: models loaded, sharing checked
            await asyncio.gather(*(fn(p) for p in pool[:32]))
        for rep in range(args.reps):
            for name, fn in variants.items():
                rate, lat = await closed_loop(fn, fresh(), args.clients)
                res[name]["closed"].append(rate)
                res[name]["closed_p50"].append(pct(lat, 50))
                res[name]["closed_p99"].append(pct(lat, 99))
            for name, fn in variants.items():
                rate, lat = await open_loop(fn, fresh(), args.rate, seed=rep)
                res[name]["open_rate"].append(rate)
                res[name]["open_p50"].append(pct(lat, 50))
                res[name]["open_p99"].append(pct(lat, 99))
        return res

    encoded0 = one_pass.encoded
    res = asyncio.run(run())
    med = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in res.items()}
    print(f"\nmedians of {args.reps} interleaved repetitions, {args.prompts} prompts each")
    print(f"{'variant':<22}{'closed prompts/s':>17}{'p50 ms':>9}{'p99 ms':>9}   "
          f"{'open @ ' + format(args.rate, 'g') + '/s: p50 ms':>22}{'p99 ms':>9}{'achieved/s':>12}")  # fmt: skip
    for name, m in med.items():
        print(f"{name:<22}{m['closed']:>17.1f}{m['closed_p50']:>9.1f}{m['closed_p99']:>9.1f}   "
              f"{m['open_p50']:>22.1f}{m['open_p99']:>9.1f}{m['open_rate']:>12.1f}")  # fmt: skip
    b, a = med["before: two passes"], med["after: one pass"]
    print(f"\nratio after/before: closed-loop throughput x{a['closed'] / b['closed']:.2f}, closed p99 "
          f"x{a['closed_p99'] / b['closed_p99']:.2f}, open-loop p99 x{a['open_p99'] / b['open_p99']:.2f}")  # fmt: skip
    per_prompt = (one_pass.encoded - encoded0) / max(1, one_pass.prompts)
    print(f"encoder passes per prompt in the one-pass variant: {per_prompt:.2f}")
    met = a["closed"] >= args.target_rate and a["closed_p99"] <= args.target_p99_ms
    print(f"target >= {args.target_rate:g} prompts/s with p99 <= {args.target_p99_ms:g} ms (closed loop): "
          f"{'met' if met else 'NOT met'} ({a['closed']:.0f} prompts/s, p99 {a['closed_p99']:.0f} ms)")  # fmt: skip
    for part in (one_pass, batched, view):
        part.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
