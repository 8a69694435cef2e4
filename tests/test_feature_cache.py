"""Feature caches as approximation levels: a diffusers cache hook (First Block Cache, TaylorSeer,
...) applied to a loaded tiny FLUX.1-shaped model for one run and removed after; profiles that
name one; the executors, ``argusdiff generate`` and ``argusdiff serve`` on ``demo-cpu-flux``."""

from __future__ import annotations

import json

import pytest

from argusdiff.domain import ApproxLevel, Strategy
from argusdiff.errors import ProfileError
from workers.messages import WorkItem

FBC = {"method": "first_block", "threshold": 0.3}


def _level(**kw) -> ApproxLevel:
    base = dict(id="flux-fbc", strategy=Strategy.AC, model="demo-tiny-flux", steps=4, skip=0,
                latency_s={1: 0.1}, quality=0.98, load_time_s=0.1, feature_cache=FBC)  # fmt: skip
    return ApproxLevel(**(base | kw))


@pytest.mark.integration
def test_a_feature_cache_skips_work_and_leaves_the_model_as_it_was(demo_registry):
    import torch

    from workers.pipelines import denoiser, generate

    model = demo_registry.load("demo-tiny-flux")
    plain = generate(model, ["a red cube"], [1], steps=8)
    assert plain.feature_cache_hit_rate is None
    cached = generate(model, ["a red cube"], [1], steps=8, feature_cache=FBC)
    assert cached.unet_calls == 8  # every step still calls the transformer; its blocks are skipped
    assert 0.0 < cached.feature_cache_hit_rate < 1.0
    assert not torch.equal(cached.latents, plain.latents)  # an approximation
    again = generate(model, ["a red cube"], [1], steps=8, feature_cache=FBC)
    assert torch.equal(again.latents, cached.latents)  # no state leaks from one run to the next
    assert not denoiser(model.pipe).is_cache_enabled
    assert torch.equal(generate(model, ["a red cube"], [1], steps=8).latents, plain.latents)
    strict = generate(model, ["a red cube"], [1], steps=8, feature_cache={"method": "first_block", "threshold": 0.0})
    assert strict.feature_cache_hit_rate == 0.0 and torch.equal(strict.latents, plain.latents)
    taylor = {"method": "taylorseer", "cache_interval": 2, "disable_cache_before_step": 2,
              "taylor_factors_dtype": "float32"}  # fmt: skip
    assert generate(model, ["a red cube"], [1], steps=8, feature_cache=taylor).feature_cache_hit_rate > 0


@pytest.mark.integration
def test_feature_cache_errors_name_the_problem(demo_registry):
    from workers.errors import WorkerError
    from workers.pipelines import generate

    flux = demo_registry.load("demo-tiny-flux")
    with pytest.raises(WorkerError, match=r"first_block.*unexpected keyword"):
        generate(flux, ["x"], [0], steps=2, feature_cache={"method": "first_block", "thresh": 0.1})
    sd3 = demo_registry.load("demo-tiny-sd3")  # diffusers 0.42's SD3 transformer has no enable_cache
    with pytest.raises(WorkerError, match=r"SD3Transformer2DModel\) takes no diffusers feature cache"):
        generate(sd3, ["x"], [0], steps=2, feature_cache=FBC)


@pytest.mark.integration
def test_executors_run_a_feature_cache_level_without_touching_the_latent_cache(
    demo_registry, memory_cache, hash_embedder
):
    from workers.ac import ApproxCacheExecutor
    from workers.sm import ModelExecutor

    level = _level()
    ac = ApproxCacheExecutor(level, demo_registry, cache=memory_cache, embed=hash_embedder, capture_ks=(2,))
    assert ac.capture_ks == () and not ac.store_latents
    res = ac.run([WorkItem("r1", "a castle", level.id, seed=1), WorkItem("r2", "a boat", level.id, seed=2)])
    assert all(r.ok and r.image_png and not r.cache_hit and r.unet_calls == 4 for r in res)
    assert 0 < res[0].timings["feature_cache_hit_rate"] < 1
    assert memory_cache.lookups == 0 and memory_cache.stores == 0
    sm = ModelExecutor(level, demo_registry).run([WorkItem("r3", "a castle", level.id, seed=1)])[0]
    assert sm.ok and "feature_cache_hit_rate" in sm.timings


