"""Discriminator: learning on separable images, confidence/accept, save/load, f(t), ROC-AUC, CLI."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
from fixtures_classifiers import synthetic_images

from classifiers.discriminator import (
    Discriminator,
    DiscriminatorTrainConfig,
    deferral_curve,
    format_ft_toml,
    roc_auc,
    train_discriminator,
)
from classifiers.errors import ClassifierInputError, ModelFormatError, ModelMismatchError, TrainingDataError


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)


def tiny_config(**kw) -> DiscriminatorTrainConfig:
    base = dict(
        variant="test_efficientnet", image_size=32, epochs=8, batch_size=16, lr=3e-3, progress=False, patience=8
    )
    base.update(kw)
    return DiscriminatorTrainConfig(**base)


@pytest.fixture(scope="module")
def trained():
    import torch

    torch.set_num_threads(1)
    real, gen = synthetic_images(60, "real"), synthetic_images(60, "generated")
    return train_discriminator(real, gen, config=tiny_config(), profile="p", light="light", heavy="heavy")


def test_roc_auc_exact_values():
    assert roc_auc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert roc_auc([0.1], [0.9]) == 0.0
    assert roc_auc([0.5, 0.5], [0.5]) == 0.5
    assert roc_auc([0.9, 0.3], [0.5, 0.1]) == pytest.approx(0.75)
    with pytest.raises(TrainingDataError):
        roc_auc([], [0.1])


def test_deferral_curve_and_profile_format():
    ts, fs = deferral_curve([0.1, 0.4, 0.4, 0.9])
    assert len(ts) == 201 and ts[0] == 0.0 and ts[-1] == 1.0
    assert fs[0] == 0.0 and fs[-1] == 1.0
    assert all(a <= b for a, b in itertools.pairwise(fs))
    f = dict(zip(ts, fs, strict=True))
    assert f[0.1] == 0.0 and f[0.105] == 0.25 and f[0.4] == 0.25 and f[0.405] == 0.75
    toml = format_ft_toml(ts, fs, source="test")
    import tomllib

    parsed = tomllib.loads(toml)
    assert parsed["thresholds"] == list(ts) and parsed["deferral"] == list(fs)


def test_training_learns_real_vs_generated(trained):
    disc, report = trained
    losses = [h["train_loss"] for h in report.history]
    assert losses[-1] < losses[0]
    assert report.roc_auc >= 0.9
    assert report.n_train + report.n_val == 120
    assert report.f(0.0) == 0.0 and report.f(1.0) == pytest.approx(1.0, abs=0.1)
    # on fresh images (not seen in training) the classes separate too
    real, gen = synthetic_images(20, "real", seed=7), synthetic_images(20, "generated", seed=7)
    assert roc_auc(disc.confidence(real), disc.confidence(gen)) >= 0.9


def test_confidence_inputs_and_accept(trained, tmp_path):
    from PIL import Image

    disc, _ = trained
    arr = synthetic_images(1, "real", seed=3)[0]
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    png = buf.getvalue()
    path = tmp_path / "x.png"
    path.write_bytes(png)
    c = disc.confidence([arr, Image.fromarray(arr), png, path, arr.astype(np.float32) / 255.0])
    assert c.shape == (5,) and np.all((c >= 0) & (c <= 1))
    np.testing.assert_allclose(c, c[0], atol=1e-5)
    assert disc.accept(arr, 0.0) is True
    assert disc.accept(arr, float(c[0]) + 1e-3) is False
    with pytest.raises(ClassifierInputError):
        disc.accept(arr, 1.5)
    with pytest.raises(ClassifierInputError, match="image 0"):
        disc.confidence([b"not an image"])
    with pytest.raises(ClassifierInputError, match="shape"):
        disc.confidence([np.zeros((4, 4, 7), dtype=np.uint8)])


def test_save_load_identical_and_mismatch(trained, tmp_path):
    disc, _ = trained
    imgs = synthetic_images(6, "generated", seed=5)
    out = disc.save(tmp_path / "disc")
    again = Discriminator.load(out, light="light", profile="p")
    np.testing.assert_allclose(again.confidence(imgs), disc.confidence(imgs), atol=1e-6)
    assert again.meta.variant == "test_efficientnet" and again.meta.image_size == 32
    with pytest.raises(ModelMismatchError, match="level 'light'"):
        Discriminator.load(out, light="sdxs")
    with pytest.raises(ModelFormatError):
        Discriminator.load(tmp_path / "none")
    (out / "model.safetensors").unlink()
    with pytest.raises(ModelFormatError, match=r"model\.safetensors"):
        Discriminator.load(out)


def test_unknown_variant_and_too_few_images():
    with pytest.raises(ClassifierInputError, match="variant"):
        Discriminator.new("no_such_net_xyz")
    with pytest.raises(TrainingDataError):
        train_discriminator(synthetic_images(1, "real"), synthetic_images(5, "generated"), config=tiny_config())


def test_cli_train_discriminator(tmp_path, capsys):
    import json
    import tomllib

    from PIL import Image

    from argusdiff.cli import main

    for kind in ("real", "generated"):
        d = tmp_path / kind
        d.mkdir()
        for i, arr in enumerate(synthetic_images(16, kind, seed=11)):
            Image.fromarray(arr).save(d / f"{i}.png")
    ft = tmp_path / "ft.toml"
    argv = ["train-discriminator", "--real", str(tmp_path / "real"), "--generated", str(tmp_path / "generated")]
    argv += ["--out", str(tmp_path / "d"), "--variant", "test_efficientnet", "--image-size", "32", "--epochs", "2"]
    argv += ["--profile", "cascade-sdturbo-sdv15", "--ft-out", str(ft), "--no-progress", "--json"]
    assert main(argv) == 0
    rep = json.loads(capsys.readouterr().out)
    assert 0.0 <= rep["roc_auc"] <= 1.0 and rep["n_train"] + rep["n_val"] == 32
    parsed = tomllib.loads(ft.read_text())
    assert len(parsed["thresholds"]) == 201 == len(parsed["deferral"])
    assert Discriminator.load(tmp_path / "d").meta.light == "sdturbo"
    assert main([*argv[:5], "--out", str(tmp_path / "e"), "--profile", "sm-a100"]) == 2
    assert "no [cascade]" in capsys.readouterr().err
    assert main(["train-discriminator", "--real", str(tmp_path / "nope"), "--generated", "x", "--out", "y"]) == 2


@pytest.mark.integration
@pytest.mark.slow
def test_cli_generated_side_from_prompts(tmp_path, capsys, demo_models_dir, monkeypatch):
    import json

    from PIL import Image

    from argusdiff.cli import main
    from workers.demo import demo_profile_path

    monkeypatch.setenv("ARGUSDIFF_WORKERS__MODELS_DIR", demo_models_dir)
    monkeypatch.setenv("ARGUSDIFF_WORKERS__DEVICE", "cpu")
    real = tmp_path / "real"
    real.mkdir()
    for i, arr in enumerate(synthetic_images(8, "real", seed=2, size=64)):
        Image.fromarray(arr).save(real / f"{i}.png")
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(f"a photo of object {i}" for i in range(8)) + "\n")
    profile = str(demo_profile_path("demo-cpu-cascade"))
    argv = ["train-discriminator", "--real", str(real), "--prompts", str(prompts), "--profile", profile]
    argv += ["--out", str(tmp_path / "d"), "--variant", "test_efficientnet", "--image-size", "32", "--epochs", "1"]
    argv += ["--no-progress", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    rep = json.loads(capsys.readouterr().out)
    assert rep["n_train"] + rep["n_val"] == 16
    assert Discriminator.load(tmp_path / "d").meta.light == "sd-light"
    assert main([*argv[:5], "--out", str(tmp_path / "e")]) == 2  # --prompts without --profile
    assert "--profile" in capsys.readouterr().err


def _imagenet_checkpoint(tmp_path):
    """A 1000-class test_efficientnet saved as an ImageNet-style checkpoint (.safetensors and .pth)."""
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(123)
    net = timm.create_model("test_efficientnet", pretrained=False)  # 1000 classes, as ImageNet weights
    state = {k: v.contiguous() for k, v in net.state_dict().items()}
    save_file(state, str(tmp_path / "in1k.safetensors"))
    folder = tmp_path / "snapshot"
    folder.mkdir()
    torch.save(state, folder / "pytorch_model.bin")
    return state, tmp_path / "in1k.safetensors", folder


def test_new_discriminator_from_local_pretrained_weights(tmp_path):
    """DiffServe fine-tunes an ImageNet-pretrained EfficientNet-V2: the backbone starts from the
    local weights, the two-class head is new; the weights' file is recorded in the saved model."""
    import torch

    state, file, folder = _imagenet_checkpoint(tmp_path)
    for source in (file, folder):
        disc = Discriminator.new("test_efficientnet", image_size=32, pretrained=source)
        got = disc.model.state_dict()
        backbone = [k for k in state if not k.startswith("classifier.")]
        assert backbone and all(torch.equal(got[k], state[k]) for k in backbone)
        assert got["classifier.weight"].shape[0] == 2 and state["classifier.weight"].shape[0] == 1000
        assert disc.meta.pretrained is not None and disc.meta.pretrained.endswith((".safetensors", ".bin"))
    random = Discriminator.new("test_efficientnet", image_size=32)
    assert random.meta.pretrained is None
    assert not torch.equal(random.model.state_dict()["conv_stem.weight"], state["conv_stem.weight"])
    disc.save(tmp_path / "saved")
    assert Discriminator.load(tmp_path / "saved").meta.pretrained == disc.meta.pretrained
    with pytest.raises(ClassifierInputError, match="no such file"):
        Discriminator.new("test_efficientnet", pretrained=tmp_path / "missing.safetensors")
    with pytest.raises(ClassifierInputError, match="pretrained weights"):
        Discriminator.new("tf_efficientnetv2_b0", image_size=32, pretrained=file)  # another architecture


