"""Cascade levels (DiffServe §3): the light model generates, a discriminator judges the image,
and the request is either answered with the light image (confidence ≥ threshold) or deferred to
the heavy level.

Deferral has two modes:

* ``inline_heavy=False`` (serving): the light worker returns the light image with a ``handoff``
  item for the heavy level; the router's policy decides (``route_heavy``): the heavy level redoes
  the request, it is dropped, or the light image is the answer.
* ``inline_heavy=True`` (``argusdiff generate``, benchmarks): the heavy model runs here.

DiffServe's open idea, *heavy from the light latent*: when both models share a latent space
(same VAE family, e.g. SD-Turbo → SD-1.5, SDXL-Lightning → SD-XL), the heavy model can start
from the light model's final latent re-noised to ``refine_strength`` (SDEdit) and run only about
``refine_strength × N`` steps instead of N. ``scripts/bench_workers.py`` measures it.

The judge is anything with ``confidence(images) -> array`` (e.g.
:class:`classifiers.discriminator.Discriminator`) or a callable ``judge(image) -> float``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from argusdiff.domain import ApproxLevel
from workers.cancel import Cancelled, CancelWatch
from workers.messages import WorkItem, WorkResult, handoff_item
from workers.pipelines import generate, refine_from_latent
from workers.registry import ModelRegistry
from workers.sm import ModelExecutor, queue_wait, seeds_of

__all__ = ["CascadeExecutor", "as_judge", "latents_compatible", "load_discriminator"]

BatchJudge = Callable[[Sequence[Any]], Sequence[float]]


def as_judge(judge: Any) -> BatchJudge:
    """A batch judge from a discriminator object (``.confidence``) or a per-image callable."""
    if hasattr(judge, "confidence"):
        return lambda images: [float(c) for c in np.asarray(judge.confidence(list(images))).reshape(-1)]
    if callable(judge):
        return lambda images: [float(judge(img)) for img in images]
    raise TypeError(f"a judge needs .confidence(images) or to be callable, got {type(judge).__name__}")


def load_discriminator(path: str, *, light: str | None = None, profile: str | None = None, device: str = "cpu") -> Any:
    """Load the trained discriminator (:class:`classifiers.discriminator.Discriminator`) from ``path``;
    ``light``/``profile`` are checked against what it was trained for."""
    from classifiers.discriminator import Discriminator

    return Discriminator.load(path, light=light, profile=profile, device=device)


def latents_compatible(registry: ModelRegistry, light: str, heavy: str) -> bool:
    """Whether ``heavy`` can refine ``light``'s latent: same UNet family (SD-1.x/2.x or SD-XL; the
    SDEdit refinement is written for their img2img pipelines) and latent geometry."""
    a, b = registry.spec(light), registry.spec(heavy)
    return a.family == b.family and a.family in ("sd", "sdxl") and (a.height, a.width) == (b.height, b.width)


class CascadeExecutor(ModelExecutor):
    """Runs the light level, judges each image, accepts or defers (see module docs)."""

    def __init__(
        self,
        light: ApproxLevel,
        heavy: ApproxLevel,
        registry: ModelRegistry,
        *,
        judge: Any,
        threshold: float,
        inline_heavy: bool = False,
        refine_strength: float | None = None,
    ) -> None:
        super().__init__(light, registry)
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"cascade threshold must be in [0, 1], got {threshold}")
        self.heavy = heavy
        self.judge = as_judge(judge)
        self.threshold = threshold
        self.inline_heavy = inline_heavy
        if refine_strength is not None and not latents_compatible(registry, light.model, heavy.model):
            raise ValueError(
                f"heavy-from-light-latent needs compatible models: {light.model!r} and {heavy.model!r} differ "
                "in family or resolution"
            )
        self.refine_strength = refine_strength
        self._heavy_exec = ModelExecutor(heavy, registry) if inline_heavy else None
        self.stats = {"accepted": 0, "deferred": 0}

    def set_threshold(self, threshold: float) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"cascade threshold must be in [0, 1], got {threshold}")
        self.threshold = threshold

    def handoff(self, item: WorkItem, confidence: float) -> WorkItem:
        """The item that asks the heavy level to redo ``item`` (the router's policy decides)."""
        return handoff_item(item, self.heavy.id, confidence)

    def run(self, items: Sequence[WorkItem]) -> list[WorkResult]:
        if not items:
            return []
        started = time.time()
        seeds = seeds_of(items)
        try:
            gen = generate(self.loaded, [i.prompt for i in items], seeds, steps=self.level.steps,
                           on_step=self.reporter(items), cancel=CancelWatch(items))  # fmt: skip
        except Cancelled as exc:
            return self.cancelled(items, exc, started)
        t0 = time.perf_counter()
        conf = list(self.judge(gen.images))
        judge_s = time.perf_counter() - t0
        if len(conf) != len(items):
            raise ValueError(f"the judge returned {len(conf)} confidences for {len(items)} images")
        results: list[WorkResult | None] = [None] * len(items)
        deferred: list[int] = []
        for idx, item in enumerate(items):
            timings = {
                "queue_wait_s": queue_wait(item, started),
                "denoise_s": gen.denoise_s,
                "decode_s": gen.decode_s,
                "judge_s": judge_s,
                "batch": float(len(items)),
            }
            if conf[idx] >= self.threshold:
                self.stats["accepted"] += 1
                results[idx] = self._result(
                    item, seeds[idx], gen.images[idx], timings, confidence=conf[idx], unet_calls=gen.unet_calls
                )
            else:
                self.stats["deferred"] += 1
                deferred.append(idx)
                # the light image travels with the hand-off: the router's policy may keep it
                results[idx] = self._result(
                    item,
                    seeds[idx],
                    gen.images[idx],
                    timings,
                    confidence=conf[idx],
                    unet_calls=gen.unet_calls,
                    handoff=None if self.inline_heavy else self.handoff(item, conf[idx]),
                )
        if deferred and self.inline_heavy:
            self._run_heavy_inline(items, seeds, gen, deferred, results)
        return [r for r in results if r is not None]

    def _run_heavy_inline(self, items, seeds, light_gen, deferred: list[int], results: list) -> None:
        heavy_model = self.registry.load(self.heavy.model)
        prompts = [items[i].prompt for i in deferred]
        dseeds = [seeds[i] for i in deferred]
        if self.refine_strength is not None:
            hgen = refine_from_latent(
                heavy_model,
                prompts,
                light_gen.latents[deferred],
                dseeds,
                strength=self.refine_strength,
                steps=self.heavy.steps,
            )
        else:
            hgen = generate(heavy_model, prompts, dseeds, steps=self.heavy.steps)
        for j, i in enumerate(deferred):
            light = results[i]
            timings = dict(light.timings)
            timings["denoise_s"] += hgen.denoise_s
            timings["decode_s"] += hgen.decode_s
            results[i] = self._result(
                items[i],
                seeds[i],
                hgen.images[j],
                timings,
                level=self.heavy.id,
                confidence=light.confidence,
                deferred=True,
                unet_calls=light.unet_calls + hgen.unet_calls,
            )
