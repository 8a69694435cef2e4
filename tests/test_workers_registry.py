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


@pytest.mark.parametrize(
    ("version", "keyword"),
    [
        ("0.30.0", "torch_dtype"),
        ("0.39.0", "torch_dtype"),
        ("0.40.0", "dtype"),
        ("0.42.1", "dtype"),
        ("1.2.0.dev0", "dtype"),
    ],
)
def test_dtype_keyword_follows_the_diffusers_version(version, keyword):
    """diffusers < 0.40 ignores `dtype=` (SD-XL would load in float32); >= 0.40 deprecates `torch_dtype`.
    The real check at the setup.cfg floor is tests/test_diffusers_floor.py."""
    from workers.registry import dtype_keyword

    assert dtype_keyword(version) == keyword


def _same_weights(a, b) -> bool:
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k].float(), sb[k].float()) for k in sa)


@pytest.mark.integration
def test_float16_is_honoured(demo_registry, demo_models_dir):
    import torch

    from workers.registry import ModelRegistry

    reg = ModelRegistry(device="cpu", dtype="float16", models_dir=demo_models_dir)
    pipe = reg.load("demo-tiny-sd").pipe
    assert pipe.unet.dtype == torch.float16 and pipe.text_encoder.dtype == torch.float16
    assert demo_registry.load("demo-tiny-sd").pipe.unet.dtype == torch.float32


@pytest.mark.integration
def test_local_folder_with_a_variant_loads(demo_registry, tmp_path):
    """A folder saved with variant="fp16" (as a hub snapshot downloaded with that variant) has only
    `*.fp16.safetensors` weights: the registry passes the variant for it, also on a CPU in float32."""
    from workers.registry import ModelRegistry

    base = demo_registry.load("demo-tiny-sd").pipe
    folder = tmp_path / "tiny-sd-fp16"
    base.save_pretrained(folder, safe_serialization=True, variant="fp16")
    assert (folder / "unet" / "diffusion_pytorch_model.fp16.safetensors").is_file()
    assert not (folder / "unet" / "diffusion_pytorch_model.safetensors").exists()
    spec = {"source": str(folder), "family": "sd", "variant": "fp16", "steps": 2, "height": 64, "width": 64}
    reg = ModelRegistry(device="cpu", models_dir=tmp_path, overrides={"mine": spec})
    loaded = reg.load("mine")
    assert _same_weights(loaded.pipe.unet, base.unet)
    plain = ModelRegistry(device="cpu", models_dir=tmp_path, overrides={"mine": {**spec, "source": str(tmp_path)}})
    with pytest.raises(Exception):  # noqa: B017 - an empty folder is no model, whatever the variant
        plain.load("mine")


@pytest.mark.integration
def test_single_file_checkpoint_loads_with_from_single_file(demo_registry, tmp_path, monkeypatch):
    """An original-layout (LDM) .safetensors loads through from_single_file, offline, with the
    component configs of a local folder; without `config` the error says what is missing."""
    from ldm_checkpoint import write_single_file

    from workers.errors import ModelLoadError
    from workers.registry import ModelRegistry, is_single_file

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    base = demo_registry.load("demo-tiny-sd").pipe
    ckpt = write_single_file(base, tmp_path / "tiny-sd.safetensors")
    assert is_single_file(str(ckpt)) and not is_single_file(str(tmp_path)) and not is_single_file("org/x.safetensors")
    folder = demo_registry.local_path(demo_registry.spec("demo-tiny-sd"))
    spec = {"source": str(ckpt), "family": "sd", "config": folder, "steps": 2, "height": 64, "width": 64}
    reg = ModelRegistry(device="cpu", models_dir=tmp_path, overrides={"ckpt": spec})
    pipe = reg.load("ckpt").pipe
    for part in ("unet", "vae", "text_encoder"):
        assert _same_weights(getattr(pipe, part), getattr(base, part)), part
    from workers.pipelines import generate

    a = generate(reg.load("ckpt"), ["a red cube"], [3], steps=2).images[0]
    b = generate(demo_registry.load("demo-tiny-sd"), ["a red cube"], [3], steps=2).images[0]
    assert a.tobytes() == b.tobytes()
    demo = ModelRegistry(device="cpu", models_dir=tmp_path, overrides={"ckpt": {**spec, "config": "demo:tiny-sd"}})
    assert _same_weights(demo.load("ckpt").pipe.unet, base.unet)  # a demo model's folder as the config
    bare = ModelRegistry(device="cpu", models_dir=tmp_path, overrides={"ckpt": {**spec, "config": None}})
    with pytest.raises(ModelLoadError, match=r"(?s)ckpt.*set `config`"):
        bare.load("ckpt")


