#!/usr/bin/env python
"""Latent cache benchmark: nearest-prompt lookup, blob put/get, and UNet calls saved per K.

Sections (each prints a Markdown table; medians and percentiles from this one run):

1. **Lookup** — p50/p99 latency of the cache's nearest-prompt query (model + K filter, as
   ``LatentCache.lookup`` issues it) at each ``--sizes`` entry count, for the HNSW index
   (``cache.index.HnswIndex``), embedded Qdrant (``QdrantIndex(path=...)``) and exact brute force
   (NumPy matrix product), with recall@1 against brute force, build time and, for HNSW, the time
   to reopen (rebuild the graph from SQLite). Embeddings: 384-d unit vectors drawn around 2,000
   random "topic" centres (cosine to the centre ~0.8), so queries have near neighbours as real
   prompt streams do; each query is a stored vector plus noise.
2. **Blob store** — put/get latency of 128 KiB fp16 latents (4×128×128, an SD-XL 1024 px latent)
   on the local folder store and, with ``--s3`` (uses ``S3_ENDPOINT_URL`` or starts
   ``../shared/tools/s3-server.sh``), on the S3 server; plus decode+checksum time.
3. **UNet calls saved** — the demo-cpu profile's tiny SD-XL-shaped pipeline through
   ``workers.ac.ApproxCacheExecutor`` and a real ``LatentCache``: full runs store latents, then
   each AC level re-serves the same prompts from the cache; reports UNet calls per request and
   the fraction saved per K (needs torch, diffusers and the MiniLM prompt encoder; skipped
   otherwise, with the reason).
4. **Router similarity view** — what ``nirvana``/``argus+`` add to the live router's request path
   (``argusdiff.service.similarity.CacheSimilarity``): MiniLM embedding of real prompts plus the
   nearest-prompt query on an HNSW index of ``--view-size`` entries, one request at a time
   (p50/p99 per request) and 32 concurrent requests micro-batched (prompts/s). Needs the MiniLM
   encoder; skipped otherwise.

Usage: ``python scripts/bench_cache.py [--sizes 1000 10000 100000] [--s3] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cache.api import LatentMeta  # noqa: E402
from cache.index import HnswIndex, QdrantIndex, new_prompt_id  # noqa: E402
from cache.store import LocalDirStore, S3Store, blob_key, decode_latent, encode_latent  # noqa: E402

DIM = 384


def pct(samples, q):
    return float(np.percentile(np.asarray(samples, dtype=np.float64), q))


def ms(x: float) -> str:
    return f"{x * 1000:.3f}" if x < 0.01 else f"{x * 1000:.1f}"


def clustered(n: int, rng: np.random.Generator, centres: np.ndarray) -> np.ndarray:
    c = centres[rng.integers(0, len(centres), n)]
    noise = rng.normal(size=(n, DIM)).astype(np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    v = 0.8 * c + 0.6 * noise
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def bench_lookup(sizes: list[int], queries: int, qdrant_max: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(2000, DIM)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    rows = []
    for n in sizes:
        vecs = clustered(n, rng, centres)
        ids = [new_prompt_id() for _ in range(n)]
        picks = rng.choice(n, queries, replace=False)
        qn = rng.normal(size=(queries, DIM)).astype(np.float32)
        qn /= np.linalg.norm(qn, axis=1, keepdims=True)
        qs = vecs[picks] + 0.35 * qn
        qs /= np.linalg.norm(qs, axis=1, keepdims=True)
        truth = []
        lat = []
        for q in qs:  # brute force: exact cosine over the whole matrix
            t0 = time.perf_counter()
            i = int(np.argmax(vecs @ q))
            lat.append(time.perf_counter() - t0)
            truth.append(ids[i])
        rows.append(
            {"engine": "brute force (NumPy)", "n": n, "p50_s": pct(lat, 50), "p99_s": pct(lat, 99), "recall": 1.0}
        )
        print(f"  n={n}: brute force p50 {ms(pct(lat, 50))} ms", file=sys.stderr)

        items = [(pid, v, "m", {10: 131_000, 20: 131_000}, 0.0) for pid, v in zip(ids, vecs, strict=True)]
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            idx = HnswIndex(Path(tmp) / "hnsw", DIM)
            for i in range(0, n, 5000):
                idx.add_many(items[i : i + 5000])
            build_s = time.perf_counter() - t0
            lat, got = [], []
            for q in qs:
                t0 = time.perf_counter()
                res = idx.nearest(q, model="m", k=10, limit=1)
                lat.append(time.perf_counter() - t0)
                got.append(res[0].prompt_id if res else None)
            idx.close()
            t0 = time.perf_counter()
            idx = HnswIndex(Path(tmp) / "hnsw", DIM)  # reopen after a clean close: graph snapshot
            reopen_s = time.perf_counter() - t0
            assert len(idx) == n and idx.opened_from == "snapshot"
            extra = clustered(1000, rng, centres)  # 1,000 prompts stored after the snapshot, then a crash
            idx.add_many([(new_prompt_id(), v, "m", {10: 131_000}, 0.0) for v in extra])
            idx._db.close()
            idx._release_lock()
            t0 = time.perf_counter()
            idx = HnswIndex(Path(tmp) / "hnsw", DIM)  # snapshot + the 1,000-prompt delta from SQLite
            delta_s = time.perf_counter() - t0
            assert len(idx) == n + 1000 and idx.opened_from == "snapshot+delta"
            idx._db.close()  # as after a crash, and no snapshot at all
            idx._release_lock()
            (Path(tmp) / "hnsw" / "graph.hnsw").unlink()
            t0 = time.perf_counter()
            idx = HnswIndex(Path(tmp) / "hnsw", DIM)  # graph rebuilt from SQLite
            rebuild_s = time.perf_counter() - t0
            assert len(idx) == n + 1000 and idx.opened_from == "rebuild"
            idx.close()
            recall = float(np.mean([g == t for g, t in zip(got, truth, strict=True)]))
            rows.append(
                {
                    "engine": "HnswIndex (hnswlib M=16, ef=64, SQLite payload)",
                    "n": n,
                    "p50_s": pct(lat, 50),
                    "p99_s": pct(lat, 99),
                    "recall": recall,
                    "build_s": build_s,
                    "reopen_s": reopen_s,
                    "delta_s": delta_s,
                    "rebuild_s": rebuild_s,
                }
            )
            print(f"  n={n}: hnsw p50 {ms(pct(lat, 50))} ms recall {recall:.3f} build {build_s:.1f}s", file=sys.stderr)

            if n <= qdrant_max:
                t0 = time.perf_counter()
                qidx = QdrantIndex(Path(tmp) / "qdrant", DIM)
                qidx.add_many(items)
                build_s = time.perf_counter() - t0
                nq = min(queries, 50) if n >= 50_000 else queries
                lat, got = [], []
                for q in qs[:nq]:
                    t0 = time.perf_counter()
                    res = qidx.nearest(q, model="m", k=10, limit=1)
                    lat.append(time.perf_counter() - t0)
                    got.append(res[0].prompt_id if res else None)
                qidx.close()
                recall = float(np.mean([g == t for g, t in zip(got, truth[:nq], strict=True)]))
                rows.append(
                    {
                        "engine": "QdrantIndex embedded (path=...)",
                        "n": n,
                        "p50_s": pct(lat, 50),
                        "p99_s": pct(lat, 99),
                        "recall": recall,
                        "build_s": build_s,
                        "queries": nq,
                    }
                )
                print(f"  n={n}: qdrant p50 {ms(pct(lat, 50))} ms build {build_s:.1f}s", file=sys.stderr)
    return rows


def _s3_env(start: bool) -> dict[str, str] | None:
    if os.environ.get("S3_ENDPOINT_URL"):
        return dict(os.environ)
    script = ROOT.parent / "shared" / "tools" / "s3-server.sh"
    if not start or not script.is_file():
        return None
    out = subprocess.run(["bash", str(script), "start"], capture_output=True, text=True, check=True).stdout
    env = {}
    for line in out.splitlines():
        if line.startswith("export "):
            k, _, v = line[7:].partition("=")
            env[k] = v.strip("'\"")
    os.environ.update(env)
    return env


def bench_store(reps: int, use_s3: bool) -> list[dict]:
    rng = np.random.default_rng(1)
    meta = LatentMeta("sdxl-base-1.0", "EulerDiscreteScheduler", 50, 10, (4, 128, 128))
    blobs = [encode_latent(rng.normal(size=(4, 128, 128)).astype(np.float32), meta) for _ in range(reps)]
    rows = []
    t = []
    for b in blobs[:50]:
        t0 = time.perf_counter()
        decode_latent(b)
        t.append(time.perf_counter() - t0)
    rows.append({"store": "decode + SHA-256 check (no I/O)", "op": "decode", "p50_s": pct(t, 50), "p99_s": pct(t, 99)})
    stores = []
    tmp = tempfile.TemporaryDirectory()
    stores.append(("local folder", LocalDirStore(Path(tmp.name) / "blobs")))
    env = _s3_env(start=use_s3) if use_s3 else None
    if use_s3 and env is None:
        print("  S3: skipped (no S3_ENDPOINT_URL and no ../shared/tools/s3-server.sh)", file=sys.stderr)
    if env is not None:
        stores.append(
            (
                "S3 server (Swift s3api, loopback)",
                S3Store("argusdiff-bench", prefix=f"b-{new_prompt_id()[:8]}/", endpoint_url=env["S3_ENDPOINT_URL"]),
            )
        )
    for name, store in stores:
        keys = [blob_key(new_prompt_id(), 10) for _ in blobs]
        put, get = [], []
        for k, b in zip(keys, blobs, strict=True):
            t0 = time.perf_counter()
            store.put(k, b)
            put.append(time.perf_counter() - t0)
        for k in keys:
            t0 = time.perf_counter()
            store.get(k)
            get.append(time.perf_counter() - t0)
        for k in keys:
            store.delete(k)
        rows.append({"store": name, "op": "put", "p50_s": pct(put, 50), "p99_s": pct(put, 99), "bytes": len(blobs[0])})
        rows.append({"store": name, "op": "get", "p50_s": pct(get, 50), "p99_s": pct(get, 99), "bytes": len(blobs[0])})
        print(f"  {name}: put p50 {ms(pct(put, 50))} ms, get p50 {ms(pct(get, 50))} ms", file=sys.stderr)
        store.close()
    tmp.cleanup()
    return rows


def bench_unet(prompts_n: int) -> tuple[list[dict], str | None]:
    try:
        import torch

        from argusdiff.profile import load_profile
        from cache.latent_cache import LatentCache
        from workers.ac import ApproxCacheExecutor, ac_capture_ks
        from workers.messages import WorkItem
        from workers.registry import ModelRegistry

        try:
            from traces.embeddings import encode_prompts
        except ImportError as exc:
            return [], f"the MiniLM prompt encoder is unavailable ({exc})"
    except ImportError as exc:
        return [], f"models extra unavailable ({exc})"
    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    profile = load_profile("demo-cpu")
    ac = [lv for lv in profile.levels if lv.strategy.value == "ac"]
    full = next(lv for lv in ac if lv.skip == 0)
    prompts = [
        "a red fox in fresh snow, golden hour",
        "an astronaut riding a horse on mars",
        "a bowl of ramen on a wooden table, studio light",
        "a lighthouse on a cliff during a storm",
    ][:prompts_n]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        registry = ModelRegistry(models_dir=str(Path(tmp) / "models"))
        cache = LatentCache(HnswIndex(Path(tmp) / "i", DIM), LocalDirStore(Path(tmp) / "b"))
        base = ApproxCacheExecutor(
            full, registry, cache=cache, capture_ks=ac_capture_ks(profile, full), embed=encode_prompts
        )
        calls0 = [base.run([WorkItem(f"full-{i}", p, full.id, seed=i)])[0].unet_calls for i, p in enumerate(prompts)]
        rows.append({"level": full.id, "k": 0, "n": full.steps, "unet_calls": float(np.median(calls0)), "hits": 0})
        for lv in ac:
            if lv.skip == 0:
                continue
            ex = ApproxCacheExecutor(lv, registry, cache=cache, embed=encode_prompts, store=False)
            res = [ex.run([WorkItem(f"{lv.id}-{i}", p, lv.id, seed=100 + i)])[0] for i, p in enumerate(prompts)]
            rows.append(
                {
                    "level": lv.id,
                    "k": lv.skip,
                    "n": lv.steps,
                    "unet_calls": float(np.median([r.unet_calls for r in res])),
                    "hits": sum(1 for r in res if r.cache_hit),
                }
            )
        cache.close()
    full_calls = rows[0]["unet_calls"]
    for r in rows:
        r["saved"] = 1.0 - r["unet_calls"] / full_calls if full_calls else 0.0
        r["prompts"] = len(prompts)
    return rows, None


def bench_view(entries: int, requests: int, seed: int) -> tuple[list[dict], str | None]:
    try:
        from argusdiff.service.similarity import CacheSimilarity
        from cache.latent_cache import LatentCache
        from traces.prompts import builtin_prompts
        from workers.ac import default_embedder
    except ImportError as exc:
        return [], f"the MiniLM prompt encoder is unavailable ({exc})"
    import asyncio

    encode = default_embedder()  # the service's encoder: no disk cache, so every prompt is encoded

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    prompts = list(builtin_prompts().prompts)
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(prompts), 3 * requests + 2, replace=False)
    asked = [prompts[i] for i in picks[:requests]]  # a different prompt set per measurement
    burst = [prompts[i] for i in picks[requests : 2 * requests]]
    alone = [prompts[i] for i in picks[2 * requests :]]
    encode(alone[-2:])  # load the encoder outside the timings
    centres = rng.normal(size=(2000, DIM)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        idx = HnswIndex(Path(tmp) / "i", DIM)
        vecs = clustered(entries, rng, centres)
        items = [(new_prompt_id(), v, "m", {10: 131_000}, 0.0) for v in vecs]
        for i in range(0, entries, 5000):
            idx.add_many(items[i : i + 5000])
        cache = LatentCache(idx, LocalDirStore(Path(tmp) / "b"))
        view = CacheSimilarity(cache, model="m", embed=encode, max_wait_s=0.002)

        async def one_at_a_time() -> list[float]:
            lat = []
            for p in asked:
                t0 = time.perf_counter()
                await view.lookup(p)
                lat.append(time.perf_counter() - t0)
            return lat

        async def concurrent(width: int) -> float:
            t0 = time.perf_counter()
            for i in range(0, len(burst), width):
                await asyncio.gather(*(view.lookup(p) for p in burst[i : i + width]))
            return len(burst) / (time.perf_counter() - t0)

        lat = asyncio.run(one_at_a_time())
        rate = asyncio.run(concurrent(32))
        view.close()
        cache.close()
    embed_lat = []
    for p in alone[:-2]:
        t0 = time.perf_counter()
        encode([p])
        embed_lat.append(time.perf_counter() - t0)
    rows.append(
        {
            "entries": entries,
            "requests": requests,
            "p50_s": pct(lat, 50),
            "p99_s": pct(lat, 99),
            "embed_p50_s": pct(embed_lat, 50),
            "rate_32": rate,
        }
    )
    return rows, None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--queries", type=int, default=200, help="lookups per size (Qdrant at >= 50k: 50)")
    ap.add_argument("--qdrant-max", type=int, default=100_000, help="largest size to try embedded Qdrant at")
    ap.add_argument("--reps", type=int, default=200, help="blobs put and got per store")
    ap.add_argument("--s3", action="store_true", help="also measure the S3 server")
    ap.add_argument("--unet-prompts", type=int, default=3, help="prompts for the UNet-calls section (0 = skip)")
    ap.add_argument("--view-size", type=int, default=10_000, help="index entries for the router view (0 = skip)")
    ap.add_argument("--view-requests", type=int, default=300, help="prompts looked up by the router view")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# bench_cache on {platform.machine()} {os.cpu_count()} cores, {when}")
    print("\n## Nearest-prompt lookup (384-d, model + K filter)\n")
    lookup = bench_lookup(args.sizes, args.queries, args.qdrant_max, args.seed)
    print(
        "| engine | entries | p50 ms | p99 ms | recall@1 | build s | reopen s: snapshot | "
        "snapshot + 1k delta | rebuild |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in lookup:
        build = f"{r['build_s']:.1f}" if "build_s" in r else "–"
        reopen = f"{r['reopen_s']:.2f} | {r['delta_s']:.2f} | {r['rebuild_s']:.1f}" if "reopen_s" in r else "– | – | –"
        lat = f"{ms(r['p50_s'])} | {ms(r['p99_s'])}"
        print(f"| {r['engine']} | {r['n']:,} | {lat} | {r['recall']:.3f} | {build} | {reopen} |")
    by = {(r["engine"].split()[0], r["n"]): r for r in lookup}
    for n in args.sizes:
        h, b, q = by.get(("HnswIndex", n)), by.get(("brute", n)), by.get(("QdrantIndex", n))
        parts = []
        if h and b:
            parts.append(f"brute/HNSW p50 = {b['p50_s'] / h['p50_s']:.1f}x")
        if h and q:
            parts.append(f"Qdrant-embedded/HNSW p50 = {q['p50_s'] / h['p50_s']:.1f}x")
        if parts:
            print(f"\nratio at {n:,}: " + "; ".join(parts))

    print("\n## Blob store, 128 KiB fp16 latents\n")
    store = bench_store(args.reps, args.s3)
    print("| store | op | p50 ms | p99 ms |")
    print("|---|---|---:|---:|")
    for r in store:
        print(f"| {r['store']} | {r['op']} | {ms(r['p50_s'])} | {ms(r['p99_s'])} |")

    unet: list[dict] = []
    if args.unet_prompts > 0:
        print("\n## UNet calls saved per K (demo-cpu tiny pipeline, through LatentCache)\n")
        unet, why = bench_unet(args.unet_prompts)
        if why:
            print(f"skipped: {why}")
        else:
            print("| level | K | N | cache hits | UNet calls/request (median) | saved |")
            print("|---|---:|---:|---:|---:|---:|")
            for r in unet:
                print(
                    f"| {r['level']} | {r['k']} | {r['n']} | {r['hits']}/{r['prompts']} | {r['unet_calls']:.0f} | "
                    f"{r['saved']:.0%} |"
                )
    view: list[dict] = []
    if args.view_size > 0:
        print("\n## Router similarity view (MiniLM embed + HNSW nearest, per request)\n")
        view, why = bench_view(args.view_size, args.view_requests, args.seed)
        if why:
            print(f"skipped: {why}")
        else:
            print(
                "| index entries | requests | p50 ms (one at a time) | p99 ms | of which embed p50 ms "
                "| prompts/s, 32 concurrent |"
            )
            print("|---:|---:|---:|---:|---:|---:|")
            for r in view:
                print(
                    f"| {r['entries']:,} | {r['requests']} | {ms(r['p50_s'])} | {ms(r['p99_s'])} | "
                    f"{ms(r['embed_p50_s'])} | {r['rate_32']:.0f} |"
                )
    if args.json:
        Path(args.json).write_text(json.dumps({"lookup": lookup, "store": store, "unet": unet, "view": view}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