def test_profiles_validate_feature_cache_levels():
    from argusdiff.profile import parse_profile

    def profile(**level):
        raw = {"id": "a", "strategy": "ac", "model": "m", "steps": 8, "latency_s": 1.0, "quality": 1.0,
               "load_time_s": 1.0} | level  # fmt: skip
        return parse_profile({"name": "p", "gpu": "x", "levels": [raw]}, source="p.toml")

    lv = profile(feature_cache={"method": "first_block", "threshold": 0.08}).levels[0]
    assert lv.feature_cache == {"method": "first_block", "threshold": 0.08}
    with pytest.raises(ProfileError, match=r"feature_cache.method' must be one of first_block"):
        profile(feature_cache={"method": "teacache"})
    with pytest.raises(ProfileError, match="needs strategy 'ac' with K = 0"):
        profile(feature_cache={"method": "first_block"}, skip=2)
    with pytest.raises(ProfileError, match="needs strategy 'ac' with K = 0"):
        profile(feature_cache={"method": "first_block"}, strategy="sm")
    with pytest.raises(ProfileError, match=r"feature_cache.x' must be a number"):
        profile(feature_cache={"method": "first_block", "x": {"y": 1}})


def test_demo_flux_profile_shares_one_worker_across_ac_and_feature_cache_levels():
    from argusdiff.profile import load_profile

    prof = load_profile("demo-cpu-flux")
    full, fbc, k2 = prof.level("flux-k0"), prof.level("flux-fbc"), prof.level("flux-k2")
    assert fbc.feature_cache["method"] == "first_block"
    assert fbc.shares_worker_with(full) and fbc.shares_worker_with(k2)  # switching loads nothing
    assert not fbc.shares_worker_with(prof.level("schnell"))
    assert prof.ac_base("flux-k2") is full  # a miss runs the plain full run, not the cached one


@pytest.mark.integration
@pytest.mark.parametrize("level", ["flux-k0", "flux-fbc", "flux-k2", "schnell"])
def test_generate_runs_every_level_kind_of_the_dit_demo(level, monkeypatch, demo_models_dir, tmp_path, capsys):
    from argusdiff.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ARGUSDIFF_MODELS_DIR", demo_models_dir)
    monkeypatch.setenv("ARGUSDIFF_WORKERS__TORCH_THREADS", "1")
    out = tmp_path / "img.png"
    assert main(["generate", "a harbour at dawn", "--profile", "demo-cpu-flux", "--level", level,
                 "--out", str(out), "--seed", "3", "--json"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert out.read_bytes().startswith(b"\x89PNG") and result["level"] == level
    assert result["unet_calls"] == {"flux-k0": 8, "flux-fbc": 8, "flux-k2": 8, "schnell": 2}[level]


def test_an_edit_on_a_feature_cache_level_runs_with_its_cache(demo_registry):
    """diffusers' FLUX img2img pipeline names no cache context; the edit runs in one, with the
    level's First Block Cache: the same steps, part of the attention work skipped, the model left
    as it was (an edit without the cache afterwards equals one before)."""
    import numpy as np
    from PIL import Image

    from workers.edits import edit

    model = demo_registry.load("demo-tiny-flux")
    img = Image.new("RGB", (64, 64), (200, 30, 30))
    plain, calls, *_, rate = edit(model, "make it blue", img, 3, strength=0.75)
    assert (calls, rate) == (6, None)
    fbc = {"method": "first_block", "threshold": 0.3}
    cached, calls, *_, rate = edit(model, "make it blue", img, 3, strength=0.75, feature_cache=fbc)
    assert calls == 6 and 0.0 < rate < 1.0 and not np.array_equal(np.asarray(plain), np.asarray(cached))
    again, *_ = edit(model, "make it blue", img, 3, strength=0.75)
    assert np.array_equal(np.asarray(plain), np.asarray(again))
