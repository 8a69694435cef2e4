"""Approximate caching on tiny real diffusers pipelines: capture after K, exact resume, the AC
executor's cache path (hit, miss + store, mismatch, outage)."""

from __future__ import annotations

import numpy as np
import pytest

from argusdiff.domain import ApproxLevel, Strategy
from workers.messages import WorkItem

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("model_name", ["demo-tiny-sd", "demo-tiny-sdxl"])
def test_resume_from_step_k_reproduces_the_full_run_exactly(demo_registry, model_name):
    import torch

    from workers.pipelines import generate, resume

    model = demo_registry.load(model_name)
    n = model.spec.steps
    full = generate(model, ["a red cube on a table"], [11], capture=(2, 4))
    assert full.unet_calls == n
    assert sorted(full.captured) == [2, 4]
    for k in (2, 4):
        res = resume(model, ["a red cube on a table"], full.captured[k], k, [11])
        assert res.unet_calls == n - k
        assert torch.equal(res.latents, full.latents)
        assert np.array_equal(np.asarray(res.images[0]), np.asarray(full.images[0]))
    other = resume(model, ["a blue ball in the snow"], full.captured[4], 4, [11])
    assert not torch.equal(other.latents, full.latents)  # the new prompt steers the last N-K steps


def test_resume_batch_of_two_latents(demo_registry):
    import torch

    from workers.pipelines import generate, resume

    model = demo_registry.load("demo-tiny-sd")
    full = generate(model, ["one", "two"], [1, 2], capture=(3,))
    res = resume(model, ["one", "two"], full.captured[3], 3, [1, 2])
    assert res.unet_calls == model.spec.steps - 3
    assert torch.equal(res.latents, full.latents)


def test_ancestral_scheduler_is_refused_for_ac(demo_models_dir):
    from workers.errors import UnsupportedScheduler
    from workers.pipelines import generate, resume
    from workers.registry import ModelRegistry

    reg = ModelRegistry(
        device="cpu",
        models_dir=demo_models_dir,
        overrides={"demo-tiny-sd": {"scheduler": "EulerAncestralDiscreteScheduler"}},
    )
    model = reg.load("demo-tiny-sd")
    with pytest.raises(UnsupportedScheduler, match="EulerAncestralDiscreteScheduler"):
        generate(model, ["x"], [0], capture=(2,))
    with pytest.raises(UnsupportedScheduler, match="DDIMScheduler, EulerDiscreteScheduler"):
        resume(model, ["x"], np.zeros((1, 4, 32, 32), np.float16), 2, [0])
    # plain generation (no capture) still works with it
    assert generate(model, ["x"], [0]).unet_calls == model.spec.steps


def test_resume_rejects_a_latent_of_the_wrong_shape(demo_registry):
    from workers.errors import LatentMismatch
    from workers.pipelines import resume

    model = demo_registry.load("demo-tiny-sdxl")
    with pytest.raises(LatentMismatch, match="shape"):
        resume(model, ["x"], np.zeros((1, 4, 16, 16), np.float16), 2, [0])


def _level(k: int) -> ApproxLevel:
    return ApproxLevel(
        id=f"xl-k{k}",
        strategy=Strategy.AC,
        model="demo-tiny-sdxl",
        steps=8,
        skip=k,
        latency_s={1: 0.1},
        quality=1.0,
        load_time_s=0.1,
    )


