"""The safety checker as a deployment option (``[safety] checker = "diffusers"``): diffusers'
``StableDiffusionSafetyChecker``, here a tiny one built from a config (random CLIP weights, concept
thresholds set by the test), runs on the workers; a flagged image is never returned (400
``content_policy_violation``); ``moderation`` is honoured with a checker (``low``: a margin) and
reported unhonoured without one."""

from __future__ import annotations

import pytest
from fixtures_service import demo_model_settings

from argusdiff.config import Settings

pytestmark = pytest.mark.integration

openai = pytest.importorskip("openai")


def build_checker(folder, concept_threshold: float) -> str:
    """A tiny StableDiffusionSafetyChecker with every concept's threshold ``concept_threshold``
    (−5: every image is flagged, 5: none) and no special-care concept ever hit."""
    import torch
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import CLIPConfig, CLIPImageProcessor

    torch.manual_seed(0)
    small = {"hidden_size": 32, "intermediate_size": 37, "num_attention_heads": 2, "num_hidden_layers": 1}
    config = CLIPConfig(text_config=small, vision_config={**small, "image_size": 32, "patch_size": 8},
                        projection_dim=16)  # fmt: skip
    checker = StableDiffusionSafetyChecker(config)
    with torch.no_grad():
        checker.concept_embeds.normal_()
        checker.special_care_embeds.normal_()
        checker.concept_embeds_weights.fill_(concept_threshold)
        checker.special_care_embeds_weights.fill_(5.0)
    checker.save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    return str(folder)


def test_moderation_low_is_a_margin_above_the_checkers_rule(tmp_path):
    import numpy as np
    import torch
    from PIL import Image

    from workers.safety import SafetyChecker

    images = [Image.fromarray(np.full((64, 64, 3), c, dtype=np.uint8)) for c in (30, 200)]
    folder = build_checker(tmp_path / "probe", 5.0)
    probe = SafetyChecker(folder, low_margin=0.1)
    assert probe.flagged(images, ["auto", "low"]) == [None, None]
    # thresholds set so that each image's top concept scores 0.05: over 0 (auto), under 0.1 (low)
    cos = (probe.scores(images) + 5.0).max().item()
    with torch.no_grad():
        probe.checker.concept_embeds_weights.fill_(cos - 0.05)
    top = probe.scores(images).max(dim=1).values
    assert float(top.max()) == pytest.approx(0.05, abs=1e-5)
    auto, low = probe.flagged(images, ["auto", "auto"]), probe.flagged(images, ["low", "low"])
    assert auto[int(top.argmax())] is not None and low == [None, None]


def _settings(models_dir, tmp_path, checker: str | None) -> Settings:
    base = demo_model_settings(models_dir, tmp_path / "cache", policy="argus").model_dump()
    if checker is not None:
        base["safety"] = {"checker": "diffusers", "model": checker}
    return Settings.model_validate(base)


def _client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_a_flagged_image_is_never_returned(live_service, demo_models_dir, tmp_path):
    server = live_service(_settings(demo_models_dir, tmp_path, build_checker(tmp_path / "strict", -5.0)))
    with pytest.raises(openai.BadRequestError) as exc:
        _client(server).images.generate(prompt="a red barn", response_format="b64_json")
    assert exc.value.body["code"] == "content_policy_violation" and "safety checker" in exc.value.body["message"]
    import httpx

    text = httpx.get(f"{server.url}/metrics").text
    assert 'outcome="filtered"} 1.0' in text


def test_moderation_is_honoured_with_a_checker_and_reported_without(live_service, demo_models_dir, tmp_path):
    server = live_service(_settings(demo_models_dir, tmp_path, build_checker(tmp_path / "lenient", 5.0)))
    raw = _client(server).images.with_raw_response.generate(prompt="a barn", moderation="low",
                                                            response_format="b64_json")  # fmt: skip
    assert raw.http_response.status_code == 200 and "argusdiff-unhonoured" not in raw.headers
    checker = server.service.factory.safety
    assert checker.checked == 1 and checker.flagged_count == 0
    plain = live_service(_settings(demo_models_dir, tmp_path / "b", None))
    raw = _client(plain).images.with_raw_response.generate(prompt="a barn", moderation="low",
                                                           response_format="b64_json")  # fmt: skip
    assert raw.headers["argusdiff-unhonoured"] == "moderation=low"
