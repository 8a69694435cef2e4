"""Diffusion mechanics shared by the executors: generate (with latent capture after K steps),
resume from a latent at step K, decode, and PNG encoding. Torch/diffusers are imported by the
caller's first use of this module (it is only imported lazily by executors).

Approximate caching (NIRVANA, ARGUS §4.5) needs a trajectory captured after K of N steps to be
continued exactly. That holds for first-order deterministic schedulers (DDIM with eta = 0,
Euler): the state after step K is the latent alone. Ancestral/SDE schedulers draw fresh noise
per step and multistep ones keep a history, so :func:`check_resumable` refuses them.

* **capture**: ``callback_on_step_end`` at step index K-1 copies the latents after K steps.
* **resume, SD-XL**: ``StableDiffusionXLImg2ImgPipeline(**base.components)`` with the latent as
  ``image`` and ``denoising_start = K/N`` (no re-noising; the pipeline cuts the schedule at the
  same timestep the full run reached); the number of remaining steps is checked to be N−K.
* **resume, SD-1.x/2.x**: the same loop as ``StableDiffusionPipeline`` driven from
  ``timesteps[K*order:]``.
* **resume, flow matching (FLUX.1, SD3/SD3.5)**: the family's own pipeline is called with the
  captured latents (FLUX's packed ``(B, H/16·W/16, 64)`` tokens, SD3's ``(B, 16, H/8, W/8)``) as
  ``latents``, and its scheduler keeps the schedule the full run computes (the resolution-dependent
  shift ``mu`` of FLUX.1 included, from the same image sequence length) cut after K steps:
  :func:`_cut_schedule` wraps ``set_timesteps`` for the call so the pipeline loops over
  ``timesteps[K:]`` with ``sigmas[K:]``. Flow matching's Euler step is ``x + (σ_next − σ)·v``,
  deterministic unless the scheduler is configured with ``stochastic_sampling`` (refused).

The denoising network is ``pipe.unet`` for UNet families and ``pipe.transformer`` for DiTs
(:func:`denoiser`); :class:`StepCounter` counts its forward calls either way.
"""

from __future__ import annotations

import contextlib
import functools
import io
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from workers.cancel import Cancelled, CancelWatch
from workers.errors import LatentMismatch, UnsupportedScheduler
from workers.feature_cache import applied, denoiser
from workers.registry import AC_SCHEDULERS, FLOW_FAMILIES, LoadedModel

__all__ = [
    "Cancelled",
    "Generation",
    "StepCounter",
    "StepObserver",
    "UnetCounter",
    "check_resumable",
    "decode",
    "default_seed",
    "denoiser",
    "generate",
    "latent_shape",
    "refine_from_latent",
    "resume",
    "to_png",
]


class StepObserver(Protocol):
    """What a run reports its steps to (:class:`workers.progress.StepReporter`, which decodes
    partial images with this module's :func:`decode`)."""

    @property
    def active(self) -> bool: ...

    def watch(self, scheduler: Any) -> contextlib.AbstractContextManager: ...

    def begin(self) -> None: ...

    def step(self, done: int, latents: Any) -> None: ...


@dataclass(slots=True)
class Generation:
    """Output of one batched run: final latents, decoded images, captured latents and costs."""

    latents: torch.Tensor
    images: list[Any] = field(default_factory=list)  # PIL images (empty when decode=False)
    captured: dict[int, torch.Tensor] = field(default_factory=dict)  # K -> latents after K steps
    unet_calls: int = 0
    denoise_s: float = 0.0
    decode_s: float = 0.0
    # share of the denoiser's attention work a feature cache skipped (None: no feature cache)
    feature_cache_hit_rate: float | None = None


class StepCounter:
    """Counts forward calls of a pipeline's denoising network, UNet or transformer (one per step
    and CFG branch: SD-x runs its two branches as one batch, SD3 too; FLUX.1 [dev] embeds the
    guidance and makes one call)."""

    def __init__(self, pipe: Any) -> None:
        self.calls = 0
        self._handle = denoiser(pipe).register_forward_pre_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.calls += 1

    def close(self) -> None:
        self._handle.remove()

    def __enter__(self) -> StepCounter:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


