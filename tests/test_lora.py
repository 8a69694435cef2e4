"""Per-request LoRA adapters: tiny LoRA weights built here with peft on the tiny demo models, loaded by
the workers with diffusers (``load_lora_weights``, ``set_adapters``, an LRU), never batched with
another adapter, part of the latent cache's key, and part of the routing decision (a request is
served only by its adapter's model; an unknown adapter is a 400 naming it)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from argusdiff.domain import AdapterSpec, ApproxLevel, Strategy
from argusdiff.service.transport.memory import InProcessWorkQueue
from workers.loop import Worker
from workers.messages import WorkItem

pytestmark = pytest.mark.integration
pytest.importorskip("peft")

SD = ApproxLevel(id="sd", strategy=Strategy.SM, model="demo-tiny-sd", steps=4, skip=0, latency_s={1: 0.1},
                 quality=1.0, load_time_s=0.1)  # fmt: skip


def build_lora(models_dir: str, out, kind: str = "tiny-sd", seed: int = 0) -> str:
    """Random (non-zero) LoRA weights on the demo UNet's attention projections, saved as diffusers'
    ``save_lora_weights`` writes them."""
    import diffusers
    import torch
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from workers.demo import ensure_demo_model

    folder = ensure_demo_model(kind, models_dir)
    unet = diffusers.UNet2DConditionModel.from_pretrained(folder, subfolder="unet")
    torch.manual_seed(seed)
    unet.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights=False,
                                target_modules=["to_q", "to_k", "to_v", "to_out.0"]))  # fmt: skip
    layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(unet))
    cls = diffusers.StableDiffusionXLPipeline if kind == "tiny-sdxl" else diffusers.StableDiffusionPipeline
    cls.save_lora_weights(str(out), unet_lora_layers=layers, safe_serialization=True)
    return str(out)


@pytest.fixture(scope="module")
def demo_registry(demo_models_dir):
    """A registry of this module's own: loading adapters wraps the pipeline's layers (peft), and the
    session's shared registry must stay as plain as the other tests expect it (they compare and save
    its weights)."""
    from workers.registry import ModelRegistry

    return ModelRegistry(device="cpu", models_dir=demo_models_dir, max_loaded=2)


@pytest.fixture(scope="module")
def loras(demo_models_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("loras")
    return {
        "ink": AdapterSpec("ink", "demo-tiny-sd", build_lora(demo_models_dir, root / "ink", seed=1)),
        "neon": AdapterSpec("neon", "demo-tiny-sd", build_lora(demo_models_dir, root / "neon", seed=2), scale=0.5),
    }


def _pixels(png: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)))


def _item(rid: str, lora: str | None = None, seed: int = 7, level: str = "sd", **meta) -> WorkItem:
    if lora is not None:
        meta["lora"] = lora
    return WorkItem(rid, "a lighthouse at dusk", level, seed=seed, meta=meta)


def _run(worker: Worker, queue: InProcessWorkQueue, *items: WorkItem) -> list:
    for it in items:
        queue.put(it.level, it)
    while worker.run_once():
        pass
    return [queue.wait_result(it.request_id, 10) for it in items]


def _worker(demo_registry, loras, level=SD, *, batch: int = 1, max_adapters: int = 4, cache=None, embed=None):
    from workers.executor import build_executor

    queue = InProcessWorkQueue()
    ex = build_executor(level, demo_registry, cache, adapters=list(loras.values()), max_adapters=max_adapters,
                        embed=embed, capture_ks=(2,))  # fmt: skip
    return Worker("w", queue, lambda lv: ex, level=level.id, batch_size=batch, poll_s=0.01), queue, ex


def test_an_adapter_changes_the_image_and_never_leaks(demo_registry, loras):
    worker, queue, ex = _worker(demo_registry, loras)
    plain, ink, ink_again, plain_again, half = _run(
        worker, queue, _item("a"), _item("b", "ink"), _item("c", "ink"), _item("d"), _item("e", "ink", lora_scale="0.5")
    )
    assert all(r.ok for r in (plain, ink, ink_again, plain_again, half))
    assert not np.array_equal(_pixels(plain.image_png), _pixels(ink.image_png))
    assert np.array_equal(_pixels(ink.image_png), _pixels(ink_again.image_png))  # reproducible with the adapter
    assert np.array_equal(_pixels(plain.image_png), _pixels(plain_again.image_png))  # disabled after it
    assert not np.array_equal(_pixels(half.image_png), _pixels(ink.image_png))  # the scale is applied
    slots = ex.loaded.extras["adapters"]
    assert slots.loads == 1 and slots.active == ("ink", 0.5)  # loaded once, switched per run


def test_different_adapters_are_never_batched_together(demo_registry, loras):
    alone = {}
    worker, queue, _ = _worker(demo_registry, loras)
    for rid, lora in (("x", "ink"), ("y", "neon"), ("z", None)):
        alone[lora] = _pixels(_run(worker, queue, _item(rid, lora))[0].image_png)
    worker, queue, ex = _worker(demo_registry, loras, batch=3, max_adapters=1)
    mixed = _run(worker, queue, _item("p", "ink"), _item("q", "neon"), _item("r"))
    assert worker.stats.batches == 1  # one batch taken, run as three: one per adapter
    for res, lora in zip(mixed, ("ink", "neon", None), strict=True):
        assert res.ok and res.timings["batch"] == 1.0
        assert np.array_equal(_pixels(res.image_png), alone[lora]), lora
    slots = ex.loaded.extras["adapters"]
    assert slots.evictions >= 1 and len(slots.loaded) == 1  # the LRU of one adapter


def test_the_latent_cache_keys_include_the_adapter(demo_registry, loras, memory_cache, hash_embedder):
    def ac(k: int) -> ApproxLevel:
        return ApproxLevel(id=f"sd-k{k}", strategy=Strategy.AC, model="demo-tiny-sd", steps=4, skip=k,
                           latency_s={1: 0.1}, quality=1.0, load_time_s=0.1)  # fmt: skip

    full, q0, _ = _worker(demo_registry, loras, ac(0), cache=memory_cache, embed=hash_embedder)
    (stored,) = _run(full, q0, _item("s", "ink", level="sd-k0"))
    assert stored.ok and {m.model for _, _, m in memory_cache.entries} == {"demo-tiny-sd+lora:ink@1"}
    k2, q2, _ = _worker(demo_registry, loras, ac(2), cache=memory_cache, embed=hash_embedder)
    plain, other, same = _run(k2, q2, _item("u", level="sd-k2"), _item("v", "neon", level="sd-k2"),
                              _item("w", "ink", level="sd-k2"))  # fmt: skip
    assert not plain.cache_hit and not other.cache_hit  # another adapter's latent, or none: never reused
    assert same.cache_hit and same.k_used == 2


def test_routing_keeps_a_request_on_its_adapters_model():
    from argusdiff.domain import Plan, Refusal, Request
    from argusdiff.policies import make_policy
    from argusdiff.policies.base import MODELS_UNSERVED, RouteView
    from argusdiff.profile import load_profile

    profile = load_profile("demo-cpu-sm")  # xl (demo-tiny-sdxl), sd-4 (demo-tiny-sd), sd-1step
    policy = make_policy("argus", profile, rng=np.random.default_rng(0), classifier=None, config={"slo_s": 10.0})
    plan = Plan(version=1, created_s=0.0, strategy=Strategy.SM, levels=profile.ids,
                assignment={"w0": "xl", "w1": "sd-1step"}, share=(1.0, 0.0, 0.0),
                pasm=((1.0, 0.0, 0.0),) * 3, predicted_qpm=1.0, expected_quality=1.0)  # fmt: skip
    view = RouteView(now_s=0.0, queue_lengths={}, busy_until={}, worker_models=dict(plan.assignment),
                     up=frozenset(plan.assignment), slo_s=10.0)  # fmt: skip
    req = Request(id="r", prompt="a", arrival_s=0.0, models=frozenset({"demo-tiny-sd-1step"}))
    assert policy.decide(req, plan, view).level == "sd-1step"
    req = Request(id="r", prompt="a", arrival_s=0.0, models=frozenset({"demo-tiny-sd"}))  # sd-4 has no worker
    refused = policy.decide(req, plan, view)
    assert refused.dropped and refused.refusal is Refusal.MODELS_UNSERVED and refused.reason == MODELS_UNSERVED


def test_the_api_names_an_unknown_adapter_and_serves_a_known_one(live_service, demo_models_dir, tmp_path):
    openai = pytest.importorskip("openai")
    from fixtures_service import demo_model_settings

    from argusdiff.config import Settings
    from argusdiff.profile import resolve_profile

    lora = build_lora(demo_models_dir, tmp_path / "xl-ink", kind="tiny-sdxl")
    text = resolve_profile("demo-cpu").read_text()
    text += f'\n[[adapters]]\nname = "ink"\nmodel = "demo-tiny-sdxl"\nsource = "{lora}"\nscale_max = 1.5\n'
    (tmp_path / "p.toml").write_text(text)
    base = demo_model_settings(demo_models_dir, tmp_path / "cache", policy="argus").model_dump()
    base["profile"] = str(tmp_path / "p.toml")
    server = live_service(Settings.model_validate(base))
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as exc:
        client.images.generate(prompt="a", extra_body={"lora": "watercolour"})
    err = exc.value.body
    assert err["param"] == "lora" and err["code"] == "adapter_not_found" and "watercolour" in err["message"]
    assert "ink" in err["message"]
    with pytest.raises(openai.BadRequestError) as exc:
        client.images.generate(prompt="a", extra_body={"lora": {"name": "ink", "scale": 3}})
    assert exc.value.body["param"] == "lora" and "[0, 1.5]" in exc.value.body["message"]
    import httpx

    url = f"{server.url}/v1/argusdiff/generations"
    body = {"prompt": "a red barn", "seed": 3, "min_quality_level": "xl-k0"}
    plain = httpx.post(url, json=body, timeout=120).json()["data"][0]
    inked = httpx.post(url, json={**body, "lora": {"name": "ink", "scale": 1.2}}, timeout=120).json()["data"][0]
    assert plain["b64_json"] != inked["b64_json"] and inked["level"].startswith("xl-")
