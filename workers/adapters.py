"""Per-request LoRA adapters on a loaded pipeline.

A profile declares adapters per model (``[[adapters]]``: name, source, scale range;
:class:`argusdiff.domain.AdapterSpec`); a request names one (``meta["lora"]``, with
``meta["lora_scale"]`` when it chose a scale). The worker loop (:func:`run_batch`) splits a batch
into runs of one adapter and scale each (requests with different adapters are never batched
together), and runs each with that adapter active on the model:

* loaded with diffusers (``load_lora_weights(source, adapter_name=name)``) the first time, kept in
  an LRU of ``max_loaded`` adapters per loaded model (the least recently used is deleted with
  ``delete_adapters``);
* activated with ``set_adapters([name], adapter_weights=[scale])``; a run without an adapter
  disables LoRA (``disable_lora``), so no adapter leaks into it.

Pipelines derived from the model's components (SD-XL resume, edits) share its UNet, so they run
with the same adapter. The approximate-caching executor stores and looks up latents under the model
name with the adapter and scale (:func:`adapter_cache_model`): a latent made with another adapter,
or none, is never reused. The adapter switch and the run hold the model's lock together, so workers
sharing a registry never run with each other's adapter.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from workers.errors import ModelLoadError
from workers.messages import WorkItem, WorkResult

__all__ = ["AdapterSlots", "adapter_cache_model", "adapter_of", "run_batch"]


def adapter_of(item: WorkItem) -> tuple[str, float | None] | None:
    """The item's (adapter, scale or None), or None."""
    name = item.meta.get("lora")
    if not name:
        return None
    raw = item.meta.get("lora_scale")
    return name, (float(raw) if raw else None)


def adapter_cache_model(model: str, active: tuple[str, float] | None) -> str:
    """The latent cache's model name for ``model`` with the ``active`` (adapter, scale)."""
    return model if active is None else f"{model}+lora:{active[0]}@{active[1]:g}"


class AdapterSlots:
    """The adapters loaded on one pipeline (LRU of ``max_loaded``) and the one active."""

    def __init__(self, max_loaded: int = 4) -> None:
        self.max_loaded = max(1, int(max_loaded))
        self.loaded: OrderedDict[str, Any] = OrderedDict()
        self.active: tuple[str, float] | None = None
        self.enabled = True
        self.loads = 0
        self.evictions = 0

    def activate(self, pipe: Any, spec: Any | None, scale: float | None) -> tuple[str, float] | None:
        """Make ``spec`` (an AdapterSpec, at ``scale`` or its own) the only active adapter of
        ``pipe`` (None: no adapter); returns (name, scale) or None."""
        if spec is None:
            if self.loaded and self.enabled:
                pipe.disable_lora()
                self.enabled = False
            self.active = None
            return None
        scale = spec.scale if scale is None else scale
        if spec.name not in self.loaded:
            kwargs = {"adapter_name": spec.name}
            if spec.weight_name:
                kwargs["weight_name"] = spec.weight_name
            try:
                pipe.load_lora_weights(spec.source, **kwargs)
            except Exception as exc:  # a bad file or a model it does not fit: named
                raise ModelLoadError(f"adapter {spec.name!r} ({spec.source}): cannot load it: {exc}") from None
            self.loads += 1
            self.loaded[spec.name] = spec
        self.loaded.move_to_end(spec.name)
        while len(self.loaded) > self.max_loaded:  # the least recently used go
            old, _ = self.loaded.popitem(last=False)
            pipe.delete_adapters([old])
            self.evictions += 1
        if not self.enabled:
            pipe.enable_lora()
            self.enabled = True
        pipe.set_adapters([spec.name], adapter_weights=[scale])
        self.active = (spec.name, scale)
        return self.active


def _slots(model: Any, max_loaded: int) -> AdapterSlots:
    slots = model.extras.get("adapters")
    if slots is None:
        slots = model.extras["adapters"] = AdapterSlots(max_loaded)
    slots.max_loaded = max(1, int(max_loaded))  # the executor's setting (one per deployment)
    return slots


@contextlib.contextmanager
def _with_adapter(executor: Any, key: tuple[str, float | None] | None) -> Iterator[None]:
    """``executor``'s model with adapter ``key`` active (its lock held), or none."""
    adapters = getattr(executor, "adapters", None) or {}
    if key is None and not adapters:
        yield  # a model without adapters: nothing to switch, nothing to lock
        return
    spec = None
    if key is not None:
        spec = adapters.get(key[0])
        if spec is None:
            raise ModelLoadError(f"adapter {key[0]!r} is not declared for model {executor.model!r}")
    model = executor.loaded
    with model.lock:
        executor.active_adapter = _slots(model, getattr(executor, "max_adapters", 4)).activate(
            model.pipe, spec, None if key is None else key[1]
        )
        try:
            yield
        finally:
            executor.active_adapter = None


def run_batch(executor: Any, items: Sequence[WorkItem], run: Callable[[Any, Sequence[WorkItem]], list[WorkResult]]):
    """``run(executor, items)``, one run per adapter and scale (in the order they first appear), the
    results in the items' order. Stand-ins (no registry) run the batch as it is."""
    keys = [adapter_of(item) for item in items]
    if getattr(executor, "registry", None) is None or (not any(keys) and not getattr(executor, "adapters", None)):
        return run(executor, items)
    out: list[WorkResult | None] = [None] * len(items)
    for key in dict.fromkeys(keys):
        idx = [i for i, k in enumerate(keys) if k == key]
        with _with_adapter(executor, key):
            for i, res in zip(idx, run(executor, [items[i] for i in idx]), strict=True):
                out[i] = res
    return out
