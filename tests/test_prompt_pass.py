"""One text-encoder pass per prompt: the level classifier and the cache-similarity view share the
MiniLM encoder when they are the same model (the default), and the router sends each prompt through
that one pass."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from fixtures_classifiers import tiny_bert  # noqa: F401 - fixture
from fixtures_service import service_settings

LEVELS = ("xl-k0", "xl-k2", "xl-k4")
PROMPTS = [
    "a red fox sleeping in fresh snow, golden hour",
    "a red fox asleep in the snow at golden hour",
    "quarterly revenue spreadsheet with pie charts",
    "cyberpunk street market at night, neon signs, rain, 35mm photo, highly detailed",
    "a watercolor of a lighthouse",
]


def _store(cache, vec, model="demo-tiny-sdxl"):
    from cache.api import LatentMeta

    latents = {2: np.zeros((4, 8, 8), dtype=np.float16)}
    cache.store(vec, latents, LatentMeta(model, "EulerDiscreteScheduler", 8, 2, (4, 8, 8)))


def test_the_default_classifier_and_cache_share_one_minilm_pass(latent_cache):
    """A classifier on the packaged MiniLM (frozen encoder, mean pooling: the training defaults) and
    the cache's default MiniLM encoder are one encoder: one pass per prompt gives the classifier's
    own levels and the sentence encoder's embeddings."""
    pytest.importorskip("transformers")
    from argusdiff.service.prompt_pass import PromptPass
    from argusdiff.service.similarity import CacheSimilarity
    from classifiers.level import BatchedClassifier, LevelClassifier
    from traces.embeddings import get_encoder

    embed = get_encoder(use_cache=False).encode
    clf = LevelClassifier.new(LEVELS, seed=3)
    _store(latent_cache, embed([PROMPTS[0]])[0])
    batched = BatchedClassifier(clf, max_wait_s=0.05)
    view = CacheSimilarity(latent_cache, model="demo-tiny-sdxl", embed=embed)
    pp = PromptPass(batched, view, max_wait_s=0.05)
    try:
        assert pp.sharing()[0], pp.sharing()[1]
        futures = [pp.submit(p, lookup=(i != 4)) for i, p in enumerate(PROMPTS)]
        readings = [f.result(60) for f in futures]
        assert pp.encoded == len(PROMPTS) == pp.prompts  # one encoder pass per prompt
        assert [r.optimal for r in readings] == clf.predict(PROMPTS)  # the classifier's own answers
        vecs = embed(PROMPTS)
        for r, v in zip(readings, vecs, strict=True):
            assert float(r.embedding @ v) > 0.9999  # the sentence encoder's embedding
        sims = [r.similarity for r in readings]
        assert sims[0] == pytest.approx(1.0, abs=1e-3)
        assert sims[2] < sims[1] < sims[0]
        assert sims[4] is None and not readings[4].looked_up  # asked not to look up: classified only
        assert readings[4].optimal in LEVELS and readings[4].embedding is not None
    finally:
        pp.close()
        batched.close()
        view.close()


def test_different_encoders_are_not_shared_and_each_runs(tiny_bert, latent_cache):  # noqa: F811
    """A classifier on another encoder (a tiny BERT here) cannot share the cache's MiniLM: the pass
    runs both encoders, with the same answers as each alone; a failing index fails only the lookup."""
    pytest.importorskip("transformers")
    from argusdiff.service.prompt_pass import PromptPass, shares_encoder
    from argusdiff.service.similarity import CacheSimilarity
    from cache.api import CacheUnavailable
    from classifiers.level import BatchedClassifier, LevelClassifier
    from traces.embeddings import PromptEncoder, get_encoder

    embed = get_encoder(use_cache=False).encode
    clf = LevelClassifier.new(LEVELS, backbone=str(tiny_bert), max_length=32, seed=1)
    shared, why = shares_encoder(clf, embed)
    assert not shared and "32-d" in why and "384-d" in why
    # the same tiny BERT as a sentence encoder: one encoder after all
    assert shares_encoder(clf, PromptEncoder(tiny_bert, max_length=32, use_cache=False))[0]

    _store(latent_cache, embed([PROMPTS[0]])[0])
    batched = BatchedClassifier(clf, max_wait_s=0.05)
    view = CacheSimilarity(latent_cache, model="demo-tiny-sdxl", embed=embed)
    pp = PromptPass(batched, view, max_wait_s=0.05)
    try:
        readings = [f.result(60) for f in [pp.submit(p) for p in PROMPTS]]
        assert pp.encoded == 2 * len(PROMPTS)
        assert [r.optimal for r in readings] == clf.predict(PROMPTS)
        assert readings[0].similarity == pytest.approx(1.0, abs=1e-3)

        def down(vec, model=None):
            raise CacheUnavailable("index timed out")

        latent_cache.nearest = down
        r = pp.submit(PROMPTS[1]).result(60)
        assert isinstance(r.lookup_error, CacheUnavailable) and r.similarity is None
        assert r.optimal == clf.predict([PROMPTS[1]])[0] and r.classifier_error is None
    finally:
        pp.close()
        batched.close()
        view.close()


def test_the_router_reads_each_prompt_once_for_argus_plus(tiny_bert, make_latent_cache):  # noqa: F811
    """argus+ on an AC profile reads the classifier and the cache similarity: the service builds one
    pass for both; the router routes with its level, its similarity and passes its embedding on; a
    swapped classifier is checked again and serves the next batch."""
    pytest.importorskip("transformers")
    from argusdiff.profile import load_profile
    from argusdiff.service.app import Service
    from argusdiff.service.similarity import CacheSimilarity
    from classifiers.level import BatchedClassifier, LevelClassifier
    from traces.embeddings import PromptEncoder

    embed = PromptEncoder(tiny_bert, max_length=32, use_cache=False)
    settings = service_settings("demo-cpu", workers=0, policy="argus+")
    profile_ids = load_profile("demo-cpu").ids
    latent_cache = make_latent_cache(dim=32)
    clf = LevelClassifier.new(profile_ids, backbone=str(tiny_bert), max_length=32, seed=2)
    batched = BatchedClassifier(clf, max_wait_s=0.01)
    _store(latent_cache, embed([PROMPTS[0]])[0])
    view = CacheSimilarity(latent_cache, model="demo-tiny-sdxl", embed=embed)

    async def scenario():
        service = Service(settings, classifier=batched, cache_similarity=view)
        router = service.router
        assert router.prompt_pass is service.prompt_pass is not None
        optimal, sim, emb = await router._read_prompt(PROMPTS[0])
        assert optimal == clf.predict([PROMPTS[0]])[0]
        assert sim == pytest.approx(1.0, abs=1e-3) and emb.shape == (32,)
        assert router.prompt_pass.encoded == 1 and router.prompt_pass.shared
        new = LevelClassifier.new(profile_ids, backbone=str(tiny_bert), max_length=32, seed=7)
        batched.swap(new)
        assert batched.version == 2
        got = await asyncio.gather(*(router._read_prompt(p) for p in PROMPTS))
        assert [g[0] for g in got] == new.predict(PROMPTS)
        assert router.prompt_pass.encoded == 1 + len(PROMPTS)
        await service.dispatch.close()
        service.prompt_pass.close()

    try:
        asyncio.run(scenario())
    finally:
        batched.close()
        view.close()
