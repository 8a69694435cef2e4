"""The router's live cache-similarity view: policies that route by it (nirvana, argus+) see, per
request, how close the prompt is to its nearest cached prompt, as the simulator shows them."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from fixtures_service import assert_repeat_prompt_resumes, demo_model_settings, service_settings

from argusdiff.batching import MicroBatcher


def test_micro_batcher_batches_and_fails_a_batch_together_when_asked():
    calls: list[list[int]] = []

    def double(xs):
        calls.append(list(xs))
        return [2 * x for x in xs]

    b = MicroBatcher(double, max_batch=4, max_wait_s=0.05)
    futs = [b.submit(i) for i in range(6)]
    assert [f.result(5) for f in futs] == [0, 2, 4, 6, 8, 10]
    assert max(len(c) for c in calls) <= 4 and b.items == 6
    b.close()
    with pytest.raises(RuntimeError, match="closed"):
        b.submit(1)

    def boom(xs):
        raise OSError("backend down")

    together = MicroBatcher(boom, max_wait_s=0.05, retry_singly=False)
    futs = [together.submit(i) for i in range(3)]
    for f in futs:
        with pytest.raises(OSError, match="backend down"):
            f.result(5)
    together.close()

    def picky(xs):
        if 3 in xs:
            raise ValueError("bad item 3")
        return xs

    singly = MicroBatcher(picky, max_wait_s=0.05)
    futs = [singly.submit(i) for i in (1, 3, 5)]
    assert futs[0].result(5) == 1 and futs[2].result(5) == 5
    with pytest.raises(ValueError, match="bad item 3"):
        futs[1].result(5)
    singly.close()


def test_cache_similarity_over_a_real_cache_and_the_minilm_encoder(latent_cache):
    pytest.importorskip("transformers")
    from argusdiff.service.similarity import CacheSimilarity
    from cache.api import LatentMeta
    from traces.embeddings import encode_prompts

    prompt = "a red fox sleeping in fresh snow, golden hour"
    emb = encode_prompts([prompt])[0]
    latents = {2: np.zeros((4, 8, 8), dtype=np.float16)}
    latent_cache.store(emb, latents, LatentMeta("demo-tiny-sdxl", "EulerDiscreteScheduler", 8, 2, (4, 8, 8)))
    view = CacheSimilarity(latent_cache, model="demo-tiny-sdxl")
    other = CacheSimilarity(latent_cache, model="some-other-model")
    try:

        async def ask():
            return await asyncio.gather(
                view.similarity(prompt),
                view.similarity("a red fox asleep in the snow at golden hour"),
                view.similarity("quarterly revenue spreadsheet with pie charts"),
                other.similarity(prompt),
            )

        same, close, far, wrong_model = asyncio.run(ask())
    finally:
        view.close()
        other.close()
    assert same == pytest.approx(1.0, abs=1e-3)
    assert far < close < same
    assert far < 0.5
    assert wrong_model is None  # nothing of that model is cached


@pytest.mark.integration
@pytest.mark.slow
def test_nirvana_live_resumes_a_repeated_prompt_from_the_cache(demo_models_dir, tmp_path, live_service):
    """demo-cpu on real tiny pipelines: the first request of a prompt misses (K = 0, its latents
    are stored); the same prompt again is routed by its similarity (1.0) to the K = 4 level and the
    worker resumes from the cached latent."""
    import httpx

    server = live_service(demo_model_settings(demo_models_dir, tmp_path / "cache"))
    assert server.service.router.similarity is not None
    url = assert_repeat_prompt_resumes(server)
    fresh = httpx.post(url, json={"prompt": "a bowl of ramen, studio photo", "seed": 3}, timeout=120).json()
    assert fresh["data"][0]["level"] == "xl-k0"  # dissimilar: a miss, routed at K = 0
    metrics = httpx.get(f"{server.url}/metrics").text
    assert "argusdiff_cache_similarity_seconds_count 3.0" in metrics
    # the router's embedding travelled with each item: the workers never ran the encoder
    executors = server.service.workers[0].worker._executors
    assert {"xl-k0", "xl-k4"} <= set(executors)
    assert sum(ex.stats["embedded"] for ex in executors.values()) == 0
    assert sum(ex.stats["stored"] for ex in executors.values()) >= 2


def test_embedding_round_trip_and_rejects():
    from cache.api import decode_embedding, encode_embedding

    v = np.linspace(-1, 1, 384, dtype=np.float32)
    assert np.array_equal(decode_embedding(encode_embedding(v), 384), v)
    assert decode_embedding(encode_embedding(v), 512) is None  # another encoder's size
    assert decode_embedding("not base64!", None) is None
    assert decode_embedding(encode_embedding(np.array([np.nan, 1.0])), None) is None
    assert decode_embedding("", 384) is None and decode_embedding(None) is None


def test_a_failing_similarity_lookup_routes_as_a_miss_and_counts_against_cache_health():
    from argusdiff.service.app import Service
    from cache.api import CacheUnavailable

    class DownIndex:  # the cache-similarity interface, with its index unreachable
        async def lookup(self, prompt):
            raise CacheUnavailable("index lookup timed out")

        def close(self):
            pass

    async def scenario():
        service = Service(
            service_settings("demo-cpu", workers=0, policy="nirvana", cache_window=4, cache_error_threshold=0.5),
            cache_similarity=DownIndex(),
        )
        router = service.router
        assert router.similarity is not None
        sims = [await router._cache_similarity("a cat") for _ in range(3)]
        assert sims == [(None, None)] * 3
        assert not router.cache_health.healthy  # errors past the threshold: the AC->SM signal
        assert await router._cache_similarity("a cat") == (None, None)  # unhealthy: not even asked

    asyncio.run(scenario())
