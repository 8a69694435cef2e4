#!/usr/bin/env python
"""The router's prompt pass on real DiffusionDB prompts: float32 (the pass before int8) against the
int8 per-channel encoder with identical prompts in flight merged and a cache of exact repeats (the
default now), in one interleaved run (docs/benchmarks.md, "Router prompt stage").

A classifier head is trained on ``--train-prompts`` DiffusionDB prompts with SYNTHETIC labels
(``traces.synthetic`` on ``demo-cpu``'s levels; frozen MiniLM, mean pooling: the training
defaults), and its int8 gate measured on the held-out split (accuracy against the labels in float32
and int8, cache recall@5 of int8 queries among the float32 embeddings). Then three variants of the
live router's prompt stage (``Router._read_prompt`` of a ``Service``: ``argus+`` on ``demo-cpu``,
no workers; the classifier and the cache-similarity view share one pass; an HNSW index of
``--index-size`` random unit vectors) are timed on the same prompt windows, interleaved in every
repetition (medians over ``--reps``), each window a fresh run of consecutive DiffusionDB prompts
(their repeats included, as they come), each variant's repeat cache emptied before it:

* ``float32``: MiniLM in float32, no merging, no repeat cache (the pass before this change);
* ``int8``: the int8 per-channel encoder (ONNX Runtime when installed), no merging, no cache;
* ``int8 + merge + repeats``: the default.

Loads: a closed loop of ``--clients`` callers (prompts/s, p50, p99) and an open loop at ``--rate``
prompts/s (Poisson arrivals: p50, p99, rate achieved). Target (issue 22): the default at least
twice the float32 pass's closed-loop rate, with p99 <= 100 ms at 100 prompts/s offered.

Usage: python scripts/bench_prompt_pass.py [--reps 3] [--prompts 256] [--rate 100] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
DIFFUSIONDB = ROOT.parent / "shared" / "data" / "prompts" / "diffusiondb_2m_first_5k.txt"

from bench_router_encoder import closed_loop, open_loop, pct  # noqa: E402


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts-file", default=str(DIFFUSIONDB), help="one prompt a line (DiffusionDB's first 5k)")
    ap.add_argument("--train-prompts", type=int, default=400, help="prompts of the classifier's training table")
    ap.add_argument("--threads", type=int, default=1, help="torch / ONNX Runtime intra-op threads")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=256, help="prompts per measurement")
    ap.add_argument("--clients", type=int, default=32, help="concurrent callers of the closed loop")
    ap.add_argument("--rate", type=float, default=100.0, help="open-loop arrival rate (prompts/s)")
    ap.add_argument("--index-size", type=int, default=10_000)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--max-wait-s", type=float, default=0.005)
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
    from classifiers.int8 import ort_available
    from classifiers.level import BatchedClassifier, LevelClassifier
    from classifiers.train import TrainConfig, train_level_classifier
    from traces.embeddings import DIM
    from traces.synthetic import synthetic_quality_table

    lines = [ln.strip() for ln in Path(args.prompts_file).read_text(encoding="utf-8").splitlines() if ln.strip()]
    profile = load_profile("demo-cpu")
    train = lines[: args.train_prompts]
    stream = lines[args.train_prompts :]
    need = 2 * args.reps * args.prompts
    if need > len(stream):
        raise SystemExit(f"{args.prompts_file}: {len(stream)} prompts after training, {need} needed")
    print(f"machine: {cpu_name()}, {os.cpu_count()} CPUs, {platform.platform()}; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} (a shared machine); "
          f"{datetime.date.today().isoformat()}; torch {torch.__version__}, "
          f"onnxruntime {'yes' if ort_available() else 'no'}")  # fmt: skip
    t0 = time.perf_counter()
    table = synthetic_quality_table(train, profile, seed=0)
    clf, _ = train_level_classifier(table, config=TrainConfig(epochs=15, progress=False, seed=0))
    gate = clf.meta.report["int8"]
    print(f"classifier: head on the packaged MiniLM, {len(train)} DiffusionDB prompts, SYNTHETIC labels "
          f"({table.source}); trained in {time.perf_counter() - t0:.0f} s")  # fmt: skip
    print(f"int8 gate on {gate.get('n')} held-out prompts ({gate.get('backend')}): accuracy float32 "
          f"{gate.get('accuracy_float32', float('nan')):.3f}, int8 {gate.get('accuracy_int8', float('nan')):.3f}; "
          f"cache recall@5 {gate.get('recall_at_5', float('nan')):.3f} (index {gate.get('index')}); "
          f"{'PASSED' if gate['passed'] else 'FAILED ' + str(gate.get('error', ''))}")  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="bench-prompt-pass-"))
    clf.save(tmp / "clf")
    lengths = [len(x) for x in clf.tokenizer(stream[:1000], truncation=True, max_length=128)["input_ids"]]
    print(f"prompts: {Path(args.prompts_file).name}, mean {np.mean(lengths):.1f} word pieces (first 1,000 timed)")

    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((args.index_size, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    model = ac_model(profile)

    def router_for(precision: str, repeats: int, merge: bool):
        cache = LatentCache(HnswIndex(tmp / f"index-{precision}-{repeats}", DIM), LocalDirStore(tmp / "blobs"))
        cache.index.add_many([(f"k{i}", v, model, {2: 1}, 0.0) for i, v in enumerate(vecs)])
        c = LevelClassifier.load(tmp / "clf", precision=precision, threads=args.threads)
        batched = BatchedClassifier(c, max_batch=args.max_batch, max_wait_s=args.max_wait_s, repeat_cache=repeats)
        view = CacheSimilarity(cache, model=model, embed=None, max_batch=args.max_batch, max_wait_s=args.max_wait_s)
        settings = Settings.model_validate({
            "profile": "demo-cpu", "solver": {"backend": "highs"},
            "service": {"policy": "argus+", "workers": 0, "sizes": ["512x512"]},
            "classifier": {"max_batch": args.max_batch, "max_wait_s": args.max_wait_s, "repeat_cache": repeats},
        })  # fmt: skip
        service = Service(settings, profile=profile, classifier=batched, cache_similarity=view)
        pp = PromptPass(batched, view, max_batch=args.max_batch, max_wait_s=args.max_wait_s, repeat_cache=repeats,
                        merge=merge)  # fmt: skip
        service.router.prompt_pass = pp
        ok, why = pp.sharing()
        print(f"  {precision}: {c.precision}{' (' + c.int8.backend + ')' if c.int8 is not None else ''}; "
              f"one pass: {ok} ({why})")  # fmt: skip
        return service.router, pp

    print("variants:")
    variants = {
        "float32 (before)": router_for("float32", 0, False),
        "int8": router_for("int8", 0, False),
        "int8 + merge + repeats": router_for("int8", 1024, True),
    }

    async def run() -> dict:
        res = {n: {k: [] for k in ("closed", "closed_p50", "closed_p99", "open_p50", "open_p99", "open_rate",
                                   "encoded", "prompts")} for n in variants}  # fmt: skip
        for router, _ in variants.values():  # warm-up
            await asyncio.gather(*(router._read_prompt(p) for p in train[:32]))
        cursor = 0
        for rep in range(args.reps):
            for load in ("closed", "open"):
                window = stream[cursor : cursor + args.prompts]
                cursor += args.prompts
                for name, (router, pp) in variants.items():
                    pp.repeats.clear()
                    e0 = pp.encoded
                    if load == "closed":
                        rate, lat = await closed_loop(router._read_prompt, window, args.clients)
                        res[name]["closed"].append(rate)
                        res[name]["closed_p50"].append(pct(lat, 50))
                        res[name]["closed_p99"].append(pct(lat, 99))
                    else:
                        rate, lat = await open_loop(router._read_prompt, window, args.rate, seed=rep)
                        res[name]["open_rate"].append(rate)
                        res[name]["open_p50"].append(pct(lat, 50))
                        res[name]["open_p99"].append(pct(lat, 99))
                    res[name]["encoded"].append(pp.encoded - e0)
                    res[name]["prompts"].append(len(window))
        return res

    res = asyncio.run(run())
    med = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in res.items()}
    print(f"\nmedians of {args.reps} interleaved repetitions, {args.prompts} consecutive prompts per measurement, "
          f"{args.threads} thread(s)")  # fmt: skip
    print(
        f"{'variant':<26}{'closed prompts/s':>17}{'p50 ms':>9}{'p99 ms':>9}   "
        f"{'open @ ' + format(args.rate, 'g') + '/s: p50 ms':>23}{'p99 ms':>9}{'achieved/s':>12}{'encoded':>9}"
    )
    for name, m in med.items():
        enc = sum(res[name]["encoded"]) / max(1, sum(res[name]["prompts"]))
        print(f"{name:<26}{m['closed']:>17.1f}{m['closed_p50']:>9.1f}{m['closed_p99']:>9.1f}   "
              f"{m['open_p50']:>23.1f}{m['open_p99']:>9.1f}{m['open_rate']:>12.1f}{enc:>9.2f}")  # fmt: skip
    base, new = med["float32 (before)"], med["int8 + merge + repeats"]
    ratio = new["closed"] / base["closed"]
    met = ratio >= 2.0 and new["open_p99"] <= 100.0
    print(f"\ndefault vs float32: closed-loop x{ratio:.2f}; open-loop p99 {new['open_p99']:.0f} ms at "
          f"{args.rate:g}/s offered ({new['open_rate']:.0f}/s achieved)")  # fmt: skip
    print(f"target (>= 2x, p99 <= 100 ms at {args.rate:g} prompts/s): {'met' if met else 'NOT met'}")
    for _, pp in variants.values():
        pp.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
