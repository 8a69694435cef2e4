"""Predictors for the control path: demand (EWMA of per-period arrival rates, as DiffServe) and
the affinity histogram H over the last classified prompts (ARGUS §4.2).

Both are plain, deterministic objects (no clock, no I/O) shared by the simulator and the service.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence

from argusdiff.errors import ConfigError

__all__ = ["AffinityHistogram", "EwmaDemand"]


class EwmaDemand:
    """Exponentially weighted moving average of the observed demand (QPM).

    ``alpha`` is the weight of the newest observation. With ``window`` set, only the last
    ``window`` observations count (weights alpha * (1 - alpha)^k, renormalised over the window),
    so a long-gone burst stops influencing the prediction after ``window`` periods. Without a
    window it is the classic recursion ``p <- alpha * x + (1 - alpha) * p`` started at the first
    observation.
    """

    def __init__(self, alpha: float = 0.5, window: int | None = None, initial_qpm: float | None = None):
        if not (0.0 < alpha <= 1.0) or math.isnan(alpha):
            raise ConfigError(f"ewma_alpha: must be in (0, 1], got {alpha}")
        if window is not None and window < 1:
            raise ConfigError(f"window: must be >= 1 periods, got {window}")
        if initial_qpm is not None and not (math.isfinite(initial_qpm) and initial_qpm >= 0):
            raise ConfigError(f"initial_qpm: must be a finite number >= 0, got {initial_qpm}")
        self.alpha = float(alpha)
        self.window = window
        self._history: deque[float] = deque(maxlen=window) if window else deque(maxlen=1)
        self._predicted: float | None = initial_qpm
        self.observations = 0

    @classmethod
    def from_config(cls, config) -> EwmaDemand:
        """From a :class:`argusdiff.config.PredictorConfig`."""
        return cls(alpha=config.ewma_alpha, window=getattr(config, "demand_window", None))

    @property
    def predicted(self) -> float:
        """The current prediction (QPM); 0 before any observation."""
        return 0.0 if self._predicted is None else self._predicted

    def update(self, observed_qpm: float) -> float:
        """Add one period's observed demand (QPM); returns the new prediction."""
        x = float(observed_qpm)
        if not (math.isfinite(x) and x >= 0):
            raise ConfigError(f"observed_qpm: must be a finite number >= 0, got {observed_qpm}")
        self.observations += 1
        if self.window:
            self._history.append(x)
            a = self.alpha
            num = den = 0.0
            for k, value in enumerate(reversed(self._history)):
                w = a * (1.0 - a) ** k
                num += w * value
                den += w
            self._predicted = num / den
        elif self._predicted is None:
            self._predicted = x
        else:
            self._predicted = self.alpha * x + (1.0 - self.alpha) * self._predicted
        return self._predicted

    def update_arrivals(self, arrivals: int, period_s: float) -> float:
        """Add one period given as an arrival count over ``period_s`` seconds."""
        if not period_s > 0:
            raise ConfigError(f"period_s: must be > 0, got {period_s}")
        return self.update(arrivals * 60.0 / period_s)


class AffinityHistogram:
    """H(v): how many of the last ``window`` classified prompts had each optimal level."""

    def __init__(self, level_ids: Sequence[str], window: int = 1000):
        ids = list(level_ids)
        if not ids:
            raise ConfigError("level_ids: at least one level is required")
        if len(set(ids)) != len(ids):
            raise ConfigError(f"level_ids: duplicate ids in {ids}")
        if window < 1:
            raise ConfigError(f"affinity_window: must be >= 1, got {window}")
        self.level_ids = tuple(ids)
        self.window = int(window)
        self._recent: deque[str] = deque(maxlen=self.window)
        self._counts: Counter[str] = Counter()

    @classmethod
    def from_config(cls, level_ids: Sequence[str], config) -> AffinityHistogram:
        return cls(level_ids, window=config.affinity_window)

    def __len__(self) -> int:
        return len(self._recent)

    def add(self, level_id: str) -> None:
        """Record one classified prompt's optimal level."""
        if level_id not in self._counts and level_id not in self.level_ids:
            raise ConfigError(f"unknown level id {level_id!r}; levels: {', '.join(self.level_ids)}")
        if len(self._recent) == self.window:
            old = self._recent[0]
            self._counts[old] -= 1
        self._recent.append(level_id)
        self._counts[level_id] += 1

    def extend(self, level_ids: Iterable[str]) -> None:
        for lv in level_ids:
            self.add(lv)

    def counts(self) -> tuple[int, ...]:
        return tuple(self._counts[lv] for lv in self.level_ids)

    def as_mapping(self) -> dict[str, int]:
        """Counts per level id (the shape of :attr:`argusdiff.domain.ClusterStats.affinity`)."""
        return {lv: self._counts[lv] for lv in self.level_ids}

    def shares(self) -> tuple[float, ...]:
        """H as shares summing to 1; uniform before the first prompt (no information yet)."""
        n = len(self._recent)
        if n == 0:
            return tuple(1.0 / len(self.level_ids) for _ in self.level_ids)
        return tuple(c / n for c in self.counts())

    @staticmethod
    def shares_of(counts: Mapping[str, int], level_ids: Sequence[str]) -> tuple[float, ...]:
        """Shares from a counts mapping (e.g. ``ClusterStats.affinity``), uniform when empty."""
        total = sum(max(0, counts.get(lv, 0)) for lv in level_ids)
        if total == 0:
            return tuple(1.0 / len(level_ids) for _ in level_ids)
        return tuple(max(0, counts.get(lv, 0)) / total for lv in level_ids)
