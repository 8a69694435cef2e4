#!/usr/bin/env python
"""Train and evaluate the level classifier on real prompts (results for docs/classifiers.md).

1. For each strategy (AC: sdxl-ac-a100, SM: sm-a100): the SYNTHETIC quality table
   (``traces.synthetic.synthetic_quality_table``, calibrated to ARGUS) over the first 5,000
   DiffusionDB prompts; train the MiniLM classifier (frozen encoder + head); report held-out
   accuracy and mean quality when routing by the classifier vs random vs the oracle.
2. PartiPrompts ``Challenge`` labels (human difficulty): mean predicted level per challenge class
   (the AC classifier from step 1, applied to all 1,632 Parti prompts), next to the synthetic
   table's own optimal level for those prompts.
3. DiffServe's open question, a query-based router: predict from the prompt alone whether the
   light model's image passes the discriminator. ``confidence_scores.csv`` has no prompt text;
   this step pairs ``content_id`` i with the i-th DiffusionDB prompt (an ASSUMPTION the artifact
   does not document) and compares against the same model trained on shuffled labels.

Usage: python scripts/eval_classifier.py [--shared ../shared] [--n 5000] [--json out.json] [--full]
Reads ../shared (third-party data; not shipped). Prints a text report and optionally JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CHALLENGE_ORDER = None  # printed in order of mean predicted level


def _feature_probe(table, cfg) -> dict:
    """A reference: multinomial logistic regression on the synthetic generator's own text features
    (what the table's tolerance is partly computed from), same split and labels."""
    import torch

    from classifiers.labelling import optimal_labels, routing_quality
    from classifiers.train import split_by_prompt
    from traces.synthetic import prompt_features

    y = optimal_labels(table, cfg.ratio).index
    tr, va = split_by_prompt(table.prompts, cfg.val_fraction, cfg.seed)
    x = torch.tensor(prompt_features(table.prompts), dtype=torch.float32)
    x = (x - x[tr].mean(0)) / (x[tr].std(0) + 1e-6)
    yt = torch.as_tensor(y)
    torch.manual_seed(cfg.seed)
    lin = torch.nn.Linear(x.shape[1], len(table.level_ids))
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-2)
    loss = torch.nn.CrossEntropyLoss()
    best, pred = float("inf"), None
    for _ in range(500):  # full batch; keep the epoch with the lowest validation loss
        opt.zero_grad()
        loss(lin(x[tr]), yt[tr]).backward()
        opt.step()
        with torch.no_grad():
            v = float(loss(lin(x[va]), yt[va]))
            if v < best:
                best, pred = v, lin(x[va]).argmax(1).numpy()
    r = routing_quality(table.scores[va], pred, y[va])
    return {"accuracy": float(np.mean(pred == y[va])), **r}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    ap.add_argument("--n", type=int, default=5000, help="DiffusionDB prompts to use")
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--full", action="store_true", help="also fine-tune the whole MiniLM (slow on CPU)")
    ap.add_argument("--full-n", type=int, default=2000, help="prompts for the full fine-tune")
    ap.add_argument(
        "--ablation", action="store_true", help="only the AC ablation: [CLS] pooling, class weighting (head mode)"
    )
    ap.add_argument("--json", help="write all results to this JSON file")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from argusdiff.profile import load_profile
    from classifiers.labelling import routing_quality
    from classifiers.train import TrainConfig, train_level_classifier
    from traces.prompts import load_prompts
    from traces.quality import QualityTable
    from traces.synthetic import synthetic_quality_table

    shared = Path(args.shared)
    ddb = load_prompts(shared / "data/prompts/diffusiondb_2m_first_5k.txt").head(args.n)
    parti = load_prompts(shared / "data/prompts/parti_prompts.tsv")
    results: dict = {
        "machine": "2-core x86_64 VM, 24 GiB, no GPU",
        "date": time.strftime("%Y-%m-%d"),
        "prompts": {"diffusiondb": len(ddb), "parti": len(parti)},
    }
    print(f"DiffusionDB prompts: {len(ddb)}; PartiPrompts: {len(parti)}")

    if args.ablation:
        profile = load_profile("sdxl-ac-a100")
        table = synthetic_quality_table(ddb, profile, seed=args.seed)
        print("\n== AC ablation (head mode, synthetic table): held-out mean quality ==")
        print("(the default, mean pooling without class weighting, is the AC run of the full script)")
        rows = {}
        for name, kw in (
            ("[CLS] pooling", {"pooling": "cls"}),
            ("mean pooling + class weighting", {"class_weighting": True}),
        ):
            cfg = TrainConfig(mode="head", epochs=args.epochs, patience=5, seed=args.seed, progress=False, **kw)
            _, rep = train_level_classifier(table, config=cfg, profile=profile.name, strategy="ac")
            r = rep.routing
            rows[name] = {"accuracy": rep.accuracy, **r}
            print(
                f"{name:<32} accuracy {rep.accuracy:.3f}  classifier {r['classifier']:.3f}  random {r['random']:.3f}  "
                f"oracle {r['oracle']:.3f}  below the bar {r['too_fast']:.1%}"
            )
        results["ablation_ac"] = rows
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2, default=float))
        return 0

    # ---- 1. routing quality on held-out prompts, per strategy --------------------------------
    classifiers = {}
    for strategy, profile_name in (("ac", "sdxl-ac-a100"), ("sm", "sm-a100")):
        profile = load_profile(profile_name)
        table = synthetic_quality_table(ddb, profile, seed=args.seed)
        cfg = TrainConfig(mode="head", epochs=args.epochs, patience=5, seed=args.seed, progress=False)
        clf, rep = train_level_classifier(table, config=cfg, profile=profile.name, strategy=strategy)
        classifiers[strategy] = (clf, profile, table)
        ref = _feature_probe(table, cfg)
        print(
            f"reference: linear model on the generator's own 10 text features (traces.synthetic.prompt_features): "
            f"accuracy {ref['accuracy']:.3f}, mean quality {ref['classifier']:.4f}"
        )
        print(f"\n== {strategy.upper()} ({profile.name}), SYNTHETIC quality table, mode head ==")
        print(rep.format())
        results[strategy] = {k: v for k, v in rep.to_dict().items() if k != "history"}
        results[strategy]["feature_probe"] = ref
        if args.full:
            sub = table.subset(np.arange(min(args.full_n, len(table))))
            fcfg = TrainConfig(mode="full", epochs=4, patience=2, seed=args.seed, progress=False, batch_size=32)
            _, frep = train_level_classifier(sub, config=fcfg, profile=profile.name, strategy=strategy)
            print(f"-- full fine-tune on {len(sub)} prompts --")
            print(frep.format())
            results[f"{strategy}_full"] = {k: v for k, v in frep.to_dict().items() if k != "history"}

    # ---- 2. PartiPrompts challenge ordering ----------------------------------------------------
    clf, profile, _ = classifiers["ac"]
    pred = clf.predict_index(list(parti.prompts))
    ptable = synthetic_quality_table(parti, profile, seed=args.seed)
    opt = ptable.optimal_levels(clf.meta.ratio)
    challenges = np.array(parti.challenges, dtype=object)
    rows = []
    for c in sorted(set(parti.challenges)):
        mask = challenges == c
        rows.append(
            {
                "challenge": c,
                "prompts": int(mask.sum()),
                "mean_predicted_level": round(float(pred[mask].mean()), 3),
                "mean_synthetic_optimal_level": round(float(opt[mask].mean()), 3),
                "share_predicted_best": round(float((pred[mask] == 0).mean()), 3),
            }
        )
    rows.sort(key=lambda r: r["mean_predicted_level"])
    from scipy.stats import spearmanr

    rho = spearmanr([r["mean_predicted_level"] for r in rows], [r["mean_synthetic_optimal_level"] for r in rows])
    print("\n== PartiPrompts Challenge (AC classifier; level 0 = best/slowest, 5 = fastest) ==")
    print(f"{'challenge':<28}{'n':>6}{'pred level':>12}{'synth opt':>11}{'pred best':>11}")
    for r in rows:
        print(
            f"{r['challenge']:<28}{r['prompts']:>6}{r['mean_predicted_level']:>12.2f}"
            f"{r['mean_synthetic_optimal_level']:>11.2f}{r['share_predicted_best']:>11.2f}"
        )
    print(f"Spearman rank correlation of the two columns over classes: {rho.statistic:.2f}")
    parti_routing = routing_quality(ptable.scores, pred, opt)
    print(
        "Parti prompts (out of domain for training), synthetic table: classifier "
        f"{parti_routing['classifier']:.3f}, random {parti_routing['random']:.3f}, oracle {parti_routing['oracle']:.3f}"
    )
    results["parti"] = {"by_challenge": rows, "spearman": float(rho.statistic), "routing": parti_routing}

    # ---- 3. query-based router on DiffServe confidences ---------------------------------------
    from classifiers.discriminator import roc_auc
    from traces.diffserve import load_confidences

    conf = load_confidences(shared / "data/diffserve/confidence_scores.csv")
    n = min(len(conf), len(ddb))
    light = conf.light[:n]
    t = float(np.median(light))
    passes = light >= t
    prompts = list(ddb.prompts[:n])

    def table_for(labels: np.ndarray) -> QualityTable:
        # 2 "levels": heavy (sdv15) first, light (sdturbo): light is optimal iff its image passes
        scores = np.where(labels[:, None], [[1.0, 1.0]], [[1.0, 0.5]])
        return QualityTable(
            level_ids=("sdv15", "sdturbo"),
            prompt_ids=tuple(f"q{i}" for i in range(n)),
            prompts=tuple(prompts),
            scores=scores,
            source="confidence_scores.csv light >= median",
        )

    qr = {}
    rng = np.random.default_rng(args.seed)
    for name, labels in (("aligned", passes), ("shuffled", rng.permutation(passes))):
        cfg = TrainConfig(mode="head", epochs=args.epochs, patience=5, seed=args.seed, progress=False)
        tab = table_for(labels)
        from classifiers.train import split_by_prompt

        qclf, qrep = train_level_classifier(tab, config=cfg)
        _, val_rows = split_by_prompt(tab.prompts, cfg.val_fraction, cfg.seed)
        proba = qclf.predict_proba([prompts[i] for i in val_rows])[:, 1]
        y = labels[val_rows]
        auc = roc_auc(proba[y], proba[~y])
        qr[name] = {"val_auc": auc, "val_accuracy": qrep.accuracy, "n_val": len(val_rows)}
    print("\n== Query-based router: does the SD-Turbo image pass (confidence >= median)? from text alone ==")
    print(f"threshold t = {t:.3f} (median light confidence, {n} queries)")
    print("content_id i <-> DiffusionDB prompt i is ASSUMED (the artifact does not record the prompts)")
    for name, r in qr.items():
        print(
            f"{name:<9} labels: held-out ROC-AUC {r['val_auc']:.3f}, accuracy {r['val_accuracy']:.3f} (n={r['n_val']})"
        )
    results["query_router"] = {"threshold": t, "n": n, **qr}

    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=float))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
