"""Where a policy's predicted optimal level comes from.

ARGUS §4.1 classifies each prompt into its *optimal level* (the fastest level whose quality is at
least 0.9 × the prompt's best). The trained model is :class:`classifiers.level.LevelClassifier`;
when it is not available the simulator uses :class:`OracleClassifier`, a stand-in that reads the
answer from the quality table and then errs with a stated confusion rate. Every report names which
one was used (``description``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from argusdiff.errors import ConfigError

__all__ = ["OracleClassifier", "describe_classifier", "predict_level_indices"]


class OracleClassifier:
    """Quality-table oracle with a confusion rate.

    With probability ``confusion`` a prompt's prediction is moved to an adjacent level (one level
    faster or slower, chosen uniformly, clipped at the ends); otherwise it is the table's optimal
    level at ``ratio``. Predictions are fixed per prompt for a seed (a classifier is deterministic).
    """

    def __init__(self, table: Any, *, confusion: float = 0.0, ratio: float = 0.9, seed: int = 0) -> None:
        if not 0.0 <= confusion <= 1.0:
            raise ConfigError(f"classifier confusion must be in [0, 1], got {confusion}")
        self.table = table
        self.level_ids: tuple[str, ...] = tuple(table.level_ids)
        self.confusion = float(confusion)
        self.ratio = ratio
        rng = np.random.default_rng([seed, 7919])
        optimal = np.asarray(table.optimal_levels(ratio), dtype=np.int64)
        n = len(self.level_ids)
        wrong = rng.random(optimal.shape[0]) < self.confusion
        step = np.where(rng.random(optimal.shape[0]) < 0.5, -1, 1)
        moved = optimal + step
        # at the ends the only neighbour is the other side
        moved = np.where(moved < 0, 1, moved)
        moved = np.where(moved >= n, n - 2, moved)
        moved = np.clip(moved, 0, n - 1)
        self.predicted = np.where(wrong, moved, optimal).astype(np.int64)
        self.optimal = optimal
        self._row = {p: i for i, p in enumerate(table.prompts)}

    @property
    def description(self) -> str:
        return f"oracle stand-in (quality table, {self.confusion:.0%} confusion to an adjacent level)"

    @property
    def accuracy(self) -> float:
        return float(np.mean(self.predicted == self.optimal)) if len(self.optimal) else 1.0

    def predict_indices(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        return self.predicted[np.asarray(rows, dtype=np.int64)]

    def predict(self, prompts: Sequence[str]) -> list[str]:
        out = []
        for p in prompts:
            try:
                out.append(self.level_ids[self.predicted[self._row[p]]])
            except KeyError:
                raise ConfigError(f"oracle classifier: prompt {p[:60]!r} is not in the quality table") from None
        return out


def describe_classifier(classifier: Any) -> str:
    if classifier is None:
        return "none"
    desc = getattr(classifier, "description", None)
    if desc:
        return str(desc)
    return f"trained {type(classifier).__module__}.{type(classifier).__name__}"


def predict_level_indices(classifier: Any, prompts: Sequence[str], level_ids: Sequence[str]) -> np.ndarray:
    """Predicted optimal level index per prompt (rows of the prompt set), once per prompt."""
    if isinstance(classifier, OracleClassifier):
        return classifier.predict_indices(np.arange(len(prompts)))
    labels = classifier.predict(list(prompts))
    index = {lv: i for i, lv in enumerate(level_ids)}
    out = np.empty(len(labels), dtype=np.int64)
    for i, lv in enumerate(labels):
        if lv not in index:
            raise ConfigError(
                f"classifier predicts level {lv!r}, which the profile does not have (levels: {', '.join(level_ids)})"
            )
        out[i] = index[lv]
    return out
