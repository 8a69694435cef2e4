"""Cascade execution with a tiny timm discriminator, inline heavy runs and heavy-from-light-latent."""

from __future__ import annotations

import pytest

from workers.demo import load_demo_profile
from workers.messages import WorkItem

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny_discriminator():
    from classifiers.discriminator import Discriminator

    return Discriminator.new("test_efficientnet", image_size=32, light="sd-light")


@pytest.fixture
def cascade_profile():
    return load_demo_profile("demo-cpu-cascade")


def _cascade(profile, registry, judge, threshold, **kw):
    from workers.cascade import CascadeExecutor

    return CascadeExecutor(
        profile.level("sd-light"), profile.level("sd-heavy"), registry, judge=judge, threshold=threshold, **kw
    )


def test_discriminator_judges_light_images(demo_registry, cascade_profile, tiny_discriminator):
    items = [WorkItem(f"r{i}", p, "sd-light", seed=i) for i, p in enumerate(["a cat", "a dog", "a boat"])]
    accept_all = _cascade(cascade_profile, demo_registry, tiny_discriminator, 0.0)
    res = accept_all.run(items)
    assert all(r.ok and r.level == "sd-light" and not r.deferred and 0 <= r.confidence <= 1 for r in res)
    defer_all = _cascade(cascade_profile, demo_registry, tiny_discriminator, 1.0)
    res = defer_all.run(items)
    # serving mode: the light image comes back with a hand-off to the heavy level (the router's
    # policy decides whether the heavy level redoes it)
    assert all(r.handoff is not None and r.handoff.level == "sd-heavy" for r in res)
    assert all(r.level == "sd-light" and r.image_png is not None and not r.deferred for r in res)
    assert defer_all.stats == {"accepted": 0, "deferred": 3}


def test_inline_heavy_and_heavy_from_light_latent(demo_registry, cascade_profile):
    plain = _cascade(cascade_profile, demo_registry, lambda img: 0.0, 0.5, inline_heavy=True)
    res = plain.run([WorkItem("r", "a cat", "sd-light", seed=3)])[0]
    assert res.ok and res.deferred and res.level == "sd-heavy" and res.unet_calls == 1 + 8
    refine = _cascade(cascade_profile, demo_registry, lambda img: 0.0, 0.5, inline_heavy=True, refine_strength=0.5)
    res = refine.run([WorkItem("r", "a cat", "sd-light", seed=3)])[0]
    assert res.ok and res.deferred and res.unet_calls == 1 + 4  # the heavy model runs strength x N steps


def test_heavy_from_light_needs_a_shared_latent_space(demo_registry, cascade_profile):
    from dataclasses import replace

    from workers.cascade import CascadeExecutor

    heavy = replace(cascade_profile.level("sd-heavy"), model="demo-tiny-sdxl")
    with pytest.raises(ValueError, match="compatible"):
        CascadeExecutor(
            cascade_profile.level("sd-light"),
            heavy,
            demo_registry,
            judge=lambda i: 1.0,
            threshold=0.5,
            refine_strength=0.5,
        )


def test_judge_must_answer_per_image(demo_registry, cascade_profile):
    from workers.cascade import as_judge

    with pytest.raises(TypeError, match="confidence"):
        as_judge(42)
    bad = _cascade(cascade_profile, demo_registry, type("J", (), {"confidence": lambda self, imgs: [0.5]})(), 0.5)
    with pytest.raises(ValueError, match="1 confidences for 2 images"):
        bad.run([WorkItem("a", "x", "sd-light"), WorkItem("b", "y", "sd-light")])
