"""A level classifier ready at start, with no training run: the packaged MiniLM with a linear head
fitted in well under a second on the packaged embeddings of the default prompt set.

The default prompt set (DiffusionDB's first 5,000 prompts, :func:`traces.prompts.diffusiondb_prompts`)
ships with its MiniLM sentence embeddings (:mod:`traces.embeddings`). Labelling each prompt with its
optimal level from a quality table of the profile (``ratio`` × the prompt's best, ARGUS §4.1) and
solving a ridge least-squares problem from the embeddings to the one-hot labels gives a linear
head; put on the MiniLM encoder as a :class:`classifiers.level.LevelClassifier` (``mode`` head,
``pooling`` mean), it classifies any prompt with one encoder pass, shares that pass with the
cache view (:mod:`argusdiff.service.prompt_pass`) and batches, swaps and saves like a trained one.

The head has no bias: the packaged vectors are L2-normalised, the classifier's pooled vectors are
not, and an argmax over ``W x`` does not depend on the length of ``x``.

Labels come from the profile's SYNTHETIC quality table (:mod:`traces.synthetic`) unless a measured
``table`` is given, so the classifier routes by prompt the way the synthetic model says prompts
differ, not by measured image quality: the embedded demo's classifier (``[classifier] fit_at_start``),
reported as such in ``/v1/plan`` and in every response's ``why``. ``argusdiff train-classifier``
trains one on measured quality.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np

from argusdiff.domain import Profile
from classifiers.errors import TrainingDataError
from classifiers.labelling import optimal_labels

__all__ = ["fit_at_start", "fit_linear_head", "holdout_accuracy"]

#: ridge penalty of the head (unit-length 384-d inputs; chosen on a held-out fifth, docs/classifiers.md)
RIDGE = 1.0


def fit_linear_head(vectors: np.ndarray, labels: np.ndarray, n_levels: int, *, ridge: float = RIDGE) -> np.ndarray:
    """``W`` of shape ``(n_levels, dim)`` minimising ``|X Wᵀ - Y|² + ridge |W|²`` for one-hot ``Y``
    (no bias); predictions are ``argmax(W x)``."""
    x = np.asarray(vectors, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if x.ndim != 2 or len(x) != len(y) or len(x) == 0:
        raise TrainingDataError(f"need (n, dim) vectors and n labels, got {x.shape} and {y.shape}")
    if y.min() < 0 or y.max() >= n_levels:
        raise TrainingDataError(f"labels must be in [0, {n_levels}), got {y.min()}..{y.max()}")
    onehot = np.eye(n_levels)[y]
    gram = x.T @ x + ridge * np.eye(x.shape[1])
    return np.linalg.solve(gram, x.T @ onehot).T.astype(np.float32)


def holdout_accuracy(vectors: np.ndarray, labels: np.ndarray, n_levels: int, *, seed: int = 0) -> float:
    """Accuracy on a held-out fifth of a head fitted on the rest (what the report states)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    cut = len(order) * 4 // 5
    fit, held = order[:cut], order[cut:]
    w = fit_linear_head(vectors[fit], labels[fit], n_levels)
    return float(np.mean((vectors[held] @ w.T).argmax(axis=1) == labels[held]))


def _packaged_set() -> tuple[Any, np.ndarray]:
    from traces.embeddings import packaged_vectors, text_key
    from traces.prompts import diffusiondb_prompts

    prompts = diffusiondb_prompts()
    table = packaged_vectors()
    keys = [text_key(p) for p in prompts.prompts]
    found = table.get_many(keys)
    if len(found) < len(set(keys)):
        raise TrainingDataError(
            f"the packaged embeddings ({table.path}) miss {len(set(keys)) - len(found)} of the default prompts: "
            "run scripts/package_embeddings.py"
        )
    return prompts, np.stack([found[k] for k in keys])


def fit_at_start(
    profile: Profile,
    *,
    strategy: str | None = None,
    table: Any = None,
    ratio: float = 0.9,
    max_length: int = 128,
    seed: int = 0,
    precision: str = "float32",
    threads: int | None = None,
) -> Any:
    """A :class:`classifiers.level.LevelClassifier` for ``profile``'s levels: the packaged MiniLM
    with a head fitted on the packaged embeddings of the default prompt set, labelled by ``table``
    (a :class:`traces.quality.QualityTable` over those prompts) or, by default, by the profile's
    synthetic quality table."""
    import torch

    from classifiers.level import LevelClassifier
    from traces.synthetic import synthetic_quality_table

    t0 = time.perf_counter()
    prompts, vectors = _packaged_set()
    if table is None:
        table = synthetic_quality_table(prompts, profile, seed=seed)
    if tuple(table.level_ids) != profile.ids or tuple(table.prompts) != tuple(prompts.prompts):
        raise TrainingDataError(f"the quality table is not over {profile.name}'s levels and the default prompts")
    labels = optimal_labels(table, ratio)
    n = len(profile.ids)
    weights = fit_linear_head(vectors, labels.index, n)
    accuracy = holdout_accuracy(vectors, labels.index, n, seed=seed)
    fit_s = time.perf_counter() - t0  # labels and both fits, not the MiniLM load below
    clf = LevelClassifier.new(
        profile.ids,
        profile=profile.name,
        strategy=strategy,
        ratio=ratio,
        max_length=max_length,
        mode="head",
        pooling="mean",
        seed=seed,
        precision=precision,
        threads=threads,
    )
    head = clf.model.classifier
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(weights).to(head.weight.dtype))
        head.bias.zero_()
    synthetic = bool(getattr(table, "synthetic", False))
    clf.meta = replace(
        clf.meta,
        report={
            "description": (
                f"MiniLM + linear head fitted at start on {len(prompts)} packaged DiffusionDB prompt embeddings, "
                f"labels from {'the SYNTHETIC' if synthetic else 'a measured'} quality table of {profile.name}"
            ),
            "caveat": "fitted at start on SYNTHETIC labels" if synthetic else "fitted at start",
            "prompts": len(prompts),
            "labels": table.source,
            "label_counts": {lv: int(c) for lv, c in zip(profile.ids, labels.counts(), strict=True)},
            "holdout_accuracy": round(accuracy, 4),
            "ridge": RIDGE,
            "fit_s": round(fit_s, 3),
        },
    )
    return clf