def test_the_config_example_in_docs_workers_md_loads(tmp_path):
    """The `[workers]` example of docs/workers.md is valid settings and every entry resolves (a
    bare `[workers.models.sdxl-base-1.0]` would have been the table `sdxl-base-1` / `0`)."""
    import re

    from argusdiff.config import load_settings
    from workers.registry import ModelRegistry

    doc = (Path(__file__).resolve().parent.parent / "docs" / "workers.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", doc, re.DOTALL) if "[workers" in b]
    assert blocks
    for block in blocks:
        path = tmp_path / "c.toml"
        path.write_text(block)
        settings = load_settings(path, environ={})
        registry = ModelRegistry.from_config(settings.workers)
        for name in settings.workers.models:
            assert registry.spec(name).source == settings.workers.models[name]["source"]


def test_registry_answers_while_a_model_loads(tmp_path):
    """A worker's heartbeat reads the loaded models: it must not wait for a load in progress (it
    used to, and the embedded demo's workers were declared dead while their first model loaded)."""
    import threading

    from workers.registry import ModelRegistry

    started, release = threading.Event(), threading.Event()

    class SlowLoad(ModelRegistry):
        def _load_pipeline(self, spec):
            started.set()
            release.wait(30)
            return object()

    reg = SlowLoad(device="cpu", models_dir=tmp_path)
    loader = threading.Thread(target=reg.load, args=("demo-tiny-sd",))
    loader.start()
    assert started.wait(30)
    answers: list = []
    reader = threading.Thread(target=lambda: answers.append(reg.loaded()))
    reader.start()
    reader.join(10)
    loaded_during = list(answers)
    release.set()
    loader.join(30)
    assert loaded_during == [()]  # answered at once, while the load was still running
    assert reg.loaded() == ("demo-tiny-sd",) and reg.load("demo-tiny-sd") is reg.load("demo-tiny-sd")


@pytest.mark.integration
def test_float16_decodes_log_no_casting_warning(demo_models_dir):
    """The fp16 VAE's upcast per decode and the preview decoder's dtype are set without diffusers'
    "should be kept in float32" warning (diffusers 0.42 logs it on every `.to(dtype)`)."""
    import logging

    import torch

    from workers.pipelines import decode
    from workers.progress import preview_decoder
    from workers.registry import ModelRegistry

    reg = ModelRegistry(device="cpu", dtype="float16", models_dir=demo_models_dir)
    model = reg.load("demo-tiny-sdxl")
    vae = model.pipe.vae
    vae.config.force_upcast = True  # as SD-XL's fp16 VAE: decoded in float32
    latents = torch.randn(1, model.pipe.unet.config.in_channels, 8, 8, dtype=torch.float16)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # diffusers' loggers do not propagate to the root (caplog)
    root = logging.getLogger("diffusers")
    root.addHandler(handler)
    try:
        images = decode(model, latents)
        partial = preview_decoder(model)(latents)
    finally:
        root.removeHandler(handler)
    assert len(images) == 1 and len(partial) == 1 and vae.dtype == torch.float16
    noisy = [r.getMessage() for r in records if "kept in float32" in r.getMessage()]
    assert not noisy, noisy
