"""Measure a :class:`~traces.quality.QualityTable`: generate every prompt at every level with the
workers' executors and score each image with a quality scorer (PickScore-style or CLIPScore).

This is the "prompt set + profile" input of ``argusdiff train-classifier``. Each prompt gets the
same seed at every level (``seed + row``), so the levels are compared on the same noise.

Levels of the ``sm`` and ``cascade`` strategies run their own model for all steps and are measured
directly. ``ac`` levels are refused: the quality of level K depends on *which* cached prompt's
latent a request resumes from (its nearest earlier prompt), which needs a latent cache warmed with
other prompts than the one measured; measure AC quality with the cache in place and pass the
resulting table instead.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from argusdiff.domain import Profile, Strategy
from classifiers.errors import TrainingDataError
from traces.quality import QualityTable

__all__ = ["generate_images", "measure_quality_table"]


def measure_quality_table(
    prompts: Any,
    profile: Profile,
    scorer: Any,
    executor_for: Callable[[str], Any],
    *,
    seed: int = 0,
    batch_size: int = 1,
    progress: bool = True,
    level_ids: Sequence[str] | None = None,
    warm_cache: bool = False,
) -> QualityTable:
    """Scores of ``prompts`` (a ``PromptSet`` or strings) at ``profile``'s levels (or ``level_ids``).

    ``warm_cache``: the executors' latent cache is warm with other prompts (the live drift loop),
    so ``ac`` levels are measured as they serve; otherwise they are refused (module doc).

    ``executor_for(level_id)`` returns a ``workers`` ``LevelExecutor`` (e.g.
    ``workers.executor.ExecutorFactory(profile, registry)``); ``scorer.score(prompts, images)``
    returns one score per image (``classifiers.scorers``).
    """
    from PIL import Image
    from tqdm.auto import tqdm

    from workers.messages import WorkItem

    texts = list(getattr(prompts, "prompts", prompts))
    ids = tuple(getattr(prompts, "ids", ())) or tuple(f"p{i}" for i in range(len(texts)))
    if not texts:
        raise TrainingDataError("no prompts to measure")
    if batch_size < 1:
        raise TrainingDataError(f"batch_size must be >= 1, got {batch_size}")
    levels = [profile.level(lv) for lv in (level_ids or profile.ids)]
    ac = [lv.id for lv in levels if lv.strategy is Strategy.AC]
    if ac and not warm_cache:
        raise TrainingDataError(
            f"level(s) {ac} use approximate caching: their quality depends on the warmed latent cache; "
            "measure them with the cache in place and pass a quality table (--table)"
        )
    scores = np.zeros((len(texts), len(levels)))
    bar = tqdm(total=len(texts) * len(levels), desc="generating + scoring", unit="img", disable=not progress)
    try:
        for j, level in enumerate(levels):
            executor = executor_for(level.id)
            for start in range(0, len(texts), batch_size):
                rows = range(start, min(start + batch_size, len(texts)))
                items = [
                    WorkItem(request_id=f"measure-{level.id}-{i}", prompt=texts[i], level=level.id, seed=seed + i)
                    for i in rows
                ]
                results = executor.run(items)
                images = []
                for i, res in zip(rows, results, strict=True):
                    if not res.ok:
                        raise TrainingDataError(f"prompt {ids[i]!r} at level {level.id!r} failed: {res.error}")
                    with Image.open(io.BytesIO(res.image_png)) as im:
                        images.append(im.convert("RGB"))
                scores[list(rows), j] = scorer.score([texts[i] for i in rows], images)
                bar.update(len(items))
    finally:
        bar.close()
    return QualityTable(
        level_ids=tuple(lv.id for lv in levels),
        prompt_ids=ids,
        prompts=tuple(texts),
        scores=np.maximum(scores, 1e-6),  # relative quality needs positive scores
        metric=getattr(scorer, "metric", "score"),
        source=f"measured: generated with {profile.name} levels, seed {seed}, scored by {type(scorer).__name__}",
        synthetic=False,
        profile=profile.name,
    )


def generate_images(
    prompts: Any,
    level_id: str,
    executor_for: Callable[[str], Any],
    *,
    seed: int = 0,
    batch_size: int = 1,
    progress: bool = True,
) -> list[Any]:
    """Generate each prompt once at ``level_id`` (seed ``seed + row``); PIL images in order.

    Used to build the *generated* side of a discriminator's training set from a prompt set.
    """
    from PIL import Image
    from tqdm.auto import tqdm

    from workers.messages import WorkItem

    texts = list(getattr(prompts, "prompts", prompts))
    if not texts:
        raise TrainingDataError("no prompts to generate")
    executor = executor_for(level_id)
    images = []
    for start in tqdm(range(0, len(texts), batch_size), desc=f"generating {level_id}", disable=not progress):
        rows = range(start, min(start + batch_size, len(texts)))
        items = [
            WorkItem(request_id=f"gen-{level_id}-{i}", prompt=texts[i], level=level_id, seed=seed + i) for i in rows
        ]
        for i, res in zip(rows, executor.run(items), strict=True):
            if not res.ok:
                raise TrainingDataError(f"prompt {i} at level {level_id!r} failed: {res.error}")
            with Image.open(io.BytesIO(res.image_png)) as im:
                images.append(im.convert("RGB"))
    return images
