"""Image edits (``POST /v1/images/edits``) on a level's model: img2img, or inpainting with a mask.

An edit item carries its input image (``meta["edit_image"]``: base64 PNG, already resized by the
router to the size the level serves), optionally a mask (``meta["edit_mask"]``: base64 PNG, white
where the image is repainted) and the edit's strength (``meta["edit_strength"]``). The level's own
model runs it with the img2img or inpainting pipeline of its family built from its components
(:data:`EDIT_PIPELINES`: ``StableDiffusion[XL]Img2ImgPipeline`` / ``StableDiffusion[XL]InpaintPipeline``,
``FluxImg2ImgPipeline`` / ``FluxInpaintPipeline``, ``StableDiffusion3Img2ImgPipeline`` /
``StableDiffusion3InpaintPipeline``), sharing the loaded weights (a plain 4-channel UNet, and the
DiTs, inpaint by blending the masked latents every step, as diffusers does): ``strength × N``
denoising steps from the re-noised image (at least one). On a flow-matching family the image is
re-noised along the flow (``σ·noise + (1 − σ)·latent``, the pipelines' ``scale_noise``) and the
schedule is the family's own, FLUX.1's resolution-dependent shift included. An edit routed to a
feature-cache level runs with that level's cache hook on the denoiser (``feature_cache_hit_rate``
in its timings), as the level's generations do.

:func:`run_with_edits` is how the worker loop runs a batch: its edit items run here one by one on
the executor's model (each its own image), the rest go to the executor as before, so an edit routed to an
approximate-caching level neither looks up nor stores latents, and one routed to a cascade's light
level is not judged. A cancelled edit stops at its next step (:mod:`workers.cancel`); the
deployment's safety checker checks its image like any other (``ModelExecutor._result``).
"""

from __future__ import annotations

import base64
import contextlib
import io
import math
import time
from collections.abc import Sequence
from typing import Any

from workers.cancel import Cancelled, CancelWatch
from workers.messages import WorkItem, WorkResult

__all__ = [
    "EDIT_IMAGE",
    "EDIT_MASK",
    "EDIT_PIPELINES",
    "EDIT_STRENGTH",
    "edit",
    "edit_steps",
    "is_edit",
    "run_with_edits",
]

EDIT_IMAGE = "edit_image"
EDIT_MASK = "edit_mask"
EDIT_STRENGTH = "edit_strength"

#: The diffusers (img2img, inpainting) pipeline classes of each family
#: (:data:`workers.registry.FAMILY_PIPELINES` names the text-to-image one).
EDIT_PIPELINES: dict[str, tuple[str, str]] = {
    "sd": ("StableDiffusionImg2ImgPipeline", "StableDiffusionInpaintPipeline"),
    "sdxl": ("StableDiffusionXLImg2ImgPipeline", "StableDiffusionXLInpaintPipeline"),
    "flux": ("FluxImg2ImgPipeline", "FluxInpaintPipeline"),
    "sd3": ("StableDiffusion3Img2ImgPipeline", "StableDiffusion3InpaintPipeline"),
}


def is_edit(item: WorkItem) -> bool:
    return bool(item.meta.get(EDIT_IMAGE))


def _image(b64: str, mode: str) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(b64))).convert(mode)


def _pipeline(model: Any, inpaint: bool) -> Any:
    """The img2img or inpainting pipeline of ``model``'s family over its loaded components (built
    once)."""
    key = f"edit:{'inpaint' if inpaint else 'img2img'}"
    pipe = model.extras.get(key)
    if pipe is None:
        import inspect

        import diffusers

        from workers.errors import WorkerError

        names = EDIT_PIPELINES.get(model.spec.family)
        if names is None:
            raise WorkerError(f"model {model.spec.name!r}: family {model.spec.family!r} has no edit pipeline")
        cls = getattr(diffusers, names[1] if inpaint else names[0])
        takes = inspect.signature(cls.__init__).parameters
        comps = {k: v for k, v in model.pipe.components.items() if k in takes}
        if "safety_checker" in takes:  # SD-1.x/2.x: the deployment's own checker judges ([safety])
            comps.update(safety_checker=None, feature_extractor=None, requires_safety_checker=False)
        pipe = cls(**comps)
        pipe.set_progress_bar_config(disable=True)
        model.extras[key] = pipe
    return pipe


def edit_steps(n: int, strength: float) -> int:
    """Denoising steps an edit of N steps at ``strength`` runs (diffusers' ``get_timesteps``: the
    schedule's last ``min(N·strength, N)`` steps, the start rounded down)."""
    return n - int(max(n - min(n * strength, n), 0))


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
    feature_cache: Any = None,
) -> tuple[Any, int, float, float, float | None]:
    """(PIL image, denoising-network calls, denoise s, decode s, feature-cache hit rate or None)
    of one edit; raises :class:`~workers.cancel.Cancelled` when cancelled mid-run."""
    import torch

    from workers.feature_cache import applied, denoiser
    from workers.pipelines import StepCounter, _generators, _hit_rate, _Stop, _sync, call_kwargs, decode
    from workers.registry import FLOW_FAMILIES

    spec = model.spec
    n = steps or spec.steps
    n = max(n, math.ceil(1.0 / strength))  # at least one step once scaled by strength
    pipe = _pipeline(model, mask is not None)
    stop = _Stop(cancel)

    def on_step_end(p: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        stop.after(p, i + 1)
        return kwargs

    extra: dict[str, Any] = {"mask_image": mask} if mask is not None else {}
    if mask is not None or spec.family in FLOW_FAMILIES:  # the DiTs' img2img takes the size too
        extra.update(height=spec.height, width=spec.width)
    run = edit_steps(n, strength)
    net = denoiser(model.pipe)
    # the text-to-image pipelines name each denoiser call's cache context ("cond"); diffusers'
    # img2img/inpainting pipelines do not, so an edit with a feature cache runs in one: every call
    # of these edits is the conditional one (FLUX.1 embeds its guidance, SD-x and SD3 batch CFG)
    context = net.cache_context("cond") if feature_cache else contextlib.nullcontext()
    with (
        model.lock,
        StepCounter(model.pipe) as counter,
        applied(model, feature_cache, run, pipe) as fc,
        context,
        torch.inference_mode(),
    ):
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
            **call_kwargs(model),
            **extra,
        )
        _sync(model)
        denoise_s = time.perf_counter() - t0
    stop.raise_if_stopped(n, counter.calls)
    t1 = time.perf_counter()
    images = decode(model, out.images)
    return images[0], counter.calls, denoise_s, time.perf_counter() - t1, _hit_rate(fc, counter.calls)


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
        image, calls, denoise_s, decode_s, hit_rate = edit(
            executor.loaded,
            item.prompt,
            _image(item.meta[EDIT_IMAGE], "RGB"),
            seed,
            mask=_image(mask, "L") if mask else None,
            strength=float(item.meta.get(EDIT_STRENGTH) or 0.75),
            steps=executor.level.steps,
            cancel=CancelWatch([item]),
            feature_cache=executor.level.feature_cache,
        )
    except Cancelled as exc:
        return ModelExecutor.cancelled([item], exc, started)[0]
    timings = {"queue_wait_s": queue_wait(item, started), "denoise_s": denoise_s, "decode_s": decode_s}
    if hit_rate is not None:
        timings["feature_cache_hit_rate"] = hit_rate
    return executor._result(item, seed, image, timings, unet_calls=calls)
