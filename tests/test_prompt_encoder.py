"""``[cache] encoder = "clip"``: prompts embedded by the serving model's own CLIP text encoder, the
same vectors from the loaded pipeline (workers) and from the model folder alone (the router)."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures_service import assert_repeat_prompt_resumes, demo_model_settings, service_settings

pytest.importorskip("diffusers")

pytestmark = pytest.mark.integration

PROMPTS = ["a lighthouse on a cliff in a storm", "a bowl of ramen, studio photo", ""]


@pytest.mark.parametrize(("model", "family"), [("demo-tiny-sdxl", "sdxl"), ("demo-tiny-sd", "sd")])
def test_pipeline_and_folder_give_the_same_normalised_embeddings(demo_registry, model, family):
    from workers.prompt_encoder import ClipPromptEncoder

    loaded = demo_registry.load(model)
    from_pipe = ClipPromptEncoder.from_pipeline(loaded.pipe)
    from_folder = ClipPromptEncoder.from_pretrained(demo_registry.local_path(demo_registry.spec(model)), family=family)
    assert from_pipe.projected == (family == "sdxl") and from_pipe.dim == from_folder.dim == 32
    a, b = from_pipe(PROMPTS), from_folder(PROMPTS)
    assert a.shape == (3, 32) and a.dtype == np.float32
    np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(a, from_pipe(PROMPTS))  # deterministic
    assert not np.allclose(a[0], a[1])
    assert from_pipe([]).shape == (0, 32)
    long = from_pipe(["word " * 500])  # truncated at the tokenizer's 77 tokens, as the pipeline does
    assert long.shape == (1, 32) and np.isfinite(long).all()


def test_a_wrong_embedding_dim_is_a_clear_error_at_service_start(demo_models_dir, tmp_path):
    from argusdiff.config import Settings
    from argusdiff.errors import ConfigError
    from argusdiff.service.app import Service

    base = service_settings("demo-cpu", policy="nirvana", stand_in_scale=None, workers=1).model_dump()
    base["workers"].update(models_dir=demo_models_dir, device="cpu", torch_threads=1)
    base["cache"].update(path=str(tmp_path / "cache"), encoder="clip", embedding_dim=32, index="hnsw")
    base["cache"]["embedding_dim"] = 384
    with pytest.raises(ConfigError, match=r"embedding_dim = 32"):
        Service(Settings.model_validate(base))


@pytest.mark.slow
def test_nirvana_live_with_clip_embeddings(demo_models_dir, tmp_path, live_service):

    server = live_service(demo_model_settings(demo_models_dir, tmp_path / "cache", encoder="clip", embedding_dim=32))
    assert_repeat_prompt_resumes(server)
    executors = server.service.workers[0].worker._executors
    assert sum(ex.stats["embedded"] for ex in executors.values()) == 0  # the router's CLIP vectors
    assert server.service.cache.index.dim == 32


def test_ac_executor_embeds_with_the_pipeline_text_encoder(demo_registry, make_latent_cache):
    from argusdiff.profile import load_profile
    from workers.ac import ApproxCacheExecutor, ac_capture_ks
    from workers.messages import WorkItem

    profile = load_profile("demo-cpu")
    cache = make_latent_cache(dim=32)
    full, k4 = profile.level("xl-k0"), profile.level("xl-k4")
    base = ApproxCacheExecutor(
        full, demo_registry, cache=cache, capture_ks=ac_capture_ks(profile, full), encoder="clip"
    )
    assert base.run([WorkItem("a", PROMPTS[0], full.id, seed=1)])[0].ok
    fast = ApproxCacheExecutor(k4, demo_registry, cache=cache, encoder="clip", store=False)
    res = fast.run([WorkItem("b", PROMPTS[0], k4.id, seed=2)])[0]
    assert res.ok and res.cache_hit and res.k_used == 4
    assert base.stats["embedded"] == 1 and fast.stats["embedded"] == 1
