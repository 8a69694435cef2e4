"""ARGUS §4.1 drift retraining, live: score a sample of served images off the critical path, flag
drift when a window's median quality falls below the moving average of the earlier windows'
medians, retrain the level classifier on the prompts collected meanwhile and swap it in.

The request path pays one random draw per served image (:meth:`DriftLoop.observe`, called by the
dispatch as each result arrives) and, for a sampled one, a ``put_nowait`` on a bounded queue (a
full queue drops the sample and counts it). Everything else runs on the loop's own thread:

1. **score**: the PickScore-style (or CLIPScore) scorer of :mod:`classifiers.scorers` rates the
   sampled (prompt, image) pairs;
2. **detect**: each score feeds :class:`classifiers.drift.DriftTrigger` (the
   :class:`~classifiers.drift.DriftMonitor`'s window-median vs moving-average rule, the same rule
   the replay applies, :mod:`argusdiff.simulator.drift`), which also collects the sampled prompts;
3. **label**: once drift is flagged and ``drift_min_samples`` distinct prompts are collected, the
   most recent ones are generated at every level of the classifier with the service's executors
   and scored (:func:`classifiers.measure.measure_quality_table`, approximate-caching levels resume
   from the live cache), as ARGUS regenerates ~3.5k images per retrain;
4. **retrain**: a new classifier is trained on that table with the ``[classifier]`` training
   settings (:func:`classifiers.train.train_level_classifier`), saved atomically to
   ``drift_save_dir`` when set, and swapped into the live
   :class:`~classifiers.level.BatchedClassifier` (or the one-pass
   :class:`~argusdiff.service.prompt_pass.PromptPass`, which reads the same holder) between two
   batches: a request is classified wholly by the old or wholly by the new model, and none fails.

A failed label or retrain keeps the serving classifier and waits for the next drift flag. The
retrain count, the last window's median quality, the baseline it was compared with and the
classifier version are on ``/metrics`` (``argusdiff_classifier_*``, ``argusdiff_drift_*``) and
``/v1/plan`` (``classifier``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["DriftLoop", "build_drift_loop"]

log = logging.getLogger("argusdiff.drift")


class DriftLoop:
    """The live drift-retraining loop around a swappable classifier holder.

    ``holder``: ``.classifier``, ``.level_ids``, ``.swap(new)``, ``.version`` (a
    :class:`~classifiers.level.BatchedClassifier`); ``scorer``: ``.score(prompts, images)`` or a
    zero-argument factory of one (built on the loop's thread, so a large CLIP model never delays
    the service's start); ``labeller(prompts) -> (n, levels)`` quality array; ``train_fn(table) ->
    classifier`` trained for the holder's levels.
    """

    def __init__(
        self,
        holder: Any,
        *,
        scorer: Any,
        labeller: Callable[[list[str]], np.ndarray],
        train_fn: Callable[[Any], Any],
        trigger: Any,
        sample: float,
        metrics: Any = None,
        seed: int = 0,
        save_dir: str | None = None,
        max_pending: int = 256,
        score_batch: int = 16,
    ) -> None:
        if not 0.0 < sample <= 1.0:
            raise ValueError(f"sample must be in (0, 1], got {sample}")
        self.holder = holder
        self._scorer = scorer
        self.labeller = labeller
        self.train_fn = train_fn
        self.trigger = trigger
        self.sample = sample
        self.metrics = metrics
        self.save_dir = save_dir
        self.score_batch = score_batch
        self._rng = np.random.default_rng(seed)
        # (prompt, PNG bytes or the image's key in the image store)
        self._queue: queue.Queue[tuple[str, bytes | str] | None] = queue.Queue(maxsize=max_pending)
        self.images: Any = None  # the image store of served images that arrive as keys (Redis mode)
        self._thread: threading.Thread | None = None
        self.seen = 0  # served images offered
        self.sampled = 0
        self.dropped = 0  # sampled, but the queue was full
        self.scored = 0
        self.score_errors = 0
        self.retraining = False
        self.last_error: str | None = None
        if metrics is not None:
            metrics.classifier_version.set(self.version)

    # ---- the request path ----------------------------------------------------------------

    def observe(self, prompt: str, result: Any) -> None:
        """A served result (event-loop thread): sample it for scoring; never blocks, never raises."""
        png = getattr(result, "image_png", None)
        if png is None and self.images is not None:
            png = getattr(result, "image_ref", None) or None  # read from the image store when scored
        if png is None or not getattr(result, "ok", False):
            return
        self.seen += 1
        if self._rng.random() >= self.sample:
            return
        self.sampled += 1
        try:
            self._queue.put_nowait((prompt, png))
        except queue.Full:
            self.dropped += 1

    # ---- the loop's thread ---------------------------------------------------------------

    @property
    def version(self) -> int:
        return int(getattr(self.holder, "version", 1))

    @property
    def retrains(self) -> int:
        return self.trigger.retrains

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="drift-loop", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        t = self._thread
        if t is None:
            return
        while True:  # the stop marker must get in even when the queue is full
            try:
                self._queue.put(None, timeout=0.1)
                break
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self._queue.get_nowait()
        t.join(timeout)
        self._thread = None

    def scorer(self) -> Any:
        if not hasattr(self._scorer, "score"):
            self._scorer = self._scorer()  # a factory: build the scorer here, off the service's start
        return self._scorer

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < self.score_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._score(batch)
            if self.trigger.due():
                self._retrain()
            if stop:
                return

    def _read(self, png: bytes | str) -> bytes | None:
        """An image's bytes: given, or read from the image store by its key (None: it is gone)."""
        if isinstance(png, bytes):
            return png
        from argusdiff.service.images import read_image

        return read_image(self.images, png)

    def _score(self, batch: Sequence[tuple[str, bytes | str]]) -> None:
        from PIL import Image

        try:
            images = []
            batch = [(p, self._read(png)) for p, png in batch]
            batch = [(p, png) for p, png in batch if png is not None]
            if not batch:
                return
            for _, png in batch:
                with Image.open(io.BytesIO(png)) as im:
                    images.append(im.convert("RGB"))
            scores = self.scorer().score([p for p, _ in batch], images)
        except Exception as exc:  # scoring is advisory: count it, keep serving
            self.score_errors += len(batch)
            self.last_error = f"scoring failed: {exc}"
            log.warning("drift loop: %s", self.last_error)
            return
        for (prompt, _), q in zip(batch, scores, strict=True):
            if not np.isfinite(q):
                self.score_errors += 1
                continue
            self.scored += 1
            event = self.trigger.add(float(q), prompt)
            if event is not None:
                log.info(
                    "drift: window %d median quality %.4f < moving average %.4f of the earlier windows",
                    event.window, event.median, event.baseline,
                )  # fmt: skip
                if self.metrics is not None:
                    self.metrics.drift_events.inc()
        if self.metrics is not None:
            self.metrics.drift_scored.inc(len(batch))
            if self.trigger.last_window is not None:
                self.metrics.drift_window_quality.set(self.trigger.last_window)
            if self.trigger.last_baseline is not None:
                self.metrics.drift_baseline.set(self.trigger.last_baseline)

    def _retrain(self) -> None:
        from traces.quality import QualityTable

        prompts = [str(p) for p in self.trigger.prompts()]
        level_ids = tuple(self.holder.level_ids)
        self.retraining = True
        try:
            log.info("drift: labelling %d collected prompts at %d levels", len(prompts), len(level_ids))
            scores = np.asarray(self.labeller(prompts), dtype=np.float64)
            if scores.shape != (len(prompts), len(level_ids)):
                raise ValueError(f"the labeller gave {scores.shape} scores for {len(prompts)} x {len(level_ids)}")
            table = QualityTable(
                level_ids=level_ids,
                prompt_ids=tuple(f"served-{i}" for i in range(len(prompts))),
                prompts=tuple(prompts),
                scores=np.maximum(scores, 1e-6),
                source="served prompts collected by the drift loop, generated at every level and scored",
                synthetic=False,
            )
            new = self.train_fn(table)
            new.check_levels(level_ids)
            if self.save_dir:
                new.save(self.save_dir)
            self.holder.swap(new)
        except Exception as exc:  # the serving classifier stays
            self.trigger.failed()
            self.last_error = f"retraining failed, keeping the current classifier: {exc}"
            log.warning("drift loop: %s", self.last_error)
        else:
            self.trigger.retrained()
            self.last_error = None
            log.info("drift: classifier version %d swapped in (retrain %d)", self.version, self.retrains)
            if self.metrics is not None:
                self.metrics.classifier_retrains.inc()
                self.metrics.classifier_version.set(self.version)
        finally:
            self.retraining = False

    # ---- status --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        t = self.trigger
        return {
            "version": self.version,
            "retrains": t.retrains,
            "drift": {
                "sample": self.sample,
                "window": t.monitor.window,
                "windows": t.monitor.windows,
                "window_quality": t.last_window,
                "baseline": t.last_baseline,
                "events": t.events,
                "pending": t.pending,
                "retraining": self.retraining,
                "collected_prompts": t.collected,
                "min_samples": t.min_samples,
                "seen": self.seen,
                "sampled": self.sampled,
                "scored": self.scored,
                "dropped": self.dropped,
                "score_errors": self.score_errors,
                "last_error": self.last_error,
            },
        }


def build_drift_loop(settings: Any, profile: Any, holder: Any, executor_for: Any, metrics: Any = None) -> DriftLoop:
    """The loop of ``[classifier] drift_*`` for ``holder`` (the live batched classifier): the
    configured scorer, executor labelling with ``executor_for`` and training with the
    ``[classifier]`` settings."""
    from classifiers.drift import DriftMonitor, DriftTrigger

    c = settings.classifier

    def scorer() -> Any:
        from classifiers.scorers import make_scorer

        return make_scorer(c.scorer_metric, c.scorer_model, c.scorer_pretrained)

    loop: DriftLoop | None = None

    def labeller(prompts: list[str]) -> np.ndarray:
        from classifiers.measure import measure_quality_table

        assert loop is not None
        table = measure_quality_table(
            prompts,
            profile,
            loop.scorer(),
            executor_for,
            seed=settings.service.seed,
            progress=False,
            level_ids=tuple(holder.level_ids),
            warm_cache=True,
        )
        return table.scores

    def train(table: Any) -> Any:
        from classifiers.train import TrainConfig, train_level_classifier

        cfg = TrainConfig(
            mode=c.mode,
            ratio=c.ratio,
            max_length=c.max_length,
            backbone=c.backbone,
            class_weighting=c.class_weighting,
            pooling=c.pooling,
            progress=False,
        )
        strategy = profile.level(holder.level_ids[0]).strategy.value
        new, _report = train_level_classifier(table, config=cfg, profile=profile.name, strategy=strategy)
        if c.drift_save_dir:
            new.save(c.drift_save_dir)  # float32, before any inference conversion
        new.set_precision(c.precision)
        new.threads = c.threads
        return new

    loop = DriftLoop(
        holder,
        scorer=scorer,
        labeller=labeller,
        train_fn=train,
        trigger=DriftTrigger(DriftMonitor.from_config(c), c.drift_min_samples),
        sample=c.drift_sample,
        metrics=metrics,
        seed=settings.service.seed,
    )
    return loop
