"""``argusdiff generate`` on the shipped demo profiles (tiny models, offline)."""

from __future__ import annotations

import json

import pytest

from argusdiff.cli import main

pytestmark = pytest.mark.integration


@pytest.fixture
def env(monkeypatch, demo_models_dir):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ARGUSDIFF_MODELS_DIR", demo_models_dir)
    monkeypatch.setenv("ARGUSDIFF_WORKERS__TORCH_THREADS", "1")


def test_generate_default_profile_writes_a_png(env, tmp_path, capsys):
    out = tmp_path / "img.png"
    assert main(["generate", "a red cube on a table", "--out", str(out), "--seed", "4"]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")
    text = capsys.readouterr()
    assert "demo-cpu/xl-k0" in text.out and "8 UNet calls" in text.out and "seed 4" in text.out
    assert "not image quality" in text.err


def test_generate_ac_level_with_a_local_cache(env, tmp_path, capsys, monkeypatch):
    import fixtures_workers

    import workers.ac as ac

    monkeypatch.setattr(ac, "default_embedder", lambda: lambda texts: fixtures_workers.hash_embed(texts, 384))
    cache = tmp_path / "cache"
    args = ["generate", "a castle", "--level", "xl-k2", "--cache", str(cache), "--seed", "1", "--json"]
    assert main([*args, "--out", str(tmp_path / "a.png")]) == 0
    first = json.loads(capsys.readouterr().out)
    assert (first["cache_hit"], first["unet_calls"], first["cache_error"]) == (False, 8, None)
    assert main([*args, "--out", str(tmp_path / "b.png")]) == 0
    second = json.loads(capsys.readouterr().out)
    assert (second["cache_hit"], second["k_used"], second["unet_calls"]) == (True, 2, 6)


def test_generate_cascade_defers_inline_from_the_light_latent(env, tmp_path, capsys):
    out = tmp_path / "c.png"
    args = ["generate", "a cat", "--profile", "demo-cpu-cascade", "--level", "sd-light", "--out", str(out)]
    assert main([*args, "--json"]) == 0  # no discriminator: the light image is returned
    light = json.loads(capsys.readouterr().out)
    assert light["level"] == "sd-light" and light["unet_calls"] == 1
    assert main(["generate", "a cat", "--profile", "demo-cpu-sm", "--level", "sd-4", "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["unet_calls"] == 4


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--level", "nope"], "option --level: profile 'demo-cpu' has no level 'nope'"),
        (["--profile", "no-such-profile"], "unknown profile 'no-such-profile'"),
        (["--threshold", "2"], "option --threshold must be in [0, 1]"),
        (["--discriminator", "/x"], "option --discriminator applies to the cascade light level"),
        (["--profile", "demo-cpu-sm", "--cache", "/tmp/x"], "option --cache applies to approximate-caching"),
    ],
)
def test_generate_bad_input_exits_2_with_a_clear_message(env, tmp_path, capsys, extra, message):
    assert main(["generate", "x", "--out", str(tmp_path / "x.png"), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_generate_cascade_with_a_saved_discriminator(env, tmp_path, capsys):
    from classifiers.discriminator import Discriminator

    disc = tmp_path / "disc"
    Discriminator.new("test_efficientnet", image_size=32, light="sd-light").save(disc)
    base = ["generate", "a cat", "--profile", "demo-cpu-cascade", "--level", "sd-light", "--seed", "2"]
    base += ["--discriminator", str(disc), "--json", "--out", str(tmp_path / "c.png")]
    assert main([*base, "--threshold", "0"]) == 0
    kept = json.loads(capsys.readouterr().out)
    assert kept["level"] == "sd-light" and not kept["deferred"] and 0 <= kept["confidence"] <= 1
    assert main([*base, "--threshold", "1", "--heavy-from-light", "0.5"]) == 0
    redone = json.loads(capsys.readouterr().out)
    assert redone["level"] == "sd-heavy" and redone["deferred"] and redone["unet_calls"] == 1 + 4
