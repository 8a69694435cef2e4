"""Smaller-model (SM) and one-step light levels: run the level's model for its N steps.

One-step distilled models (SD-Turbo, SDXS style) are ordinary registry entries with
``steps = 1`` and ``guidance = 0``; the level's ``steps`` decides N. A level with a
``feature_cache`` runs with that cache hook on its model's denoiser (:mod:`workers.feature_cache`)
and reports ``feature_cache_hit_rate`` among its timings.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from argusdiff.domain import ApproxLevel
from workers.cancel import Cancelled, CancelWatch, cancelled_result
from workers.messages import TIMING_KEYS, WorkItem, WorkResult
from workers.pipelines import default_seed, generate, to_png
from workers.progress import StepReporter
from workers.registry import LoadedModel, ModelRegistry
from workers.safety import FILTERED

__all__ = ["ModelExecutor", "feature_cache_timing", "queue_wait", "seeds_of"]


def seeds_of(items: Sequence[WorkItem]) -> list[int]:
    return [item.seed if item.seed is not None else default_seed(item.request_id) for item in items]


def feature_cache_timing(gen: Any) -> dict[str, float]:
    """``{"feature_cache_hit_rate": share}`` for a run with a feature cache, else nothing."""
    rate = getattr(gen, "feature_cache_hit_rate", None)
    return {} if rate is None else {"feature_cache_hit_rate": float(rate)}


def queue_wait(item: WorkItem, started: float) -> float:
    return max(0.0, started - item.enqueue_s) if item.enqueue_s else 0.0


class ModelExecutor:
    """Runs a level's model for all its steps (SM levels, light/heavy cascade levels, AC misses).

    A batch runs as one pipeline call; each request reports the batch's denoise and decode time
    (what it waited for) and the number of denoising-network calls its batch made.
    """

    def __init__(self, level: ApproxLevel, registry: ModelRegistry, *, safety: Any = None) -> None:
        self.level = level
        self.level_id = level.id
        self.model = level.model
        self.registry = registry
        self.spec = registry.spec(level.model)  # unknown model: clear error before any work
        self.safety = safety  # a workers.safety.SafetyChecker: every image is checked before it is returned

    @property
    def loaded(self) -> LoadedModel:
        return self.registry.load(self.model)

    def _result(self, item: WorkItem, seed: int, image: Any, timings: dict[str, float], **kw: Any) -> WorkResult:
        if self.safety is not None:
            reason = self.safety.flagged([image], [item.meta.get("moderation")])[0]
            if reason is not None:  # never returned: no image, the reason instead
                image = None
                kw.update(error=reason, error_type=FILTERED)
        return WorkResult(
            request_id=item.request_id,
            level=kw.pop("level", self.level_id),
            image_png=None if image is None else to_png(image),
            timings={k: float(timings.get(k, 0.0)) for k in TIMING_KEYS}
            | {k: float(v) for k, v in timings.items() if k not in TIMING_KEYS},
            requested_level=item.level,
            seed=seed,
            finished_s=time.time(),
            **kw,
        )

    @staticmethod
    def cancelled(items: Sequence[WorkItem], exc: Cancelled, started: float) -> list[WorkResult]:
        """The results of a batch whose run stopped because every request was cancelled."""
        return [cancelled_result(item, exc, queue_wait_s=queue_wait(item, started)) for item in items]

    def reporter(self, items: Sequence[WorkItem], *, start: int = 0) -> StepReporter:
        """Step events of the batch's streamed items (:mod:`workers.progress`)."""
        return StepReporter(self.loaded, items, steps=self.level.steps, start=start, level=self.level_id)

    def run(self, items: Sequence[WorkItem]) -> list[WorkResult]:
        if not items:
            return []
        started = time.time()
        model = self.loaded
        seeds = seeds_of(items)
        try:
            gen = generate(model, [i.prompt for i in items], seeds, steps=self.level.steps,
                           on_step=self.reporter(items), cancel=CancelWatch(items),
                           feature_cache=self.level.feature_cache)  # fmt: skip
        except Cancelled as exc:  # every request of the batch was cancelled: stopped at a step
            return self.cancelled(items, exc, started)
        return [
            self._result(
                item,
                seed,
                image,
                {
                    "queue_wait_s": queue_wait(item, started),
                    "denoise_s": gen.denoise_s,
                    "decode_s": gen.decode_s,
                    "batch": float(len(items)),
                }
                | feature_cache_timing(gen),
                unet_calls=gen.unet_calls,
            )
            for item, seed, image in zip(items, seeds, gen.images, strict=True)
        ]
