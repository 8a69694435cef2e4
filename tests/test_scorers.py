"""CLIPScore and PickScore-style scorers on a tiny open_clip model (random weights, real tokenizer)."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures_classifiers import synthetic_images, tiny_clip_config  # noqa: F401 - fixture

from classifiers.errors import ClassifierInputError, ModelFormatError
from classifiers.scorers import ClipEmbedder, CLIPScore, PickScoreScorer, make_scorer


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)


def test_scores_follow_their_formulas(tiny_clip_config):  # noqa: F811
    prompts = ["a red fox in the snow", "a city at night", "portrait of a woman"]
    images = synthetic_images(3, "real", size=40)
    pick = make_scorer("pickscore", str(tiny_clip_config))
    clip = CLIPScore(pick.embedder, w=2.5)
    cos = pick.embedder.cosine(prompts, images)
    assert cos.shape == (3,) and np.all(np.abs(cos) <= 1 + 1e-6)
    np.testing.assert_allclose(pick.score(prompts, images), pick.scale * cos, rtol=1e-6)
    np.testing.assert_allclose(clip.score(prompts, images), 2.5 * np.maximum(cos, 0), rtol=1e-6)
    assert pick.scale == pytest.approx(pick.embedder.model.logit_scale.exp().item())
    p = pick.preference(prompts[0], images)
    assert p.sum() == pytest.approx(1.0) and p.argmax() == np.argmax(pick.score([prompts[0]] * 3, images))
    # the tokenizer truncates over-long prompts at the context length instead of failing
    assert pick.score(["word " * 500], images[:1]).shape == (1,)


def test_weights_file_round_trip(tiny_clip_config, tmp_path):  # noqa: F811
    from safetensors.torch import save_file

    a = ClipEmbedder(str(tiny_clip_config))
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in a.model.state_dict().items()}, str(weights))
    import torch

    torch.manual_seed(123)  # a fresh random init differs; the loaded weights must win
    b = ClipEmbedder(str(tiny_clip_config), str(weights))
    images, prompts = synthetic_images(2, "generated", size=40), ["a", "b"]
    np.testing.assert_allclose(a.cosine(prompts, images), b.cosine(prompts, images), atol=1e-6)
    bad = tmp_path / "bad.safetensors"
    save_file({"nope": torch.zeros(1)}, str(bad))
    with pytest.raises(ModelFormatError, match="cannot load"):
        ClipEmbedder(str(tiny_clip_config), str(bad))


def test_bad_inputs(tiny_clip_config, tmp_path):  # noqa: F811
    with pytest.raises(ModelFormatError, match="unknown open_clip model"):
        ClipEmbedder("No-Such-Model")
    with pytest.raises(ModelFormatError, match="not found"):
        ClipEmbedder(str(tmp_path / "missing.json"))
    with pytest.raises(ClassifierInputError, match="metric"):
        make_scorer("fid", str(tiny_clip_config))
    s = PickScoreScorer(ClipEmbedder(str(tiny_clip_config)))
    with pytest.raises(ClassifierInputError, match="2 prompts but 1 images"):
        s.score(["a", "b"], synthetic_images(1, "real"))