def test_ac_executor_miss_stores_then_similar_prompt_hits(demo_registry, memory_cache, hash_embedder):
    from workers.ac import ApproxCacheExecutor

    full = ApproxCacheExecutor(_level(0), demo_registry, cache=memory_cache, embed=hash_embedder, capture_ks=(2, 4))
    first = full.run([WorkItem("r1", "a red cube on a wooden table", "xl-k0", seed=5)])[0]
    assert first.ok and not first.cache_hit and first.k_used == 0 and first.unet_calls == 8
    assert memory_cache.stores == 1
    _, latents, meta = memory_cache.entries[0]
    assert sorted(latents) == [2, 4] and latents[4].dtype == np.float16
    assert (meta.model, meta.scheduler, meta.steps, tuple(meta.shape)) == (
        "demo-tiny-sdxl",
        "EulerDiscreteScheduler",
        8,
        (4, 32, 32),
    )

    k4 = ApproxCacheExecutor(_level(4), demo_registry, cache=memory_cache, embed=hash_embedder)
    res = k4.run(
        [
            WorkItem("r2", "a red cube on a wooden table", "xl-k4", seed=5),
            WorkItem("r3", "completely unrelated words here", "xl-k4", seed=6),
        ]
    )
    hit, miss = res
    assert hit.ok and hit.cache_hit and hit.k_used == 4 and hit.unet_calls == 4
    assert hit.timings["cache_lookup_s"] > 0 and hit.timings["latent_fetch_s"] > 0
    assert miss.ok and not miss.cache_hit and miss.k_used == 0 and miss.unet_calls == 8
    assert k4.stats["hits"] == 1 and k4.stats["misses"] == 1
    assert memory_cache.stores == 2  # the miss stored its own latents


def test_ac_executor_ignores_latents_of_another_trajectory(demo_registry, memory_cache, hash_embedder):
    from cache.api import LatentMeta
    from workers.ac import ApproxCacheExecutor

    emb = hash_embedder(["a cat"])[0]
    bad = LatentMeta(model="demo-tiny-sdxl", scheduler="EulerDiscreteScheduler", steps=50, k=4, shape=(4, 32, 32))
    memory_cache.store(emb, {4: np.zeros((4, 32, 32), np.float16)}, bad)
    ex = ApproxCacheExecutor(_level(4), demo_registry, cache=memory_cache, embed=hash_embedder)
    res = ex.run([WorkItem("r", "a cat", "xl-k4", seed=1)])[0]
    assert res.ok and not res.cache_hit and res.unet_calls == 8
    assert ex.stats["mismatches"] == 1


def test_ac_executor_serves_through_a_cache_outage(demo_registry, memory_cache, hash_embedder):
    from workers.ac import ApproxCacheExecutor

    memory_cache.broken = True
    ex = ApproxCacheExecutor(_level(2), demo_registry, cache=memory_cache, embed=hash_embedder)
    res = ex.run([WorkItem("r", "a dog", "xl-k2", seed=1)])[0]
    assert res.ok and not res.cache_hit and res.unet_calls == 8
    assert res.cache_error and "down" in res.cache_error
    assert ex.stats["cache_errors"] == 1


def test_ac_executor_without_cache_runs_full(demo_registry):
    from workers.ac import ApproxCacheExecutor

    ex = ApproxCacheExecutor(_level(4), demo_registry)
    res = ex.run([WorkItem("r", "a dog", "xl-k4")])[0]
    assert res.ok and res.k_used == 0 and res.unet_calls == 8 and res.seed is not None
    assert res.image_png.startswith(b"\x89PNG")


def test_concurrent_runs_on_one_loaded_model_do_not_interfere(demo_registry):
    """Workers sharing a registry in one process share pipelines; runs are serialised per model."""
    import threading

    import torch

    from workers.pipelines import generate, resume

    model = demo_registry.load("demo-tiny-sdxl")
    full = generate(model, ["a red cube"], [5], capture=(4,), decode_images=False)
    out: dict[str, torch.Tensor] = {}

    def run_full():
        out["full"] = generate(model, ["a red cube"], [5], decode_images=False).latents

    def run_resume():
        out["resume"] = resume(model, ["a red cube"], full.captured[4], 4, [5], decode_images=False).latents

    threads = [threading.Thread(target=f) for f in (run_full, run_resume, run_full)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert torch.equal(out["full"], full.latents) and torch.equal(out["resume"], full.latents)