UnetCounter = StepCounter  # the name the SD/SD-XL code paths used


def default_seed(request_id: str) -> int:
    """A stable seed for a request that did not choose one."""
    return zlib.crc32(request_id.encode("utf-8")) & 0x7FFFFFFF


def check_resumable(model: LoadedModel) -> str:
    """The scheduler class name if ``model`` can capture/resume exactly, else a clear error."""
    sched = model.pipe.scheduler
    name = type(sched).__name__
    if name not in AC_SCHEDULERS:
        raise UnsupportedScheduler(
            f"model {model.spec.name!r}: scheduler {name} cannot resume from a cached latent exactly; "
            f"approximate caching needs one of {', '.join(sorted(AC_SCHEDULERS))} "
            "(set the model's 'scheduler' in [workers.models])"
        )
    if getattr(sched.config, "stochastic_sampling", False):
        raise UnsupportedScheduler(
            f"model {model.spec.name!r}: scheduler {name} is configured with stochastic_sampling (fresh noise "
            "every step): a trajectory cannot resume from a cached latent exactly"
        )
    prediction = getattr(sched.config, "prediction_type", "epsilon")
    if prediction not in ("epsilon", "v_prediction", "sample", "flow_prediction"):
        raise UnsupportedScheduler(f"model {model.spec.name!r}: unsupported prediction type")
    return name


