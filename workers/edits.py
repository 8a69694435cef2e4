"""Image edits (``POST /v1/images/edits``) on a level's model: img2img, or inpainting with a mask.

An edit item carries its input image (``meta["edit_image"]``: base64 PNG, already resized by the
router to the size the level serves), optionally a mask (``meta["edit_mask"]``: base64 PNG, white
where the image is repainted) and the edit's strength (``meta["edit_strength"]``). The level's own
model runs it with the img2img or inpainting pipeline built from its components
(``StableDiffusion[XL]Img2ImgPipeline`` / ``StableDiffusion[XL]InpaintPipeline``, sharing the loaded
weights; a plain 4-channel UNet inpaints by blending the masked latents every step, as diffusers
does): ``strength × N`` denoising steps from the re-noised image (at least one).

:func:`run_with_edits` is how the worker loop runs a batch: its edit items run here one by one on
the executor's model (each its own image), the rest go to the executor as before, so an edit routed to an
approximate-caching level neither looks up nor stores latents, and one routed to a cascade's light
level is not judged. A cancelled edit stops at its next step (:mod:`workers.cancel`); the
deployment's safety checker checks its image like any other (``ModelExecutor._result``).
"""

from __future__ import annotations

import base64
import io
import math
import time
from collections.abc import Sequence
from typing import Any

from workers.cancel import Cancelled, CancelWatch
from workers.messages import WorkItem, WorkResult

__all__ = ["EDIT_IMAGE", "EDIT_MASK", "EDIT_STRENGTH", "edit", "is_edit", "run_with_edits"]

EDIT_IMAGE = "edit_image"
EDIT_MASK = "edit_mask"
EDIT_STRENGTH = "edit_strength"


def is_edit(item: WorkItem) -> bool:
    return bool(item.meta.get(EDIT_IMAGE))


def _image(b64: str, mode: str) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(b64))).convert(mode)


def _pipeline(model: Any, inpaint: bool) -> Any:
    """The img2img or inpainting pipeline over ``model``'s loaded components (built once)."""
    key = f"edit:{'inpaint' if inpaint else 'img2img'}"
    pipe = model.extras.get(key)
    if pipe is None:
        import diffusers

        xl = model.spec.family == "sdxl"
        name = ("StableDiffusionXL" if xl else "StableDiffusion") + (
            "InpaintPipeline" if inpaint else "Img2ImgPipeline"
        )
        comps = dict(model.pipe.components)
        if not xl:
            comps.update(safety_checker=None, feature_extractor=None, requires_safety_checker=False)
        pipe = getattr(diffusers, name)(**comps)
        pipe.set_progress_bar_config(disable=True)
        model.extras[key] = pipe
    return pipe


def edit(
    model: Any,
    prompt: str,
    image: Any,
    seed: int,
    *,
    mask: Any = None,
    strength: float = 0.75,
    steps: int | None = None,
    cancel: CancelWatch | None = None,
) -> tuple[Any, int, float, float]:
    """(PIL image, denoising-network calls, denoise s, decode s) of one edit; raises
    :class:`~workers.cancel.Cancelled` when cancelled mid-run."""
    import torch

    from workers.pipelines import UnetCounter, _generators, _Stop, _sync, decode

    spec = model.spec
    n = steps or spec.steps
    n = max(n, math.ceil(1.0 / strength))  # at least one step once scaled by strength
    pipe = _pipeline(model, mask is not None)
    stop = _Stop(cancel)

    def on_step_end(p: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        stop.after(p, i + 1)
        return kwargs

    extra = {"mask_image": mask} if mask is not None else {}
    with model.lock, UnetCounter(model.pipe) as counter, torch.inference_mode():
        t0 = time.perf_counter()
        out = pipe(
            prompt,
            image=image,
            strength=strength,
            num_inference_steps=n,
            guidance_scale=spec.guidance,
            generator=_generators(model, [seed]),
            output_type="latent",
            callback_on_step_end=on_step_end if stop.active else None,
            callback_on_step_end_tensor_inputs=["latents"],
            **({"height": spec.height, "width": spec.width} if mask is not None else {}),
            **extra,
        )
        _sync(model)
        denoise_s = time.perf_counter() - t0
    stop.raise_if_stopped(n, counter.calls)
    t1 = time.perf_counter()
    images = decode(model, out.images)
    return images[0], counter.calls, denoise_s, time.perf_counter() - t1


def run_with_edits(executor: Any, items: Sequence[WorkItem]) -> list[WorkResult]:
    """``executor.run(items)``, except that the edit items of a diffusers executor (one with a
    model registry; stand-ins run edits like any item) run here one by one on its model."""
    edits = [i for i, item in enumerate(items) if is_edit(item)]
    if not edits or getattr(executor, "registry", None) is None:
        return executor.run(items)
    rest = [item for item in items if not is_edit(item)]
    plain = iter(executor.run(rest) if rest else [])
    done = {i: _edit(executor, items[i]) for i in edits}
    return [done[i] if i in done else next(plain) for i in range(len(items))]


def _edit(executor: Any, item: WorkItem) -> WorkResult:
    from workers.sm import ModelExecutor, queue_wait, seeds_of

    started = time.time()
    seed = seeds_of([item])[0]
    mask = item.meta.get(EDIT_MASK)
    try:
        image, calls, denoise_s, decode_s = edit(
            executor.loaded,
            item.prompt,
            _image(item.meta[EDIT_IMAGE], "RGB"),
            seed,
            mask=_image(mask, "L") if mask else None,
            strength=float(item.meta.get(EDIT_STRENGTH) or 0.75),
            steps=executor.level.steps,
            cancel=CancelWatch([item]),
        )
    except Cancelled as exc:
        return ModelExecutor.cancelled([item], exc, started)[0]
    timings = {"queue_wait_s": queue_wait(item, started), "denoise_s": denoise_s, "decode_s": decode_s}
    return executor._result(item, seed, image, timings, unet_calls=calls)
