"""The live service loads a trained level classifier from ``[classifier] models`` for its
profile's strategy, batched, in the configured precision; one trained for other levels is refused."""

from __future__ import annotations

import pytest
from fixtures_classifiers import separable_table, tiny_bert  # noqa: F401 - fixture

from argusdiff.config import Settings
from argusdiff.profile import load_profile
from argusdiff.service.app import load_classifier
from classifiers.errors import ModelMismatchError
from classifiers.train import TrainConfig, train_level_classifier

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def demo_classifier_dir(tiny_bert, tmp_path_factory):  # noqa: F811
    import torch

    torch.set_num_threads(1)
    profile = load_profile("demo-cpu")
    table = separable_table(240, level_ids=profile.ids)
    cfg = TrainConfig(
        mode="full", epochs=20, lr=1e-3, max_length=16, progress=False, patience=20, backbone=str(tiny_bert)
    )
    clf, _report = train_level_classifier(table, config=cfg, profile=profile.name)
    return clf.save(tmp_path_factory.mktemp("clf") / "ac"), table


def test_service_routes_with_the_trained_classifier(demo_classifier_dir):
    path, _table = demo_classifier_dir
    profile = load_profile("demo-cpu")
    settings = Settings.model_validate({"classifier": {"models": {"ac": str(path)}, "precision": "float32"}})
    batched = load_classifier(settings, profile)
    assert batched is not None and tuple(batched.level_ids) == profile.ids
    prompts = ["a dragon castle at dusk", "portrait of a woman, studio light", "a red apple on a table"]
    got = batched.predict(prompts, timeout=60)
    want = [profile.ids[i] for i in (0, 1, 2)]
    assert sum(g == w for g, w in zip(got, want, strict=True)) >= 2, got
    # no classifier configured for the strategy: the policy's stand-in is used instead
    assert load_classifier(Settings(), profile) is None


def test_service_refuses_a_classifier_trained_for_other_levels(demo_classifier_dir):
    path, _ = demo_classifier_dir
    other = load_profile("sdxl-ac-a100")
    settings = Settings.model_validate({"classifier": {"models": {"ac": str(path)}}})
    with pytest.raises(ModelMismatchError):
        load_classifier(settings, other)