def latent_shape(model: LoadedModel, batch: int = 1) -> tuple[int, ...]:
    """The shape of a batch's latents as the pipeline's denoising loop holds them: FLUX.1 packs
    2×2 patches of its 16-channel latents into tokens, ``(B, H/16 · W/16, 64)``; the other
    families keep ``(B, C, H/8, W/8)``."""
    pipe = model.pipe
    f = pipe.vae_scale_factor
    h, w = model.spec.height // f, model.spec.width // f
    if model.spec.family == "flux":
        return (batch, (h // 2) * (w // 2), denoiser(pipe).config.in_channels)
    return (batch, denoiser(pipe).config.in_channels, h, w)


def call_kwargs(model: LoadedModel) -> dict[str, Any]:
    """Keyword arguments a family's pipeline takes beyond the common ones: the T5 prompt length
    (``max_sequence_length``) of FLUX.1 and SD3 when the spec sets one."""
    spec = model.spec
    if spec.family in FLOW_FAMILIES and spec.text_length is not None:
        return {"max_sequence_length": int(spec.text_length)}
    return {}


def _generators(model: LoadedModel, seeds: Sequence[int]) -> list[torch.Generator]:
    device = "cpu" if not model.device.startswith("cuda") else model.device
    return [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]


def _sync(model: LoadedModel) -> None:
    if model.device.startswith("cuda"):
        torch.cuda.synchronize()


def cast(module: Any, dtype: torch.dtype) -> Any:
    """``module`` in ``dtype``, in place, by torch's own ``Module.to``: diffusers' ``ModelMixin.to``
    (0.42) logs "There are modules in ... that should be kept in float32" on every dtype cast, even
    for a model that lists no such module, and the fp16 SD-XL VAE's upcast for each decode would log
    it for every image."""
    return torch.nn.Module.to(module, dtype=dtype)


def decode(model: LoadedModel, latents: torch.Tensor, vae: Any = None) -> list[Any]:
    """Latents → PIL images with the model's VAE (fp16 SD-XL VAEs are upcast as the pipeline does),
    or with ``vae`` (e.g. a tiny preview decoder for partial images)."""
    pipe = model.pipe
    vae = pipe.vae if vae is None else vae
    with model.lock, torch.inference_mode():
        upcast = vae.dtype == torch.float16 and bool(getattr(vae.config, "force_upcast", False))
        if upcast:
            cast(vae, torch.float32)
        lat = latents.to(device=vae.device, dtype=vae.dtype)
        if model.spec.family == "flux" and lat.dim() == 3:  # packed tokens -> (B, 16, H/8, W/8)
            lat = pipe._unpack_latents(lat, model.spec.height, model.spec.width, pipe.vae_scale_factor)
        mean = getattr(vae.config, "latents_mean", None)
        std = getattr(vae.config, "latents_std", None)
        shift = getattr(vae.config, "shift_factor", None)
        if shift is not None and model.spec.family in FLOW_FAMILIES:  # as FluxPipeline / SD3 decode
            lat = lat / vae.config.scaling_factor + shift
        elif mean is not None and std is not None:
            m = torch.tensor(mean).view(1, -1, 1, 1).to(lat.device, lat.dtype)
            s = torch.tensor(std).view(1, -1, 1, 1).to(lat.device, lat.dtype)
            lat = lat * s / vae.config.scaling_factor + m
        else:
            lat = lat / vae.config.scaling_factor
        image = vae.decode(lat, return_dict=False)[0]
        if upcast:
            cast(vae, torch.float16)
        return pipe.image_processor.postprocess(image, output_type="pil")


class _Stop:
    """A run's side of a :class:`~workers.cancel.CancelWatch`: after each step, interrupt the
    pipeline (diffusers skips the steps left) once the batch is cancelled; then raise."""

    def __init__(self, cancel: CancelWatch | None) -> None:
        self.cancel = cancel if cancel is not None and cancel.active else None
        self.steps: int | None = None  # steps done when the run was interrupted

    @property
    def active(self) -> bool:
        return self.cancel is not None

    def after(self, pipe: Any, done: int) -> bool:
        """After step ``done``: True (and the pipeline's interrupt set) when the run must stop."""
        if self.cancel is None or self.steps is not None:
            return self.steps is not None
        if self.cancel.requested():
            self.steps = done
            if pipe is not None:
                pipe._interrupt = True  # diffusers' own flag: the loop skips every step left
            return True
        return False

    def raise_if_stopped(self, n: int, unet_calls: int) -> None:
        if self.steps is not None:
            raise Cancelled(f"cancelled after {self.steps} of {n} steps", steps=self.steps, unet_calls=unet_calls)


def generate(
    model: LoadedModel,
    prompts: Sequence[str],
    seeds: Sequence[int],
    *,
    steps: int | None = None,
    guidance: float | None = None,
    capture: Sequence[int] = (),
    decode_images: bool = True,
    on_step: StepObserver | None = None,
    cancel: CancelWatch | None = None,
    feature_cache: Mapping[str, Any] | None = None,
) -> Generation:
    """Run all N steps for a batch; with ``capture``, keep the latents after each K in it; with
    ``on_step``, report every step (streamed requests, :mod:`workers.progress`); with ``cancel``,
    stop at the next step once the batch is cancelled (:class:`workers.cancel.Cancelled`); with
    ``feature_cache``, run with that diffusers cache hook on the denoiser
    (:mod:`workers.feature_cache`; nothing is captured then: the trajectory is approximate)."""
    spec = model.spec
    n = steps or spec.steps
    ks = sorted({int(k) for k in capture if 0 < int(k) < n}) if not feature_cache else []
    if ks:
        check_resumable(model)
    captured: dict[int, torch.Tensor] = {}
    report = on_step is not None and on_step.active
    stop = _Stop(cancel)

    def on_step_end(pipe: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        done = i + 1
        if done in ks:
            captured[done] = kwargs["latents"].detach().clone()
        if report:
            on_step.step(done, kwargs["latents"])
        stop.after(pipe, done)
        return kwargs

    pipe = model.pipe
    watch = on_step.watch(pipe.scheduler) if report else contextlib.nullcontext()
    with (
        model.lock,
        StepCounter(pipe) as counter,
        applied(model, feature_cache, n) as fc,
        torch.inference_mode(),
        watch,
    ):
        if report:
            on_step.begin()
        t0 = time.perf_counter()
        out = pipe(
            list(prompts),
            num_inference_steps=n,
            guidance_scale=spec.guidance if guidance is None else guidance,
            height=spec.height,
            width=spec.width,
            generator=_generators(model, seeds),
            output_type="latent",
            callback_on_step_end=on_step_end if ks or report or stop.active else None,
            callback_on_step_end_tensor_inputs=["latents"],
            **call_kwargs(model),
        )
        latents = out.images
        _sync(model)
        denoise_s = time.perf_counter() - t0
    stop.raise_if_stopped(n, counter.calls)
    gen = Generation(latents=latents, captured=captured, unet_calls=counter.calls, denoise_s=denoise_s,
                     feature_cache_hit_rate=_hit_rate(fc, counter.calls))  # fmt: skip
    if decode_images:
        t1 = time.perf_counter()
        gen.images = decode(model, latents)
        gen.decode_s = time.perf_counter() - t1
    return gen


def _hit_rate(fc: Any, denoiser_calls: int) -> float | None:
    """1 − attention projections computed / those a run without the cache computes."""
    if fc is None:
        return None
    expected = fc.modules * denoiser_calls
    return 0.0 if expected == 0 else max(0.0, 1.0 - fc.calls / expected)


def _as_latents(model: LoadedModel, latents: torch.Tensor | np.ndarray | Sequence[np.ndarray]) -> torch.Tensor:
    if isinstance(latents, torch.Tensor):
        lat = latents
    elif isinstance(latents, np.ndarray):
        lat = torch.from_numpy(np.ascontiguousarray(latents))
    else:
        dims = len(latent_shape(model)) - 1  # one item's dims: 3, or 2 for FLUX's packed tokens
        lat = torch.from_numpy(np.stack([np.asarray(a).reshape(np.asarray(a).shape[-dims:]) for a in latents]))
    if lat.dim() == len(latent_shape(model)) - 1:
        lat = lat.unsqueeze(0)
    expected = latent_shape(model, lat.shape[0])
    if tuple(lat.shape) != expected:
        raise LatentMismatch(f"model {model.spec.name!r}: latent shape {tuple(lat.shape)} != expected {expected}")
    net = denoiser(model.pipe)
    return lat.to(device=net.device, dtype=net.dtype)


def _sdxl_img2img(model: LoadedModel) -> Any:
    cached = model.extras.get("img2img")
    if cached is None:
        from diffusers import StableDiffusionXLImg2ImgPipeline

        cached = StableDiffusionXLImg2ImgPipeline(**model.pipe.components)
        cached.set_progress_bar_config(disable=True)
        model.extras["img2img"] = cached
    return cached


def _resume_sd(
    model: LoadedModel,
    prompts: Sequence[str],
    latents: torch.Tensor,
    k: int,
    n: int,
    guidance: float,
    gens: list,
    on_step: StepObserver | None = None,
    stop: _Stop | None = None,
) -> torch.Tensor:
    pipe = model.pipe
    sched = pipe.scheduler
    device = pipe._execution_device
    if pipe.unet.config.time_cond_proj_dim is not None:
        raise UnsupportedScheduler(f"model {model.spec.name!r}: guidance-embedded UNets cannot resume")
    do_cfg = guidance > 1
    prompt_embeds, negative = pipe.encode_prompt(list(prompts), device, 1, do_cfg, None)
    if do_cfg:
        prompt_embeds = torch.cat([negative, prompt_embeds])
    sched.set_timesteps(n, device=device)
    start = k * sched.order
    timesteps = sched.timesteps[start:]
    if hasattr(sched, "set_begin_index"):
        sched.set_begin_index(start)
    extra = pipe.prepare_extra_step_kwargs(gens, 0.0)
    for done, t in enumerate(timesteps, start=k + 1):
        model_in = torch.cat([latents] * 2) if do_cfg else latents
        model_in = sched.scale_model_input(model_in, t)
        noise_pred = pipe.unet(
            model_in,
            t,
            encoder_hidden_states=prompt_embeds,
            timestep_cond=None,
            cross_attention_kwargs=None,
            added_cond_kwargs=None,
            return_dict=False,
        )[0]
        if do_cfg:
            uncond, text = noise_pred.chunk(2)
            noise_pred = uncond + guidance * (text - uncond)
        latents = sched.step(noise_pred, t, latents, **extra, return_dict=False)[0]
        if on_step is not None:
            on_step.step(done, latents)
        if stop is not None and stop.after(None, done):
            break
    return latents


@contextlib.contextmanager
def _cut_schedule(model: LoadedModel, k: int, n: int):
    """For one pipeline call: the scheduler computes the full N-step schedule exactly as an
    uninterrupted run does (its shift included), then keeps only the part after step K."""
    scheduler = model.pipe.scheduler
    original = scheduler.set_timesteps

    @functools.wraps(original)  # pipelines inspect its signature (custom sigmas)
    def set_timesteps(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        start = k * scheduler.order
        remaining = len(scheduler.timesteps) - start
        if remaining != n - k:
            raise UnsupportedScheduler(
                f"model {model.spec.name!r}: the schedule does not split at K={k} of N={n} "
                f"({remaining} steps would remain)"
            )
        scheduler.timesteps = scheduler.timesteps[start:]
        scheduler.sigmas = scheduler.sigmas[start:]

    scheduler.set_timesteps = set_timesteps
    try:
        yield
    finally:
        with contextlib.suppress(AttributeError):
            del scheduler.set_timesteps  # the class's method again


def _resume_flow(
    model: LoadedModel,
    prompts: Sequence[str],
    latents: torch.Tensor,
    k: int,
    n: int,
    guidance: float,
    gens: list,
    report: StepObserver | None,
    stop: _Stop,
) -> torch.Tensor:
    """Flow matching (FLUX.1, SD3): the family's pipeline from ``latents`` over the full run's
    schedule cut after K steps (:func:`_cut_schedule`)."""
    pipe = model.pipe

    def on_step_end(p: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        if report is not None:
            report.step(k + i + 1, kwargs["latents"])
        stop.after(p, k + i + 1)
        return kwargs

    watch = report.watch(pipe.scheduler) if report is not None else contextlib.nullcontext()
    with _cut_schedule(model, k, n), watch:
        out = pipe(
            list(prompts),
            num_inference_steps=n,
            guidance_scale=guidance,
            height=model.spec.height,
            width=model.spec.width,
            generator=gens,
            latents=latents,
            output_type="latent",
            callback_on_step_end=on_step_end if report is not None or stop.active else None,
            callback_on_step_end_tensor_inputs=["latents"],
            **call_kwargs(model),
        )
    return out.images


def resume(
    model: LoadedModel,
    prompts: Sequence[str],
    latents: torch.Tensor | np.ndarray | Sequence[np.ndarray],
    k: int,
    seeds: Sequence[int],
    *,
    steps: int | None = None,
    guidance: float | None = None,
    decode_images: bool = True,
    on_step: StepObserver | None = None,
    cancel: CancelWatch | None = None,
    feature_cache: Mapping[str, Any] | None = None,
) -> Generation:
    """Continue latents captured after ``k`` of N steps for ``prompts``: runs exactly N−K steps
    (``on_step`` reports steps K+1..N; ``cancel`` stops it and ``feature_cache`` applies a cache
    hook as in :func:`generate`)."""
    spec = model.spec
    n = steps or spec.steps
    if not 0 < k < n:
        raise ValueError(f"resume needs 0 < K < N, got K={k}, N={n}")
    check_resumable(model)
    lat = _as_latents(model, latents)
    if lat.shape[0] != len(prompts):
        raise LatentMismatch(f"{lat.shape[0]} latents for {len(prompts)} prompts")
    g = spec.guidance if guidance is None else guidance
    gens = _generators(model, seeds)
    report = on_step if on_step is not None and on_step.active else None
    stop = _Stop(cancel)
    with model.lock, StepCounter(model.pipe) as counter, applied(model, feature_cache, n) as fc, torch.inference_mode():
        t0 = time.perf_counter()
        if report is not None:
            report.begin()
        if spec.family in FLOW_FAMILIES:
            final = _resume_flow(model, prompts, lat, k, n, g, gens, report, stop)
        elif spec.family == "sdxl":
            img2img = _sdxl_img2img(model)
            img2img.scheduler.set_timesteps(n)
            start = k / n
            num_train = img2img.scheduler.config.num_train_timesteps
            cutoff = round(num_train - start * num_train)  # as the img2img pipeline cuts
            remaining = int((img2img.scheduler.timesteps < cutoff).sum().item())
            if remaining != n - k:
                raise UnsupportedScheduler(
                    f"model {spec.name!r}: the scheduler's timesteps do not split at K={k} of N={n} "
                    f"({remaining} steps would remain); use timestep_spacing 'leading' or 'trailing'"
                )

            def on_step_end(pipe: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
                if report is not None:
                    report.step(k + i + 1, kwargs["latents"])
                stop.after(pipe, k + i + 1)
                return kwargs

            with report.watch(img2img.scheduler) if report is not None else contextlib.nullcontext():
                out = img2img(
                    list(prompts),
                    image=lat,
                    num_inference_steps=n,
                    denoising_start=start,
                    guidance_scale=g,
                    generator=gens,
                    output_type="latent",
                    callback_on_step_end=on_step_end if report is not None or stop.active else None,
                    callback_on_step_end_tensor_inputs=["latents"],
                )
            final = out.images
        else:
            with report.watch(model.pipe.scheduler) if report is not None else contextlib.nullcontext():
                final = _resume_sd(model, prompts, lat, k, n, g, gens, report, stop)
        _sync(model)
        denoise_s = time.perf_counter() - t0
    stop.raise_if_stopped(n, counter.calls)
    gen = Generation(latents=final, unet_calls=counter.calls, denoise_s=denoise_s,
                     feature_cache_hit_rate=_hit_rate(fc, counter.calls))  # fmt: skip
    if decode_images:
        t1 = time.perf_counter()
        gen.images = decode(model, final)
        gen.decode_s = time.perf_counter() - t1
    return gen


def refine_from_latent(
    model: LoadedModel,
    prompts: Sequence[str],
    latents: torch.Tensor,
    seeds: Sequence[int],
    *,
    strength: float,
    steps: int | None = None,
    guidance: float | None = None,
) -> Generation:
    """SDEdit-style: re-noise a finished latent (e.g. a light model's) to ``strength`` and denoise
    it with this model for about ``strength × N`` steps. Both models must share a latent space."""
    if not 0 < strength <= 1:
        raise ValueError(f"strength must be in (0, 1], got {strength}")
    spec = model.spec
    n = steps or spec.steps
    lat = _as_latents(model, latents)
    pipe_cls_name = "StableDiffusionXLImg2ImgPipeline" if spec.family == "sdxl" else "StableDiffusionImg2ImgPipeline"
    key = f"refine:{pipe_cls_name}"
    pipe = model.extras.get(key)
    if pipe is None:
        import diffusers

        cls = getattr(diffusers, pipe_cls_name)
        comps = dict(model.pipe.components)
        if spec.family == "sd":
            comps.setdefault("safety_checker", None)
            comps.setdefault("feature_extractor", None)
            comps["requires_safety_checker"] = False
        pipe = cls(**comps)
        pipe.set_progress_bar_config(disable=True)
        model.extras[key] = pipe
    with model.lock, StepCounter(model.pipe) as counter, torch.inference_mode():
        t0 = time.perf_counter()
        out = pipe(
            list(prompts),
            image=lat,
            strength=strength,
            num_inference_steps=n,
            guidance_scale=spec.guidance if guidance is None else guidance,
            generator=_generators(model, seeds),
            output_type="latent",
        )
        _sync(model)
        denoise_s = time.perf_counter() - t0
    gen = Generation(latents=out.images, unet_calls=counter.calls, denoise_s=denoise_s)
    t1 = time.perf_counter()
    gen.images = decode(model, gen.latents)
    gen.decode_s = time.perf_counter() - t1
    return gen


def to_png(image: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()
