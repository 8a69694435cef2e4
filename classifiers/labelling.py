"""Training labels of the prompt → level classifier (ARGUS §4.1).

A prompt's *optimal level* is the fastest level whose quality is at least ``ratio`` × the
prompt's best quality over all levels (levels are ordered slowest/best first, so the label is
the largest acceptable level index). ``ratio`` is 0.9 in ARGUS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from classifiers.errors import TrainingDataError
from traces.quality import QualityTable

__all__ = ["Labels", "optimal_labels", "routing_quality", "select_levels"]

DEFAULT_RATIO = 0.9


@dataclass(frozen=True)
class Labels:
    """Per-prompt optimal level indices (into ``level_ids``) of a quality table."""

    level_ids: tuple[str, ...]
    index: np.ndarray  # int64, shape (n_prompts,)
    ratio: float

    def ids(self) -> list[str]:
        return [self.level_ids[i] for i in self.index]

    def counts(self) -> np.ndarray:
        return np.bincount(self.index, minlength=len(self.level_ids))


def optimal_labels(table: QualityTable, ratio: float = DEFAULT_RATIO) -> Labels:
    """Each prompt's optimal level (``table.optimal_levels(ratio)``) as a :class:`Labels`."""
    return Labels(level_ids=table.level_ids, index=table.optimal_levels(ratio), ratio=float(ratio))


def select_levels(table: QualityTable, level_ids: Sequence[str]) -> QualityTable:
    """The table restricted to ``level_ids`` (in that order), e.g. the levels of one strategy."""
    cols = [table.level_index(lv) for lv in level_ids]
    if len(cols) < 2:
        raise TrainingDataError(f"a level classifier needs at least 2 levels, got {list(level_ids)}")
    return QualityTable(
        level_ids=tuple(level_ids),
        prompt_ids=table.prompt_ids,
        prompts=table.prompts,
        scores=table.scores[:, cols],
        metric=table.metric,
        source=table.source,
        synthetic=table.synthetic,
        profile=table.profile,
    )


def routing_quality(scores: np.ndarray, predicted: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Mean quality of serving each prompt at the predicted level vs random levels vs the oracle.

    ``scores``: (n, m) raw quality per prompt and level; ``predicted``/``labels``: level indices.
    ``random`` is the exact expectation of a uniformly random level per prompt; ``oracle`` serves
    each prompt at its optimal level; ``best`` serves every prompt at level 0. The ``*_level``
    entries are mean level indices (higher = faster), the cost side of the same trade-off.
    """
    scores = np.asarray(scores, dtype=np.float64)
    rows = np.arange(len(scores))
    predicted = np.asarray(predicted, dtype=np.int64)
    labels = np.asarray(labels, dtype=np.int64)
    m = scores.shape[1]
    return {
        "classifier": float(scores[rows, predicted].mean()),
        "random": float(scores.mean()),
        "oracle": float(scores[rows, labels].mean()),
        "best": float(scores[:, 0].mean()),
        "classifier_level": float(predicted.mean()),
        "random_level": (m - 1) / 2.0,
        "oracle_level": float(labels.mean()),
        "too_fast": float(np.mean(predicted > labels)),  # served below the quality bar
        "too_slow": float(np.mean(predicted < labels)),  # wasted compute
    }
