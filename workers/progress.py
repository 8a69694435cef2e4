"""Step events of streamed requests: a progress event after every denoising step and, at evenly
spaced steps, partial images decoded from the intermediate latents.

A request streams when its item carries ``meta["stream"]`` (the router sets it, with
``meta["partial_images"]`` = 0–3). Executors hand a :class:`StepReporter` to
:func:`workers.pipelines.generate` / :func:`~workers.pipelines.resume`; it sends events through
the sink bound to the worker's thread (:func:`events_to`: the worker's queue's
``publish_event``), so executors and pipelines need no transport of their own. Without a sink or
a streamed item a reporter costs nothing.

Events are plain dicts: ``{"type": "progress", "step", "steps", "level"}`` and ``{"type":
"partial", "index", "step", "steps", "level", "png"}``.

**Partial images.** While the scheduler reports its prediction of the final latent (DDIM and
Euler do, ``pred_original_sample``), that prediction is decoded, a clean preview of where the
trajectory is heading; otherwise the noisy latent itself. The decoder is the model's preview
decoder (:func:`preview_decoder`): a TAESD-style tiny autoencoder when one is configured or
available (``preview_decoder`` of the model's registry entry; ``madebyollin/taesd`` /
``madebyollin/taesdxl`` / ``madebyollin/taef1`` / ``madebyollin/taesd3`` by family; ``vae`` for
the model's own VAE), else the model's own VAE. FLUX.1's packed latents are unpacked first.
Demo models get a tiny random one (a pipeline check, like the models themselves).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from workers.messages import WorkItem

__all__ = ["StepReporter", "current_sink", "events_to", "partial_steps", "preview_decoder"]

log = logging.getLogger("argusdiff.workers")

Sink = Callable[[str, dict], None]

#: TAESD decoders by pipeline family (madebyollin/taesd: SD-1.x/2.x latents; taesdxl: SD-XL;
#: taef1: FLUX.1's 16-channel latents; taesd3: SD3's).
FAMILY_PREVIEW = {
    "sd": "madebyollin/taesd",
    "sdxl": "madebyollin/taesdxl",
    "flux": "madebyollin/taef1",
    "sd3": "madebyollin/taesd3",
}

_local = threading.local()


@contextlib.contextmanager
def events_to(sink: Sink | None) -> Iterator[None]:
    """Bind the step-event sink of this thread (a worker's queue's ``publish_event``)."""
    prev = getattr(_local, "sink", None)
    _local.sink = sink
    try:
        yield
    finally:
        _local.sink = prev


def current_sink() -> Sink | None:
    return getattr(_local, "sink", None)


def streamed(items: Sequence[WorkItem]) -> list[tuple[int, str, int]]:
    """(batch position, request id, partial images) of the items that stream."""
    out = []
    for j, item in enumerate(items):
        if item.meta.get("stream"):
            try:
                partials = max(0, min(3, int(item.meta.get("partial_images", 0))))
            except ValueError:
                partials = 0
            out.append((j, item.request_id, partials))
    return out


def partial_steps(start: int, steps: int, partials: int) -> tuple[int, ...]:
    """The steps after which partial images 0, 1, ... are decoded: evenly over the steps this run
    makes (``start`` < step < ``steps``; the last step's image is the final one, so fewer
    partials come when there are few steps, as OpenAI's API allows)."""
    run = steps - start
    if partials <= 0 or run <= 1:
        return ()
    at = sorted({start + math.ceil(run * (j + 1) / (partials + 1)) for j in range(partials)})
    return tuple(s for s in at if start < s < steps)


class _X0Tap:
    """Wraps a scheduler's ``step`` for one run to keep its latest ``pred_original_sample``."""

    def __init__(self) -> None:
        self.x0: Any = None

    @contextlib.contextmanager
    def watch(self, scheduler: Any) -> Iterator[None]:
        original = scheduler.step

        def step(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            if isinstance(out, tuple):
                self.x0 = out[1] if len(out) > 1 else None
            else:
                self.x0 = getattr(out, "pred_original_sample", None)
            return out

        scheduler.step = step
        try:
            yield
        finally:
            with contextlib.suppress(AttributeError):
                del scheduler.step  # the class's method again


class StepReporter:
    """Step events of one batch's streamed items (``items`` in batch order). A run of ``steps``
    steps that starts after ``start`` of them (a resumed cache hit starts at its K)."""

    def __init__(self, model: Any, items: Sequence[WorkItem], *, steps: int, start: int = 0, level: str = "") -> None:
        self.sink = current_sink()
        self.model = model
        self.steps = steps
        self.start = start
        self.level = level
        self.items = streamed(items) if self.sink is not None else []
        self.partials = {rid: partial_steps(start, steps, p) for _, rid, p in self.items}
        self._tap = _X0Tap()
        self.sent = 0

    @property
    def active(self) -> bool:
        return bool(self.items)

    def _emit(self, request_id: str, event: dict) -> None:
        try:
            self.sink(request_id, event)  # type: ignore[misc]
            self.sent += 1
        except Exception as exc:  # events are best effort: never fail a generation over one
            log.debug("step event for %s not sent: %s", request_id, exc)

    def watch(self, scheduler: Any) -> contextlib.AbstractContextManager:
        """Around the pipeline call: reports the scheduler's x0 predictions to :meth:`step`."""
        if not self.active:
            return contextlib.nullcontext()
        return self._tap.watch(scheduler)

    def begin(self) -> None:
        """Before the first step (a resumed run reports the K steps it skipped as done)."""
        for _, rid, _ in self.items:
            self._emit(rid, {"type": "progress", "step": self.start, "steps": self.steps, "level": self.level})

    def step(self, done: int, latents: Any) -> None:
        """After step ``done`` (of :attr:`steps`), with the batch's latents."""
        if not self.active:
            return
        due = []
        for j, rid, _ in self.items:
            self._emit(rid, {"type": "progress", "step": done, "steps": self.steps, "level": self.level})
            if done in self.partials[rid]:
                due.append((j, rid, self.partials[rid].index(done)))
        if not due:
            return
        source = self._tap.x0 if self._tap.x0 is not None else latents
        try:
            images = preview_decoder(self.model)(source[[j for j, _, _ in due]])
        except Exception as exc:  # a preview must never fail the generation
            log.warning("partial image at step %d not decoded: %s", done, exc)
            return
        from workers.pipelines import to_png

        for (_, rid, index), image in zip(due, images, strict=True):
            self._emit(rid, {"type": "partial", "index": index, "step": done, "steps": self.steps,
                             "level": self.level, "png": to_png(image)})  # fmt: skip


def preview_decoder(model: Any) -> Callable[[Any], list[Any]]:
    """``decode(latents) -> PIL images`` for partial images of ``model`` (a LoadedModel), built
    once per loaded model (see the module doc for which decoder)."""
    cached = model.extras.get("preview")
    if cached is None:
        cached = model.extras["preview"] = _build_preview(model)
    return cached


def _build_preview(model: Any) -> Callable[[Any], list[Any]]:
    from workers.pipelines import decode

    spec = model.spec
    source = getattr(spec, "preview_decoder", None)
    if source is None:
        source = "demo:tiny" if spec.source.startswith("demo:") else FAMILY_PREVIEW.get(spec.family, "vae")
    if source == "vae":
        return lambda latents: decode(model, latents)
    try:
        tiny = _tiny_autoencoder(model, source)
    except Exception as exc:
        log.warning("model %s: preview decoder %r unavailable (%s); partial images use the model's VAE",
                    spec.name, source, exc)  # fmt: skip
        return lambda latents: decode(model, latents)
    return lambda latents: decode(model, latents, vae=tiny)


def _tiny_autoencoder(model: Any, source: str) -> Any:
    import diffusers
    import torch
    from diffusers import AutoencoderTiny

    from workers.pipelines import cast
    from workers.registry import dtype_keyword

    pipe = model.pipe
    dtype = pipe.vae.dtype
    if source == "demo:tiny":
        # random weights sized to the model's latent space: a pipeline check, like demo models
        blocks = round(math.log2(pipe.vae_scale_factor)) + 1
        channels = pipe.vae.config.latent_channels
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            tiny = AutoencoderTiny(
                encoder_block_out_channels=(8,) * blocks,
                decoder_block_out_channels=(8,) * blocks,
                num_encoder_blocks=(1,) * blocks,
                num_decoder_blocks=(1,) * blocks,
                latent_channels=channels,
            )
        if dtype != torch.float32:
            cast(tiny, dtype)
    else:  # loaded in the model's dtype, not cast after (diffusers warns about casting)
        tiny = AutoencoderTiny.from_pretrained(source, **{dtype_keyword(diffusers.__version__): dtype})
    return tiny.to(device=pipe.vae.device).eval()
