"""Model registry and the tiny demo pipelines (saved, then loaded through from_pretrained)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from argusdiff.domain import ApproxLevel, Strategy


def test_shipped_entries_cover_the_shipped_profiles():
    from argusdiff.profile import list_profiles, load_profile
    from workers.registry import SHIPPED_MODELS

    for name in list_profiles():
        for level in load_profile(name).levels:
            assert level.model in SHIPPED_MODELS, (name, level.id, level.model)
    light = SHIPPED_MODELS["sdxl-lightning-2step"]
    assert light.steps == 2 and light.scheduler_kwargs["timestep_spacing"] == "trailing" and light.unet_weights
    assert SHIPPED_MODELS["sd-turbo"].steps == 1 and SHIPPED_MODELS["sd-turbo"].guidance == 0.0
    assert SHIPPED_MODELS["sdxl-base-1.0"].scheduler in ("EulerDiscreteScheduler", "DDIMScheduler")


def test_unknown_model_and_bad_overrides_are_clear_errors(tmp_path):
    from workers.errors import UnknownModel
    from workers.registry import ModelRegistry

    reg = ModelRegistry(models_dir=tmp_path)
    with pytest.raises(UnknownModel, match=r"unknown model 'nope'.*known: "):
        reg.spec("nope")
    with pytest.raises(UnknownModel, match=r"unknown override field.*colour"):
        ModelRegistry(overrides={"sd-1.5": {"colour": "red"}})
    with pytest.raises(UnknownModel, match="needs family"):
        ModelRegistry(overrides={"mine": {"source": "/models/mine"}})
    reg2 = ModelRegistry(overrides={"sd-1.5": {"source": "/models/sd15"}, "mine": {"source": "/m", "family": "sd"}})
    assert reg2.spec("sd-1.5").source == "/models/sd15" and reg2.spec("mine").family == "sd"


def test_offline_hub_model_fails_with_a_clear_error(tmp_path, monkeypatch):
    from workers.errors import ModelLoadError
    from workers.registry import ModelRegistry

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    reg = ModelRegistry(device="cpu", models_dir=tmp_path, overrides={"sdxs-512": {"source": "IDKiro/sdxs-512-0.9"}})
    with pytest.raises(ModelLoadError, match=r"sdxs-512.*HF_HUB_OFFLINE"):
        reg.load("sdxs-512")


@pytest.mark.integration
def test_demo_models_are_saved_and_loaded_through_from_pretrained(demo_registry, demo_models_dir):
    import open_clip

    loaded = demo_registry.load("demo-tiny-sdxl")
    folder = next(Path(demo_models_dir).glob("demo-tiny-sdxl-v*"))
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionXLPipeline"
    assert (folder / "unet" / "diffusion_pytorch_model.safetensors").is_file()
    assert demo_registry.load_times["demo-tiny-sdxl"] == loaded.load_s > 0
    assert demo_registry.load("demo-tiny-sdxl") is loaded  # cached per worker
    ids = loaded.pipe.tokenizer("a red cube on a table").input_ids
    assert ids == [int(t) for t in open_clip.tokenize(["a red cube on a table"])[0][: len(ids)]]
    sd = demo_registry.load("demo-tiny-sd")
    assert type(sd.pipe).__name__ == "StableDiffusionPipeline" and type(sd.pipe.scheduler).__name__ == "DDIMScheduler"
    one = demo_registry.load("demo-tiny-sd-1step")  # same folder, another scheduler config
    assert one.pipe.scheduler.config.timestep_spacing == "trailing"


@pytest.mark.integration
def test_registry_keeps_at_most_max_loaded(demo_models_dir):
    from workers.registry import ModelRegistry

    reg = ModelRegistry(device="cpu", models_dir=demo_models_dir, max_loaded=1)
    reg.load("demo-tiny-sd")
    reg.load("demo-tiny-sd-1step")
    assert reg.loaded() == ("demo-tiny-sd-1step",)
    assert set(reg.load_times) == {"demo-tiny-sd", "demo-tiny-sd-1step"}


def test_build_executor_picks_the_strategy(tmp_path):
    from workers.ac import ApproxCacheExecutor
    from workers.errors import UnknownModel
    from workers.executor import build_executor
    from workers.registry import ModelRegistry
    from workers.sm import ModelExecutor

    reg = ModelRegistry(models_dir=tmp_path)

    def lv(strategy, model="demo-tiny-sd", skip=0):
        return ApproxLevel(
            id="x", strategy=strategy, model=model, steps=8, skip=skip, latency_s={1: 1.0}, quality=1.0, load_time_s=0.0
        )

    assert isinstance(build_executor(lv(Strategy.AC, skip=2), reg), ApproxCacheExecutor)
    assert type(build_executor(lv(Strategy.SM), reg)) is ModelExecutor
    assert type(build_executor(lv(Strategy.CASCADE), reg)) is ModelExecutor
    with pytest.raises(UnknownModel, match="nope"):
        build_executor(lv(Strategy.SM, model="nope"), reg)
