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


def test_embedded_demo_routes_by_prompt_says_why_and_starts_quietly(live_service, demo_models_dir, tmp_path, caplog):
    """`argusdiff serve`'s embedded demo (real tiny models, a classifier fitted at start on the
    packaged prompt embeddings): prompts the synthetic quality model tells apart get different
    optimal levels, each image says why it went where it did, and a healthy start logs no warning."""
    import logging

    import httpx
    from fixtures_service import demo_model_settings

    settings = demo_model_settings(demo_models_dir, tmp_path / "cache", policy="argus", workers=2).model_dump()
    settings["classifier"].update(fit_at_start=True, precision="float32")
    # a heartbeat every second (the default) and a patient timeout, not the test settings' 0.1 s / 1 s:
    # a loaded CI machine may stall a thread for a second (tests/test_workers_registry.py checks that
    # a model load does not block heartbeats)
    settings["service"].update(fallback_profile="demo-cpu-sm", heartbeat_s=1.0, worker_timeout_s=10.0)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # diffusers' and transformers' loggers do not reach caplog
    libraries = [logging.getLogger(name) for name in ("diffusers", "transformers")]
    for lib in libraries:
        lib.addHandler(handler)
    try:
        with caplog.at_level(logging.WARNING):
            server = live_service(Settings.model_validate(settings))
            clf = server.service.classifier
            assert clf is not None and "SYNTHETIC" in clf.description and clf.caveat
            report = clf.classifier.meta.report
            assert report["holdout_accuracy"] > max(report["label_counts"].values()) / report["prompts"]
            prompts = [
                "a red apple",
                "a photo of a cat",
                "portrait of an old fisherman with a braided beard, 85mm, highly detailed face, sharp focus, 8k",
                "a dragon coiled around a castle tower, intricate, ultra detailed, octane render, artstation",
            ]
            seen = set()
            for prompt in prompts:
                body = {"prompt": prompt, "response_format": "b64_json"}
                r = httpx.post(f"{server.url}/v1/argusdiff/generations", json=body, timeout=120)
                assert r.status_code == 200, r.text
                image = r.json()["data"][0]
                seen.add(image["optimal_level"])
                assert image["optimal_level"] in server.service.profile.ids
                assert f"puts this prompt at {image['optimal_level']}" in image["why"]
                assert "fitted at start on SYNTHETIC labels" in image["why"] and image["level"] in image["why"]
            assert len(seen) > 1, seen
            plan = httpx.get(f"{server.url}/v1/plan", timeout=10).json()
            assert "SYNTHETIC" in str(plan)
    finally:
        for lib in libraries:
            lib.removeHandler(handler)
    warnings = [f"{r.name}: {r.getMessage()}" for r in [*caplog.records, *records] if r.levelno >= logging.WARNING]
    assert not warnings, warnings
