"""A faster prompt pass: the MiniLM encoder in int8 with per-channel weight scales (ONNX Runtime, or
torch without it), the gate that lets a classifier route with it (held-out accuracy within 1 point
of float32, cache recall@5 >= 0.95), one shared pass with it, identical prompts in flight merged,
and exact repeats answered from a small cache."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures_classifiers import separable_table
from test_prompt_pass import LEVELS, PROMPTS, _store

pytestmark = pytest.mark.integration
pytest.importorskip("transformers")


def _unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _prompts(n: int = 96) -> list[str]:
    from traces.prompts import builtin_prompts

    return list(builtin_prompts().prompts)[:n]


@pytest.fixture(scope="module")
def minilm():
    from classifiers.level import LevelClassifier

    return LevelClassifier.new(LEVELS, seed=1)


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_per_channel_int8_stays_close_to_float32(minilm, backend):
    from classifiers.int8 import Int8Encoder, ort_available, recall_at_k

    if backend == "onnx" and not ort_available():
        pytest.skip("onnxruntime is not installed")
    prompts = _prompts()
    exact = minilm.pooled(prompts)
    int8 = minilm.int8_copy()
    int8.int8 = Int8Encoder(minilm.model.base_model, backend=backend)
    fast = int8.pooled(prompts)
    cos = (_unit(exact) * _unit(fast)).sum(axis=1)
    assert cos.mean() > (0.985 if backend == "onnx" else 0.97) and cos.min() > 0.95, (cos.mean(), cos.min())
    assert recall_at_k(fast, exact, exact) >= 0.9
    assert np.allclose(minilm.pooled(prompts[:4]), exact[:4], atol=1e-5)  # the float32 model is untouched
    assert np.allclose(int8.pooled(prompts[:4], exact=True), exact[:4], atol=1e-5)


def test_the_gate_is_saved_and_auto_precision_follows_it(tmp_path):
    from argusdiff.service.prompt_pass import shares_encoder
    from classifiers.level import LevelClassifier
    from classifiers.train import TrainConfig, train_level_classifier
    from traces.embeddings import get_encoder

    table = separable_table(90, level_ids=LEVELS)
    clf, _ = train_level_classifier(table, config=TrainConfig(epochs=3, progress=False))
    gate = clf.meta.report["int8"]
    assert gate["passed"], gate
    assert gate["accuracy_float32"] - gate["accuracy_int8"] <= 0.01 and gate["recall_at_5"] >= 0.95
    clf.save(tmp_path / "clf")
    auto = LevelClassifier.load(tmp_path / "clf", precision="auto")
    assert auto.precision == "int8" and auto.int8 is not None
    assert LevelClassifier.load(tmp_path / "clf", precision="float32").precision == "float32"
    ok, why = shares_encoder(auto, get_encoder(use_cache=False).encode)
    assert ok and "int8" in why  # one pass: the gate covers the cache's neighbours
    ungated = LevelClassifier.new(LEVELS, precision="auto")
    assert ungated.precision != "int8"
    forced = LevelClassifier.new(LEVELS, precision="int8")
    assert not shares_encoder(forced, get_encoder(use_cache=False).encode)[0]  # no gate: two passes


def test_int8_is_refused_off_the_cpu():
    from classifiers.errors import ClassifierInputError
    from classifiers.level import LevelClassifier

    clf = LevelClassifier.new(LEVELS)
    clf.device = "cuda"
    with pytest.raises(ClassifierInputError, match="CPU"):
        clf.set_precision("int8")


def test_repeats_and_identical_prompts_in_flight_are_encoded_once(minilm, latent_cache):
    from argusdiff.service.prompt_pass import PromptPass
    from argusdiff.service.similarity import CacheSimilarity
    from classifiers.level import BatchedClassifier
    from traces.embeddings import get_encoder

    embed = get_encoder(use_cache=False).encode
    _store(latent_cache, embed([PROMPTS[0]])[0])
    batched = BatchedClassifier(minilm, max_wait_s=0.3)
    view = CacheSimilarity(latent_cache, model="demo-tiny-sdxl", embed=embed)
    pp = PromptPass(batched, view, max_wait_s=0.3)
    try:
        a, b = pp.submit(PROMPTS[0]), pp.submit(PROMPTS[0])  # the second arrives while the first waits
        assert a is b and pp.merged == 1
        first = a.result(60)
        again = pp.submit(PROMPTS[0]).result(60)  # an exact repeat: not encoded again
        assert pp.encoded == 1 and pp.repeats.hits == 1
        assert again.optimal == first.optimal and np.array_equal(again.embedding, first.embedding)
        assert again.similarity == pytest.approx(first.similarity) and again.looked_up  # the index still asked
        mixed = [pp.submit(p) for p in (PROMPTS[1], PROMPTS[2], PROMPTS[1])]
        assert mixed[0] is mixed[2] and mixed[0].result(60).optimal in LEVELS  # merged in flight
        assert pp.encoded == 3  # PROMPTS[1] once, PROMPTS[2] once
        twice = batched.predict([PROMPTS[3], PROMPTS[3]])  # merged in flight
        assert twice[0] == twice[1] == batched.predict([PROMPTS[3]])[0]  # then a repeat
        assert batched.merged == 1 and batched.repeats.hits == 1  # classified once
    finally:
        pp.close()
        batched.close()
        view.close()
