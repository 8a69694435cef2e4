"""``POST /v1/images/edits`` with the official ``openai`` client: img2img and inpainting on the real
tiny pipelines (the denoising network's calls counted: ``strength × N`` steps), and validation as
strict as generations' (every rejection a 400 naming the field, or 413/415)."""

from __future__ import annotations

import base64
import io

import httpx
import pytest
from fixtures_service import demo_model_settings, service_settings

pytestmark = pytest.mark.integration

openai = pytest.importorskip("openai")


def _png(size=(64, 64), mode="RGB", colour=(200, 30, 30), hole: int = 0) -> bytes:
    from PIL import Image

    img = Image.new(mode, size, colour if mode == "RGB" else (*colour, 255))
    if hole:
        img.paste((0, 0, 0, 0), (0, 0, hole, hole))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture
def unet_calls(monkeypatch):
    from diffusers import UNet2DConditionModel

    calls = []
    original = UNet2DConditionModel.forward

    def forward(module, *args, **kwargs):
        calls.append(1)
        return original(module, *args, **kwargs)

    monkeypatch.setattr(UNet2DConditionModel, "forward", forward)
    return calls


def test_img2img_and_inpainting_on_the_tiny_pipelines(live_service, demo_models_dir, tmp_path, unet_calls):
    from PIL import Image

    server = live_service(demo_model_settings(demo_models_dir, tmp_path / "cache", policy="argus"))
    client = _client(server)
    out = client.images.edit(image=("in.png", _png(), "image/png"), prompt="make it blue", response_format="b64_json")
    img = Image.open(io.BytesIO(base64.b64decode(out.data[0].b64_json)))
    assert img.size == (64, 64) and out.size == "64x64"
    assert len(unet_calls) == 6  # strength 0.75 of the level's 8 steps (no cache, no resume)
    unet_calls.clear()
    out = client.images.edit(
        image=("in.png", _png(), "image/png"),
        mask=("mask.png", _png(mode="RGBA", hole=32), "image/png"),
        prompt="a window",
        n=2,
        response_format="b64_json",
    )
    assert len(out.data) == 2 and len(unet_calls) == 16  # inpainting: all 8 steps inside the mask, twice
    unet_calls.clear()
    # DALL-E 2's convention: an image with transparent pixels is its own mask; a larger image is resized
    out = client.images.edit(image=("in.png", _png((128, 128), mode="RGBA", hole=64), "image/png"), prompt="a door",
                             size="1024x1024", extra_body={"strength": 0.5})  # fmt: skip
    assert out.data[0].url.startswith(server.url) and len(unet_calls) == 4
    assert httpx.get(out.data[0].url).status_code == 200


@pytest.fixture
def server(live_service):
    return live_service(service_settings(max_image_bytes=16 << 10))


@pytest.mark.parametrize(
    ("files", "data", "status", "param"),
    [
        ({}, {"prompt": "a"}, 400, "image"),
        ({"image": ("x.png", b"not an image", "image/png")}, {"prompt": "a"}, 400, "image"),
        ({"image": ("x.gif", b"GIF89a\x01\x00\x01\x00\x00\x00\x00;", "image/gif")}, {"prompt": "a"}, 400, "image"),
        ({"image": ("x.png", _png())}, {}, 400, "prompt"),
        ({"image": ("x.png", _png())}, {"prompt": "  "}, 400, "prompt"),
        ({"image": ("x.png", _png())}, {"prompt": "a", "n": "9"}, 400, "n"),
        ({"image": ("x.png", _png())}, {"prompt": "a", "n": "two"}, 400, "n"),
        ({"image": ("x.png", _png())}, {"prompt": "a", "size": "7x7"}, 400, "size"),
        ({"image": ("x.png", _png())}, {"prompt": "a", "response_format": "jpeg"}, 400, "response_format"),
        ({"image": ("x.png", _png())}, {"prompt": "a", "strength": "0"}, 400, "strength"),
        ({"image": ("x.png", _png())}, {"prompt": "a", "style": "vivid"}, 400, "style"),
        ({"image": ("x.png", _png()), "mask": ("m.png", _png((32, 32), "RGBA", hole=8))}, {"prompt": "a"}, 400,
         "mask"),
        ({"image": ("x.png", _png()), "mask": ("m.png", _png())}, {"prompt": "a"}, 400, "mask"),  # no alpha
        ({"image": ("x.png", _png()), "mask": ("m.png", _png(mode="RGBA"))}, {"prompt": "a"}, 400, "mask"),  # opaque
        ({"image": ("x.png", _png()), "extra": ("e.png", _png())}, {"prompt": "a"}, 400, "extra"),
        ({"image": ("x.png", _png((256, 256), colour=(1, 2, 3)) + b"\0" * (20 << 10))}, {"prompt": "a"}, 413, "image"),
    ],
)  # fmt: skip
def test_edit_validation_names_the_field(server, files, data, status, param):
    r = httpx.post(f"{server.url}/v1/images/edits", files=files or {"x": (None, "")}, data=data)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"], err


