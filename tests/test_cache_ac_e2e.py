"""Approximate caching end to end: tiny SD-XL pipeline -> MiniLM embedding -> HNSW index -> S3 server."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_tiny_sdxl_serves_ac_requests_through_index_and_s3(make_latent_cache, tmp_path, monkeypatch):
    encode = pytest.importorskip("traces.embeddings", reason="MiniLM prompt encoder unavailable").encode_prompts
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    from argusdiff.profile import load_profile
    from workers.ac import ApproxCacheExecutor, ac_capture_ks
    from workers.messages import WorkItem
    from workers.registry import ModelRegistry

    torch.set_num_threads(1)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = make_latent_cache(store="s3", dim=384)
    profile = load_profile("demo-cpu")
    full = next(lv for lv in profile.levels if lv.strategy.value == "ac" and lv.skip == 0)
    k4 = next(lv for lv in profile.levels if lv.strategy.value == "ac" and lv.skip == 4)
    registry = ModelRegistry(models_dir=str(tmp_path / "models"))

    base = ApproxCacheExecutor(full, registry, cache=cache, capture_ks=ac_capture_ks(profile, full), embed=encode)
    (first,) = base.run([WorkItem("r1", "a red fox in fresh snow, golden hour", full.id, seed=1)])
    assert first.ok and not first.cache_hit and first.cache_error is None
    assert cache.usage()["latents_by_k"] == {2: 1, 4: 1}
    assert len(list(cache.blobs.keys())) == 2  # both latents are objects on the S3 server

    fast = ApproxCacheExecutor(k4, registry, cache=cache, embed=encode, store=False)
    (second,) = fast.run([WorkItem("r2", "a red fox in fresh snow at golden hour", k4.id, seed=2)])
    assert second.ok and second.cache_hit and second.k_used == 4 and second.cache_error is None
    assert second.unet_calls * full.steps == first.unet_calls * (full.steps - 4)  # only N - K steps ran
    assert second.timings["latent_fetch_s"] > 0
    snap = cache.stats.snapshot()
    assert snap["hits"] == 1 and snap["errors"] == 0

    (third,) = fast.run([WorkItem("r3", "a spreadsheet of quarterly tax figures", k4.id, seed=3)])
    assert third.ok and not third.cache_hit and third.unet_calls == first.unet_calls  # a miss runs all N
