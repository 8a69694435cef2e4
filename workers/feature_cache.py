"""Feature caches as approximation levels: a diffusers cache hook applied to a loaded model's
denoiser for one run, then removed.

diffusers (0.42) ships caches that reuse a transformer's intermediate features across denoising
steps instead of recomputing them: First Block Cache (``first_block``: when the first block's
residual changes less than ``threshold`` from the previous step, the other blocks' residuals are
reused), FasterCache, MagCache, TaylorSeer and Pyramid Attention Broadcast. Each trades quality for
speed inside one run, with no model switch: exactly what an approximation level is. A profile level
names one (``feature_cache = { method = "first_block", threshold = 0.08 }``, see
:data:`argusdiff.domain.FEATURE_CACHE_METHODS`); :func:`applied` enables it on the denoiser
(``enable_cache``, the models' ``CacheMixin``), resets its state so that no run sees another's
features, and disables it afterwards, so the same loaded model serves its other levels unchanged.

How much a cache saved is measured, not taken from the hook: :class:`AttentionCounter` counts the
calls of the denoiser's attention query projections (``to_q``). A skipped block, a broadcast
attention or a TaylorSeer prediction does not call them, so ``1 - calls with the cache / calls
without it`` is the share of attention work the cache skipped (``feature_cache_hit_rate``).

The config's fields come from the profile; ``num_inference_steps`` (MagCache) defaults to the
run's N and ``current_timestep_callback`` (FasterCache, PAB) to the pipeline's current timestep;
a field ending in ``dtype`` is a torch dtype name. torch and diffusers are imported by the caller's
first use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from workers.errors import WorkerError

__all__ = ["AttentionCounter", "applied", "build_config", "denoiser", "supports_feature_cache"]


def denoiser(pipe: Any) -> Any:
    """A pipeline's denoising network: ``transformer`` (DiTs: FLUX.1, SD3) or ``unet`` (here, where
    the cache hooks attach; :mod:`workers.pipelines` uses it too)."""
    net = getattr(pipe, "transformer", None)
    return net if net is not None else pipe.unet


def _methods() -> Mapping[str, str]:
    from argusdiff.domain import FEATURE_CACHE_METHODS

    return FEATURE_CACHE_METHODS


def supports_feature_cache(pipe: Any) -> bool:
    """Whether the pipeline's denoiser takes diffusers' cache hooks (``enable_cache``)."""
    return callable(getattr(denoiser(pipe), "enable_cache", None))


def build_config(spec: Mapping[str, Any], pipe: Any, steps: int) -> Any:
    """The diffusers config object of a level's ``feature_cache`` table."""
    import diffusers
    import torch

    method = spec.get("method")
    methods = _methods()
    if method not in methods:
        raise WorkerError(f"feature_cache.method must be one of {', '.join(methods)}, got {method!r}")
    cls = getattr(diffusers, methods[method])
    fields = getattr(cls, "__dataclass_fields__", {})
    params: dict[str, Any] = {}
    for key, value in spec.items():
        if key == "method":
            continue
        if key.endswith("dtype") and isinstance(value, str):
            value = getattr(torch, value, None)
            if not isinstance(value, torch.dtype):
                raise WorkerError(f"feature_cache.{key}: {spec[key]!r} is not a torch dtype")
        params[key] = tuple(value) if isinstance(value, list) else value
    if "num_inference_steps" in fields:
        params.setdefault("num_inference_steps", steps)
    if "current_timestep_callback" in fields:
        params.setdefault("current_timestep_callback", lambda: pipe.current_timestep)
    try:
        return cls(**params)
    except TypeError as exc:
        raise WorkerError(f"feature_cache ({method}): {exc}") from None


class AttentionCounter:
    """Counts calls of the denoiser's attention query projections (``to_q``) while open."""

    def __init__(self, pipe: Any) -> None:
        self.calls = 0
        self._handles = [
            module.register_forward_pre_hook(self._hook)
            for name, module in denoiser(pipe).named_modules()
            if name.endswith(".to_q")
        ]
        self.modules = len(self._handles)

    def _hook(self, *_: Any) -> None:
        self.calls += 1

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()

    def __enter__(self) -> AttentionCounter:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


@contextlib.contextmanager
def applied(
    model: Any, spec: Mapping[str, Any] | None, steps: int, pipe: Any = None
) -> Iterator[AttentionCounter | None]:
    """Within the block, ``model``'s denoiser runs with the feature cache ``spec`` (None: as it
    is); yields an :class:`AttentionCounter` (None without a cache). ``pipe``: the pipeline that
    runs it when it is not ``model.pipe`` (an edit's img2img/inpainting pipeline over the same
    denoiser: its current timestep is the one the caches that ask for it read). Callers hold
    ``model.lock``."""
    if not spec:
        yield None
        return
    net = denoiser(model.pipe)
    if not supports_feature_cache(model.pipe):
        raise WorkerError(
            f"model {model.spec.name!r}: its denoiser ({type(net).__name__}) takes no diffusers feature cache "
            f"(feature_cache {spec.get('method')!r})"
        )
    config = build_config(spec, model.pipe if pipe is None else pipe, steps)
    if getattr(net, "is_cache_enabled", False):  # left by a run that died mid-way
        net.disable_cache()
    net.enable_cache(config)
    try:
        net._reset_stateful_cache()
        with AttentionCounter(model.pipe) as counter:
            yield counter
    finally:
        net.disable_cache()