def test_edits_with_the_client_and_the_wrong_content_type(server):
    client = _client(server)
    out = client.images.edit(image=("x.png", _png(), "image/png"), prompt="a", n=2, response_format="b64_json")
    assert len(out.data) == 2
    with pytest.raises(openai.BadRequestError) as exc:
        client.images.edit(image=("x.png", _png(), "image/png"), prompt="a", model="dall-e-9")
    assert exc.value.body["param"] == "model"
    r = httpx.post(f"{server.url}/v1/images/edits", json={"prompt": "a"})
    assert r.status_code == 415 and "multipart/form-data" in r.json()["error"]["message"]
    two = [("image", ("a.png", _png())), ("image", ("b.png", _png()))]
    twice = httpx.post(f"{server.url}/v1/images/edits", files=two, data={"prompt": "a"})
    assert twice.status_code == 400 and twice.json()["error"]["param"] == "image"


# ---- DiT levels: FLUX.1 and SD3 edits -------------------------------------------------------------

SD3_PROFILE = """
name = "edits-sd3"
gpu = "cpu"
description = "test: one level on the tiny SD3-shaped pipeline (random weights)"
slo_s = 2.0

[[levels]]
id = "sd3"
strategy = "sm"
model = "demo-tiny-sd3"
steps = 8
latency_s = { 1 = 0.05 }   # nominal: a pipeline check
quality = 1.0
load_time_s = 1.0
"""


def _denoiser_calls(monkeypatch, cls_name: str) -> list:
    import diffusers

    cls = getattr(diffusers, cls_name)
    calls: list[int] = []
    original = cls.forward

    def forward(module, *args, **kwargs):
        calls.append(1)
        return original(module, *args, **kwargs)

    monkeypatch.setattr(cls, "forward", forward)
    return calls


@pytest.mark.parametrize(
    ("profile", "denoiser"), [("demo-cpu-flux", "FluxTransformer2DModel"), ("sd3", "SD3Transformer2DModel")]
)
def test_edits_on_dit_levels(profile, denoiser, live_service, demo_models_dir, tmp_path, monkeypatch):
    """An edit routed to a FLUX.1 level runs FluxImg2ImgPipeline / FluxInpaintPipeline, one routed
    to an SD3 level StableDiffusion3Img2ImgPipeline / StableDiffusion3InpaintPipeline, over the
    loaded model's components: strength x N steps of its flow-matching schedule."""
    from PIL import Image

    if profile == "sd3":
        path = tmp_path / "edits-sd3.toml"
        path.write_text(SD3_PROFILE)
        profile = str(path)
    calls = _denoiser_calls(monkeypatch, denoiser)
    settings = demo_model_settings(demo_models_dir, tmp_path / "cache", policy="argus", profile=profile)
    server = live_service(settings)
    client = _client(server)
    out = client.images.edit(image=("in.png", _png(), "image/png"), prompt="make it blue", response_format="b64_json")
    assert Image.open(io.BytesIO(base64.b64decode(out.data[0].b64_json))).size == (64, 64)
    assert len(calls) == 6  # strength 0.75 of the level's 8 steps
    calls.clear()
    out = client.images.edit(
        image=("in.png", _png(), "image/png"),
        mask=("mask.png", _png(mode="RGBA", hole=32), "image/png"),
        prompt="a window",
        n=2,
        response_format="b64_json",
    )
    assert len(out.data) == 2 and len(calls) == 16  # inpainting: all 8 steps inside the mask, twice
    calls.clear()
    out = client.images.edit(image=("in.png", _png((128, 128)), "image/png"), prompt="a door",
                             extra_body={"strength": 0.5})  # fmt: skip
    assert out.data[0].url.startswith(server.url) and len(calls) == 4
    png = httpx.get(out.data[0].url)
    assert png.status_code == 200 and Image.open(io.BytesIO(png.content)).size == (64, 64)


def test_every_family_has_edit_pipelines():
    """No level can be routed an edit its model's family cannot serve: every family the registry
    knows has an img2img and an inpainting pipeline in diffusers."""
    import typing

    import diffusers

    from workers.edits import EDIT_PIPELINES
    from workers.registry import FAMILY_PIPELINES, Family

    assert set(EDIT_PIPELINES) == set(typing.get_args(Family)) == set(FAMILY_PIPELINES)
    for img2img, inpaint in EDIT_PIPELINES.values():
        assert callable(getattr(diffusers, img2img)) and callable(getattr(diffusers, inpaint))
