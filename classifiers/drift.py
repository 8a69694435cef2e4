"""Drift-triggered retraining of the level classifier (ARGUS §5.5).

:class:`DriftMonitor` watches the quality of served requests in fixed-size windows and flags drift
when a window's median falls below the moving average of the earlier windows' medians (by more
than a relative ``tolerance``, so a stationary stream's sampling noise does not fire it).

:class:`DriftRetrainer` collects labelled samples (a prompt with its quality at every level), and
after drift retrains the classifier on them (plus an optional base table) in a background thread,
off the request path. The new model is saved (atomically, when a directory is given) and swapped
into the live :class:`ClassifierSlot` or :class:`~classifiers.level.BatchedClassifier` in one step:
a request is classified entirely by the old or entirely by the new model.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from classifiers.errors import ClassifierInputError, TrainingDataError
from traces.quality import QualityTable

__all__ = ["ClassifierSlot", "DriftEvent", "DriftMonitor", "DriftRetrainer", "DriftTrigger", "Swappable"]


@dataclass(frozen=True)
class DriftEvent:
    window: int  # index of the window that drifted (0-based)
    median: float
    baseline: float  # moving average of the earlier windows' medians


class DriftMonitor:
    """Window-median vs moving-average drift detector over a stream of quality scores."""

    def __init__(self, window: int = 500, history: int = 5, tolerance: float = 0.02, min_history: int = 2) -> None:
        if window < 1:
            raise ClassifierInputError(f"window must be >= 1, got {window}")
        if history < 1 or min_history < 1 or min_history > history:
            raise ClassifierInputError(f"need 1 <= min_history <= history, got {min_history}, {history}")
        if tolerance < 0:
            raise ClassifierInputError(f"tolerance must be >= 0, got {tolerance}")
        self.window = window
        self.history = history
        self.tolerance = tolerance
        self.min_history = min_history
        self._current: list[float] = []
        self._medians: deque[float] = deque(maxlen=history)
        self.windows = 0
        self.events: list[DriftEvent] = []
        self.last_median: float | None = None  # of the last completed window

    @classmethod
    def from_config(cls, config: Any) -> DriftMonitor:
        """From a ``ClassifierConfig`` (``drift_window``, ``drift_history``, ``drift_tolerance``)."""
        return cls(
            window=config.drift_window,
            history=config.drift_history,
            tolerance=config.drift_tolerance,
            min_history=min(2, config.drift_history),
        )

    def add(self, quality: float) -> DriftEvent | None:
        """Record one served request's quality; returns a :class:`DriftEvent` when the window
        this completes has drifted."""
        q = float(quality)
        if not np.isfinite(q):
            raise ClassifierInputError(f"quality must be finite, got {quality!r}")
        self._current.append(q)
        if len(self._current) < self.window:
            return None
        median = float(np.median(self._current))
        self.last_median = median
        self._current = []
        event = None
        if len(self._medians) >= self.min_history:
            baseline = float(np.mean(self._medians))
            if median < baseline - self.tolerance * abs(baseline):
                event = DriftEvent(window=self.windows, median=median, baseline=baseline)
                self.events.append(event)
        self._medians.append(median)
        self.windows += 1
        return event

    def extend(self, qualities: Sequence[float]) -> list[DriftEvent]:
        return [e for q in qualities if (e := self.add(q)) is not None]

    def reset(self) -> None:
        """Forget the history (after a retrain the old baseline no longer applies)."""
        self._current = []
        self._medians.clear()


class DriftTrigger:
    """The retraining rule of the live loop (:mod:`argusdiff.service.drift`) and of the replay
    (:mod:`argusdiff.simulator.drift`): each scored sample feeds the :class:`DriftMonitor` and
    collects its prompt; a flagged drift makes a retrain *due* once ``min_samples`` distinct prompts
    have been collected since the last retrain; :meth:`retrained` resets the monitor (the old
    baseline no longer applies) and the collection.
    """

    def __init__(self, monitor: DriftMonitor, min_samples: int, *, max_prompts: int = 10_000) -> None:
        if min_samples < 2:
            raise ClassifierInputError(f"min_samples must be >= 2, got {min_samples}")
        self.monitor = monitor
        self.min_samples = min_samples
        self._prompts: dict[Any, None] = {}  # distinct, oldest first
        self.max_prompts = max(max_prompts, min_samples)
        self.pending = False
        self.events = 0
        self.retrains = 0
        self.last_window: float | None = None  # the median of the last completed window
        self.last_baseline: float | None = None

    def add(self, quality: float, prompt: Any) -> DriftEvent | None:
        event = self.monitor.add(quality)
        self.last_window = self.monitor.last_median
        self._prompts.pop(prompt, None)
        self._prompts[prompt] = None
        if len(self._prompts) > self.max_prompts:
            del self._prompts[next(iter(self._prompts))]
        if event is not None:
            self.pending = True
            self.events += 1
            self.last_baseline = event.baseline
        return event

    @property
    def collected(self) -> int:
        return len(self._prompts)

    def due(self) -> bool:
        return self.pending and len(self._prompts) >= self.min_samples

    def prompts(self, n: int | None = None) -> list[Any]:
        """The ``n`` (default ``min_samples``) most recently collected distinct prompts."""
        keys = list(self._prompts)
        return keys[-(n or self.min_samples) :]

    def retrained(self) -> None:
        self.pending = False
        self.retrains += 1
        self.monitor.reset()
        self._prompts.clear()

    def failed(self) -> None:
        """A retrain failed: wait for the next drift flag (the collection is kept)."""
        self.pending = False


class Swappable(Protocol):
    level_ids: tuple[str, ...]

    def swap(self, classifier: Any) -> Any: ...


class ClassifierSlot:
    """Holds the live classifier; ``swap`` replaces it atomically (for callers not using the batcher)."""

    def __init__(self, classifier: Any) -> None:
        self._classifier = classifier
        self._lock = threading.Lock()
        self.version = 1

    @property
    def classifier(self) -> Any:
        with self._lock:
            return self._classifier

    @property
    def level_ids(self) -> tuple[str, ...]:
        return self.classifier.level_ids

    def swap(self, classifier: Any) -> Any:
        classifier.check_levels(self.level_ids)
        with self._lock:
            old, self._classifier = self._classifier, classifier
            self.version += 1
        return old

    def predict(self, prompts: Sequence[str]) -> list[str]:
        return self.classifier.predict(prompts)


class DriftRetrainer:
    """Collect labelled samples; after drift, retrain off the critical path and swap the model in.

    ``train_fn(table) -> classifier`` trains a new classifier (e.g. a closure over
    :func:`classifiers.train.train_level_classifier` with the deployment's settings). It runs in
    a daemon thread; ``wait()`` joins it. Only one retrain runs at a time.
    """

    def __init__(
        self,
        target: Swappable,
        train_fn: Callable[[QualityTable], Any],
        *,
        monitor: DriftMonitor | None = None,
        base_table: QualityTable | None = None,
        min_samples: int = 500,
        max_samples: int = 10_000,
        save_dir: str | Path | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        if min_samples < 2:
            raise ClassifierInputError(f"min_samples must be >= 2, got {min_samples}")
        self.target = target
        self.train_fn = train_fn
        self.monitor = monitor or DriftMonitor()
        self.level_ids = tuple(target.level_ids)
        if base_table is not None:
            base_table.check_levels(self.level_ids)
        self.base_table = base_table
        self.min_samples = min_samples
        self.save_dir = Path(save_dir) if save_dir else None
        self._samples: deque[tuple[str, tuple[float, ...]]] = deque(maxlen=max_samples)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._say = log or (lambda s: None)
        self.drift_pending = False
        self.retrains = 0
        self.last_error: BaseException | None = None

    # ---- inputs (cheap, called on the serving path) ----------------------------------------

    def observe(self, quality: float) -> bool:
        """Feed one served request's quality; starts a retrain when drift is flagged and enough
        samples are collected. Returns True when a retrain was started."""
        event = self.monitor.add(quality)
        if event is not None:
            self._say(f"drift: window {event.window} median {event.median:.4f} < baseline {event.baseline:.4f}")
            self.drift_pending = True
        return self.maybe_retrain()

    def add_sample(self, prompt: str, scores: Sequence[float]) -> None:
        """A labelled sample: ``prompt`` with its quality at every level (levels order)."""
        if len(scores) != len(self.level_ids):
            raise ClassifierInputError(f"sample has {len(scores)} scores, expected {len(self.level_ids)}")
        with self._lock:
            self._samples.append((prompt, tuple(float(s) for s in scores)))

    @property
    def samples(self) -> int:
        with self._lock:
            return len(self._samples)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ---- retraining ------------------------------------------------------------------------

    def sample_table(self) -> QualityTable:
        with self._lock:
            samples = list(self._samples)
        if len(samples) < 2:
            raise TrainingDataError(f"only {len(samples)} labelled samples collected")
        prompts = tuple(p for p, _ in samples)
        scores = np.array([s for _, s in samples])
        new = QualityTable(
            level_ids=self.level_ids,
            prompt_ids=tuple(f"drift-{i}" for i in range(len(samples))),
            prompts=prompts,
            scores=scores,
            source="labelled samples collected after drift",
        )
        if self.base_table is None:
            return new
        b = self.base_table
        return QualityTable(
            level_ids=self.level_ids,
            prompt_ids=tuple(f"base-{p}" for p in b.prompt_ids) + new.prompt_ids,
            prompts=b.prompts + new.prompts,
            scores=np.concatenate([b.scores, new.scores]),
            metric=b.metric,
            source=f"{b.source} + {len(samples)} samples collected after drift",
            profile=b.profile,
        )

    def maybe_retrain(self) -> bool:
        if not self.drift_pending or self.running or self.samples < self.min_samples:
            return False
        self.drift_pending = False
        table = self.sample_table()
        self._thread = threading.Thread(target=self._retrain, args=(table,), name="classifier-retrain", daemon=True)
        self._thread.start()
        return True

    def _retrain(self, table: QualityTable) -> None:
        try:
            self._say(f"retraining the level classifier on {len(table)} prompts")
            new = self.train_fn(table)
            new.check_levels(self.level_ids)
            if self.save_dir is not None:
                new.save(self.save_dir)
            self.target.swap(new)
            self.monitor.reset()
            self.retrains += 1
            self._say("new level classifier swapped in")
        except BaseException as exc:  # a failed retrain keeps the old model serving
            self.last_error = exc
            self._say(f"retraining failed, keeping the current classifier: {exc}")

    def wait(self, timeout: float | None = None) -> bool:
        """Join a running retrain; True when none is running afterwards."""
        t = self._thread
        if t is not None:
            t.join(timeout)
        return not self.running