def test_training_starts_from_pretrained_weights(tmp_path, capsys):
    import json

    from PIL import Image

    from argusdiff.cli import main

    _, file, _ = _imagenet_checkpoint(tmp_path)
    for kind in ("real", "generated"):
        d = tmp_path / kind
        d.mkdir()
        for i, arr in enumerate(synthetic_images(8, kind, seed=5)):
            Image.fromarray(arr).save(d / f"{i}.png")
    argv = ["train-discriminator", "--real", str(tmp_path / "real"), "--generated", str(tmp_path / "generated")]
    argv += ["--variant", "test_efficientnet", "--image-size", "32", "--epochs", "1", "--no-progress", "--json"]
    assert main([*argv, "--out", str(tmp_path / "d"), "--pretrained", str(file)]) == 0
    capsys.readouterr()
    assert Discriminator.load(tmp_path / "d").meta.pretrained == str(file)
    assert main([*argv, "--out", str(tmp_path / "e"), "--pretrained", str(tmp_path / "nope.pth")]) == 2
    err = capsys.readouterr().err
    assert "--pretrained" in err and "nope.pth" in err
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[classifier]\ndiscriminator_pretrained = "{file}"\n')
    assert main([*argv, "--out", str(tmp_path / "f"), "--config", str(cfg)]) == 0
    assert json.loads(capsys.readouterr().out)["n_train"] > 0
    assert Discriminator.load(tmp_path / "f").meta.pretrained == str(file)
