"""Model construction is serialised process-wide (argusdiff.loading.MODEL_BUILD_LOCK).

diffusers' from_pretrained patches torch.nn.Module.register_parameter for the whole process
while it builds a pipeline; without the lock, a discriminator built on another thread meanwhile
gets meta-device parameters and ignores its weights (seen in the service: worker threads load
pipelines while the cascade judge loads). Measured without the lock: 79 of 200 timm models built
next to a looping pipeline load came out on the meta device.
"""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("timm")


def test_models_built_during_a_pipeline_load_on_another_thread_are_real(demo_models_dir):
    from classifiers.discriminator import Discriminator
    from workers.registry import ModelRegistry

    reg = ModelRegistry(models_dir=demo_models_dir, device="cpu")
    spec = reg.spec("demo-tiny-sd")
    reg.local_path(spec)  # build the demo model once, outside the race
    stop = threading.Event()
    loads = []

    def loader() -> None:
        while not stop.is_set():
            reg.unload(spec.name)
            reg.load(spec.name)
            loads.append(1)

    t = threading.Thread(target=loader, daemon=True)
    t.start()
    try:
        built = 0
        meta = 0
        while built < 25 or len(loads) < 3:
            disc = Discriminator.new("test_efficientnet", image_size=32)
            built += 1
            meta += any(p.is_meta for p in disc.model.parameters())
            if built > 2000:
                break
    finally:
        stop.set()
        t.join(timeout=120)
    assert len(loads) >= 3, "the pipeline loader never ran concurrently"
    assert meta == 0, f"{meta} of {built} discriminators were built with meta-device parameters"
