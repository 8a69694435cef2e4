#!/usr/bin/env python
"""Classifier and discriminator speed on this CPU (for docs/benchmarks.md, "Classifiers").

* level classifier (packaged MiniLM, 6 layers, width 384): per-prompt latency and prompts/s at
  batch 1 and 32, median of repeated runs over real prompts;
* the live batcher (BatchedClassifier, max batch 32) under 256 concurrent submissions;
* discriminator (tf_efficientnetv2_b0, random weights: speed only) latency per image at 512 px,
  batch 1 and 8;
* training time (frozen encoder + head, fixed epochs, no early stop) for 2k / 5k / 10k prompts
  of the synthetic AC table, encoding included.

Usage: python scripts/bench_classifier.py [--threads 2] [--reps 5] [--shared ../shared] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def median_time(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    ap.add_argument("--epochs", type=int, default=10, help="epochs in the training-time runs")
    ap.add_argument("--skip-training", action="store_true", help="inference only")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from argusdiff.profile import load_profile
    from classifiers.discriminator import Discriminator
    from classifiers.level import BatchedClassifier, LevelClassifier
    from classifiers.train import TrainConfig, train_level_classifier
    from traces.prompts import builtin_prompts, load_prompts
    from traces.synthetic import synthetic_quality_table

    ddb_path = Path(args.shared) / "data/prompts/diffusiondb_2m_first_5k.txt"
    texts = list(load_prompts(ddb_path).prompts) if ddb_path.is_file() else []
    source = "DiffusionDB" if texts else "built-in generated"
    texts += list(builtin_prompts().prompts)
    print(f"machine: 2-core x86_64 VM, 24 GiB, no GPU; torch threads {args.threads}; date {time.strftime('%Y-%m-%d')}")
    print(f"prompts: {source} first, then the built-in set")

    profile = load_profile("sdxl-ac-a100")
    clf = LevelClassifier.new(profile.ids, profile=profile.name)
    print("\n-- level classifier inference (MiniLM-L6, max_length 128) --")
    parti_path = Path(args.shared) / "data/prompts/parti_prompts.tsv"
    sets = [(source, texts)]
    if parti_path.is_file():
        sets.append(("PartiPrompts", list(load_prompts(parti_path).prompts)))
    for name, pool in sets:
        pool = [pool[i] for i in np.random.default_rng(0).permutation(len(pool))]  # a fair mix of lengths
        tokens = np.mean([len(clf.tokenize([p])["input_ids"][0]) for p in pool[:128]])
        for batch in (1, 32):
            batches = [pool[i * batch : (i + 1) * batch] for i in range(8 if batch == 1 else 4)]
            per = median_time(lambda b=batches, k=batch: [clf.predict(x, batch_size=k) for x in b], args.reps)
            n = sum(len(x) for x in batches)
            print(
                f"{name} (mean {tokens:.0f} tokens) batch {batch:>2}: {per / n * 1000:7.2f} ms per prompt, "
                f"{n / per:7.1f} prompts/s"
            )

    with BatchedClassifier(clf, max_batch=32, max_wait_s=0.005) as bc:
        sample = texts[:256]
        t0 = time.perf_counter()
        futs = [bc.submit(p) for p in sample]
        for f in futs:
            f.result()
        dt = time.perf_counter() - t0
        print(
            f"batcher: 256 concurrent prompts in {dt:.2f} s ({256 / dt:.1f} prompts/s), "
            f"{bc.batches} batches (mean {bc.items / bc.batches:.1f})"
        )

    print("\n-- discriminator inference (tf_efficientnetv2_b0, 512 px) --")
    disc = Discriminator.new("tf_efficientnetv2_b0", image_size=512)
    rng = np.random.default_rng(0)
    imgs = [rng.integers(0, 255, (512, 512, 3), dtype=np.uint8) for _ in range(8)]
    for batch in (1, 8):
        per = median_time(lambda b=batch: disc.confidence(imgs[:b], batch_size=b), max(3, args.reps // 2))
        x = disc.preprocess(imgs[:batch])
        with torch.inference_mode():
            net = median_time(lambda x=x: disc.model(x), max(3, args.reps // 2))
        print(f"batch {batch}: {per / batch * 1000:7.1f} ms per image (network alone {net / batch * 1000:.1f} ms)")

    if args.skip_training:
        return 0
    print(f"\n-- training time, frozen encoder + head, {args.epochs} epochs, encoding included --")
    sizes = (500, 1000) if args.quick else (2000, 5000, 10000)
    for n in sizes:
        table = synthetic_quality_table(texts[:n], profile)
        cfg = TrainConfig(mode="head", epochs=args.epochs, patience=args.epochs, progress=False)
        t0 = time.perf_counter()
        _, rep = train_level_classifier(table, config=cfg)
        dt = time.perf_counter() - t0
        print(f"{n:>6} prompts: {dt:7.1f} s (validation accuracy {rep.accuracy:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
