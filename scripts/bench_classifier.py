#!/usr/bin/env python
"""Classifier and discriminator speed on this CPU (for docs/benchmarks.md, "Classifiers").

* level classifier (packaged MiniLM, 6 layers, width 384, a head trained on synthetic AC labels):
  held-out accuracy / agreement of float32, bfloat16 and int8 inference; per-prompt latency and
  prompts/s at batch 1 and 32 of the previous path (one padded batch, float32) and of length
  buckets x precision x threads, all variants interleaved in each repetition (medians, ratios);
* the live batcher (BatchedClassifier, max batch 32) under 256 concurrent submissions;
* discriminator (tf_efficientnetv2_b0, random weights: speed only) latency per image at 512 px,
  batch 1 and 8;
* training time (frozen encoder + head, fixed epochs, no early stop) for 2k / 5k / 10k prompts
  of the synthetic AC table, encoding included.

Usage: python scripts/bench_classifier.py [--threads 1] [--reps 5] [--shared ../shared] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
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


def bench_discriminator(Discriminator, args, torch) -> None:
    """Latency per image of the cascade's discriminator at 512 px, batch 1 and 8, on ``--device``:
    preprocessing included, then the network alone (synchronised on CUDA)."""
    cuda = args.device.startswith("cuda")
    where = f"{args.device} {torch.cuda.get_device_name(torch.device(args.device))}" if cuda else args.device
    print(f"\n-- discriminator inference (tf_efficientnetv2_b0, 512 px, float32, {where}) --")
    disc = Discriminator.new("tf_efficientnetv2_b0", image_size=512, device=args.device)
    rng = np.random.default_rng(0)
    imgs = [rng.integers(0, 255, (512, 512, 3), dtype=np.uint8) for _ in range(8)]
    reps = max(3, args.reps // 2) if not cuda else max(10, args.reps)

    def network(x):
        disc.model(x)
        if cuda:
            torch.cuda.synchronize()

    for batch in (1, 8):
        per = median_time(lambda b=batch: disc.confidence(imgs[:b], batch_size=b), reps)
        x = disc.preprocess(imgs[:batch]).to(args.device)
        with torch.inference_mode():
            net = median_time(lambda x=x: network(x), reps)
        print(f"batch {batch}: {per / batch * 1000:7.1f} ms per image (network alone {net / batch * 1000:.1f} ms)")


def one_batch_profile(clf, batch, reps, torch, median_time) -> None:
    """Where one batch's time goes: tokenizer, padding, encoder (float32, the current threads)."""
    from classifiers.level import BUCKET_OVERHEAD_TOKENS, length_buckets

    print(f"\n-- one batch of {len(batch)} prompts, float32, {torch.get_num_threads()} thread(s) --")
    tok_s = median_time(lambda: clf.tokenize(batch), reps)
    enc = clf.tokenize(batch)
    real = int(enc["attention_mask"].sum())
    padded = enc["input_ids"].numel()
    with torch.inference_mode():
        fwd_s = median_time(lambda: clf.forward(enc), reps)
    lengths = sorted(len(x) for x in clf.tokenizer(batch, truncation=True, max_length=clf.meta.max_length)["input_ids"])
    buckets = length_buckets(lengths, BUCKET_OVERHEAD_TOKENS)
    bucketed = sum((hi - lo) * lengths[hi - 1] for lo, hi in buckets)
    total_s = median_time(lambda: clf.logits(batch, batch_size=len(batch)), reps)
    print(f"tokenizer (fast, whole batch, padded): {tok_s * 1000:6.1f} ms ({tok_s / len(batch) * 1000:.2f} ms/prompt)")
    print(
        f"one padded batch: {padded} token slots for {real} real tokens ({100 * (1 - real / padded):.0f}% padding); "
        f"encoder {fwd_s * 1000:.0f} ms ({fwd_s / len(batch) * 1000:.2f} ms/prompt)"
    )
    print(
        f"length buckets: {len(buckets)} forwards, {bucketed} token slots "
        f"({100 * (1 - real / bucketed):.0f}% padding); "
        f"whole call {total_s * 1000:.0f} ms ({total_s / len(batch) * 1000:.2f} ms/prompt)"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch threads outside the thread-count variants")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    ap.add_argument("--epochs", type=int, default=10, help="epochs in the training-time runs")
    ap.add_argument("--skip-training", action="store_true", help="inference only")
    ap.add_argument("--profile-only", action="store_true", help="only where one batch of 32 spends its time")
    ap.add_argument("--discriminator-only", action="store_true", help="only the discriminator's inference")
    ap.add_argument("--device", default="cpu", help="where the discriminator runs: cpu (default), cuda, ...")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from argusdiff.profile import load_profile
    from classifiers.discriminator import Discriminator
    from classifiers.labelling import optimal_labels, routing_quality
    from classifiers.level import BatchedClassifier, LevelClassifier, native_bf16, torch_threads
    from classifiers.train import TrainConfig, train_level_classifier
    from traces.prompts import builtin_prompts, load_prompts
    from traces.synthetic import synthetic_quality_table

    ddb_path = Path(args.shared) / "data/prompts/diffusiondb_2m_first_5k.txt"
    texts = list(load_prompts(ddb_path).prompts) if ddb_path.is_file() else []
    source = "DiffusionDB" if texts else "built-in generated"
    texts += list(builtin_prompts().prompts)
    print(f"machine: {os.cpu_count()} CPUs; torch threads {args.threads}; date {time.strftime('%Y-%m-%d')}")
    print(f"prompts: {source} first, then the built-in set")

    if args.discriminator_only:
        bench_discriminator(Discriminator, args, torch)
        return 0
    profile = load_profile("sdxl-ac-a100")
    parti_path = Path(args.shared) / "data/prompts/parti_prompts.tsv"

    if args.profile_only:
        clf = LevelClassifier.new(profile.ids, profile=profile.name)
        pool = [texts[i] for i in np.random.default_rng(0).permutation(len(texts))]
        one_batch_profile(clf, pool[:32], args.reps, torch, median_time)
        return 0

    # a trained head (frozen MiniLM) so that precision modes are compared on real decisions
    n_train, n_test = (800, 400) if args.quick else (3000, 1000)
    table = synthetic_quality_table(texts[: n_train + n_test], profile)
    print(f"\n-- inference precision: head trained on {n_train} prompts, held-out {n_test} (synthetic AC labels) --")
    t0 = time.perf_counter()
    trained, _ = train_level_classifier(
        table.subset(np.arange(n_train)),
        config=TrainConfig(mode="head", epochs=args.epochs, patience=args.epochs, progress=False),
        profile=profile.name,
    )
    print(f"training: {time.perf_counter() - t0:.1f} s")
    held = table.subset(np.arange(n_train, n_train + n_test))
    truth = optimal_labels(held, 0.9).index
    model_dir = Path(tempfile.mkdtemp(prefix="bench-clf-"))
    trained.save(model_dir)
    clfs = {prec: LevelClassifier.load(model_dir, precision=prec) for prec in ("float32", "bfloat16", "int8")}
    print(f"native bf16 on this CPU: {native_bf16()}")
    ref = clfs["float32"].predict_index(list(held.prompts), batch_size=32)
    base_q = routing_quality(held.scores, ref, truth)["classifier"]
    for prec, c in clfs.items():
        pred = c.predict_index(list(held.prompts), batch_size=32)
        q = routing_quality(held.scores, pred, truth)["classifier"]
        print(
            f"{prec:>8}: held-out accuracy {np.mean(pred == truth) * 100:5.1f}% "
            f"(float32 {np.mean(ref == truth) * 100:5.1f}%), "
            f"agreement with float32 {np.mean(pred == ref) * 100:5.1f}%, "
            f"routing quality {q:.3f} (float32 {base_q:.3f})"
        )

    def legacy(c, prompts):
        """The previous inference path: sort the call's prompts, one padded batch, float32."""
        order = np.argsort([len(p) for p in prompts], kind="stable")
        with torch.inference_mode():
            return c.forward(c.tokenize([prompts[i] for i in order])).numpy()

    def bucketed(c, prompts):
        return c.predict(prompts, batch_size=len(prompts))

    variants = [
        ("before: one padded batch, float32, 1 thread", clfs["float32"], legacy, 1),
        ("length buckets, float32, 1 thread", clfs["float32"], bucketed, 1),
        ("length buckets, int8, 1 thread", clfs["int8"], bucketed, 1),
        ("length buckets, bfloat16, 1 thread", clfs["bfloat16"], bucketed, 1),
        ("length buckets, float32, 2 threads", clfs["float32"], bucketed, 2),
        ("length buckets, bfloat16, 2 threads", clfs["bfloat16"], bucketed, 2),
    ]
    print("\n-- level classifier inference (MiniLM-L6, max_length 128); variants interleaved per repetition --")
    sets = [(source, texts[n_train + n_test :] or texts)]
    if parti_path.is_file():
        sets.append(("PartiPrompts", list(load_prompts(parti_path).prompts)))
    clf = clfs["float32"]
    for name, pool in sets:
        pool = [pool[i] for i in np.random.default_rng(0).permutation(len(pool))]  # a fair mix of lengths
        tokens = np.mean([len(clf.tokenize([p])["input_ids"][0]) for p in pool[:128]])
        for batch in (1, 32):
            batches = [pool[i * batch : (i + 1) * batch] for i in range(16 if batch == 1 else 4)]
            n = sum(len(x) for x in batches)
            times: dict[str, list[float]] = {v[0]: [] for v in variants}
            for rep in range(args.reps + 1):  # repetition 0 is the warm-up
                for label, c, fn, threads in variants:
                    with torch_threads(threads):
                        t0 = time.perf_counter()
                        for x in batches:
                            fn(c, x)
                        dt = time.perf_counter() - t0
                    if rep:
                        times[label].append(dt)
            base = statistics.median(times[variants[0][0]])
            print(f"{name} (mean {tokens:.0f} tokens), batch {batch}:")
            for label, *_ in variants:
                per = statistics.median(times[label])
                print(
                    f"  {label:<44} {per / n * 1000:7.2f} ms per prompt, {n / per:7.1f} prompts/s, "
                    f"x{base / per:4.2f} vs before"
                )
    shutil.rmtree(model_dir, ignore_errors=True)

    for prec in ("float32", "bfloat16"):
        with BatchedClassifier(clfs[prec], max_batch=32, max_wait_s=0.005) as bc:
            sample = texts[:256]
            t0 = time.perf_counter()
            futs = [bc.submit(p) for p in sample]
            for f in futs:
                f.result()
            dt = time.perf_counter() - t0
            print(
                f"batcher ({prec}, {torch.get_num_threads()} thread(s)): 256 concurrent prompts in {dt:.2f} s "
                f"({256 / dt:.1f} prompts/s), {bc.batches} batches (mean {bc.items / bc.batches:.1f})"
            )

    bench_discriminator(Discriminator, args, torch)
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
