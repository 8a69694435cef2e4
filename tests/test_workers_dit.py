"""DiT and flow-matching pipelines on tiny real diffusers models (FLUX.1- and SD3-shaped, built
from configs): batched generation and decode, the denoiser-agnostic step counter, the dtype per
family, latent capture after K steps and a bit-exact resume, and the AC executor's cache path with
FLUX's packed latents."""

from __future__ import annotations

import numpy as np
import pytest
from scripts_module import load_script

from argusdiff.domain import ApproxLevel, Strategy
from workers.messages import WorkItem

pytestmark = pytest.mark.integration

DIT_MODELS = ["demo-tiny-flux", "demo-tiny-sd3"]


@pytest.mark.parametrize("model_name", DIT_MODELS)
def test_dit_generates_a_batch_and_counts_transformer_steps(demo_registry, model_name):
    import torch

    from workers.pipelines import denoiser, generate, latent_shape

    model = demo_registry.load(model_name)
    assert denoiser(model.pipe) is model.pipe.transformer
    gen = generate(model, ["a red cube", "a blue sphere"], [1, 2], steps=3)
    assert gen.unet_calls == 3  # one transformer call per step (SD3 batches its CFG branches)
    assert tuple(gen.latents.shape) == latent_shape(model, 2)
    assert len(gen.images) == 2 and gen.images[0].size == (model.spec.width, model.spec.height)
    assert bool(torch.isfinite(gen.latents).all())
    again = generate(model, ["a red cube", "a blue sphere"], [1, 2], steps=3)
    assert torch.equal(again.latents, gen.latents)  # seeded: the same run twice
    other = generate(model, ["a red cube", "a blue sphere"], [1, 3], steps=3)
    assert not torch.equal(other.latents[1], gen.latents[1])


def test_flux_latents_are_packed_tokens(demo_registry):
    from workers.pipelines import latent_shape

    model = demo_registry.load("demo-tiny-flux")
    # 64 px, VAE 8x, 16 channels packed 2x2: (64/16)^2 = 16 tokens of 64 values
    assert latent_shape(model, 3) == (3, 16, 64)
    assert latent_shape(demo_registry.load("demo-tiny-sd3"), 1) == (1, 16, 8, 8)


@pytest.mark.parametrize("model_name", DIT_MODELS)
def test_flow_matching_resume_from_step_k_is_bit_exact(demo_registry, model_name):
    import torch

    from workers.pipelines import generate, resume

    model = demo_registry.load(model_name)
    n = 4
    full = generate(model, ["a lighthouse at dusk"], [11], steps=n, capture=(1, 2))
    assert full.unet_calls == n and sorted(full.captured) == [1, 2]
    for k in (1, 2):
        res = resume(model, ["a lighthouse at dusk"], full.captured[k], k, [11], steps=n)
        assert res.unet_calls == n - k
        assert torch.equal(res.latents, full.latents)
        assert np.array_equal(np.asarray(res.images[0]), np.asarray(full.images[0]))
    # from numpy (as the cache returns it), and the schedule is restored after a resume
    res = resume(model, ["a lighthouse at dusk"], [full.captured[2][0].numpy()], 2, [11], steps=n)
    assert torch.equal(res.latents, full.latents)
    assert "set_timesteps" not in vars(model.pipe.scheduler)
    other = resume(model, ["a field of tulips"], full.captured[2], 2, [11], steps=n)
    assert not torch.equal(other.latents, full.latents)  # the new prompt steers the last N-K steps


def test_flux_resume_keeps_the_resolution_dependent_shift(demo_registry):
    """FLUX.1's scheduler shifts its sigmas by mu, from the image's token count: a resumed run
    must use the shifted sigmas of the full run from step K on."""
    from workers.pipelines import generate, resume

    model = demo_registry.load("demo-tiny-flux")
    sched = model.pipe.scheduler
    assert sched.config.use_dynamic_shifting
    generate(model, ["x"], [0], steps=4, decode_images=False)
    full_sigmas = sched.sigmas.clone()
    lat = generate(model, ["x"], [0], steps=4, capture=(2,), decode_images=False).captured[2]
    resume(model, ["x"], lat, 2, [0], steps=4, decode_images=False)
    assert sched.sigmas.tolist() == full_sigmas[2:].tolist()
    assert full_sigmas[1].item() != pytest.approx(0.75)  # shifted (the unshifted grid is 1, .75, .5, .25)


def test_stochastic_flow_sampler_is_refused_for_ac(demo_models_dir):
    from workers.errors import UnsupportedScheduler
    from workers.pipelines import generate, resume
    from workers.registry import ModelRegistry

    reg = ModelRegistry(
        device="cpu",
        models_dir=demo_models_dir,
        overrides={
            "demo-tiny-sd3": {
                "scheduler": "FlowMatchEulerDiscreteScheduler",
                "scheduler_kwargs": {"stochastic_sampling": True},
            }
        },
    )
    model = reg.load("demo-tiny-sd3")
    with pytest.raises(UnsupportedScheduler, match="stochastic_sampling"):
        generate(model, ["x"], [0], steps=2, capture=(1,))
    with pytest.raises(UnsupportedScheduler, match="stochastic_sampling"):
        resume(model, ["x"], np.zeros((1, 16, 8, 8), np.float16), 1, [0], steps=2)
    assert generate(model, ["x"], [0], steps=2).unet_calls == 2  # plain generation still runs


def test_resume_rejects_an_unpacked_latent_for_flux(demo_registry):
    from workers.errors import LatentMismatch
    from workers.pipelines import resume

    model = demo_registry.load("demo-tiny-flux")
    with pytest.raises(LatentMismatch, match="shape"):
        resume(model, ["x"], np.zeros((1, 16, 8, 8), np.float16), 2, [0], steps=4)


def test_dtype_per_family_and_the_dtype_keyword(demo_models_dir):
    from workers.registry import ModelRegistry, dtype_keyword

    gpu = ModelRegistry(device="cuda", models_dir=demo_models_dir)
    assert gpu.torch_dtype_name(gpu.spec("flux.1-dev")) == "bfloat16"  # the model cards' dtype
    assert gpu.torch_dtype_name(gpu.spec("sd3.5-large")) == "bfloat16"
    assert gpu.torch_dtype_name(gpu.spec("sdxl-base-1.0")) == "float16"
    forced = ModelRegistry(device="cuda", dtype="float16", models_dir=demo_models_dir)
    assert forced.torch_dtype_name(forced.spec("flux.1-dev")) == "float16"
    cpu = ModelRegistry(device="cpu", models_dir=demo_models_dir)
    assert cpu.torch_dtype_name(cpu.spec("flux.1-dev")) == "float32"
    assert dtype_keyword("0.42.1") == "dtype" and dtype_keyword("0.35.0") == "torch_dtype"


def _flux_level(k: int) -> ApproxLevel:
    return ApproxLevel(
        id=f"flux-k{k}",
        strategy=Strategy.AC,
        model="demo-tiny-flux",
        steps=4,
        skip=k,
        latency_s={1: 0.1},
        quality=1.0,
        load_time_s=0.1,
    )


def test_ac_executor_stores_and_resumes_packed_flux_latents(demo_registry, memory_cache, hash_embedder):
    from workers.ac import ApproxCacheExecutor

    full = ApproxCacheExecutor(_flux_level(0), demo_registry, cache=memory_cache, embed=hash_embedder, capture_ks=(2,))
    first = full.run([WorkItem("r1", "a castle on a hill", "flux-k0", seed=3)])[0]
    assert first.ok and not first.cache_hit and first.unet_calls == 4
    _, stored, meta = memory_cache.entries[0]
    assert sorted(stored) == [2] and stored[2].shape == (16, 64)
    assert (meta.model, meta.scheduler, meta.steps, tuple(meta.shape)) == (
        "demo-tiny-flux",
        "FlowMatchEulerDiscreteScheduler",
        4,
        (16, 64),
    )
    k2 = ApproxCacheExecutor(_flux_level(2), demo_registry, cache=memory_cache, embed=hash_embedder)
    hit, miss = k2.run(
        [
            WorkItem("r2", "a castle on a hill", "flux-k2", seed=3),
            WorkItem("r3", "unrelated words entirely", "flux-k2", seed=4),
        ]
    )
    assert hit.ok and hit.cache_hit and hit.k_used == 2 and hit.unet_calls == 2
    assert miss.ok and not miss.cache_hit and miss.unet_calls == 4
    assert hit.image_png and hit.image_png.startswith(b"\x89PNG")


def test_check_cuda_path_runs_the_dit_checks_on_cpu(demo_models_dir, tmp_path, capsys):
    """The GPU check script (scripts/check_cuda_path.py) with ``--device cpu``: its DiT checks pass
    here, so a failure on a GPU is the GPU's."""
    import json

    script = load_script("check_cuda_path")
    argv = ["--device", "cpu", "--dtype", "float32", "--only", "dit_generate,dit_resume,feature_cache,dit_edit",
            "--out", str(tmp_path), "--models-dir", demo_models_dir]  # fmt: skip
    assert script.main(argv) == 0, capsys.readouterr().out
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report) >= {"dit_generate", "dit_resume"} and "generate" not in report
    assert all(report["dit_resume"][m]["bit_exact"] for m in ("demo-tiny-flux", "demo-tiny-sd3"))
    assert report["dit_generate"]["demo-tiny-flux"]["transformer_dtype"] == "torch.float32"
    assert report["feature_cache"]["hit_rate"] > 0 and report["feature_cache"]["restored_bit_exact"]
    assert report["dit_edit"]["ok"] and report["dit_edit"]["demo-tiny-sd3"]["calls_inpaint"] == 8
    with pytest.raises(SystemExit) as exc:
        script.main(["--only", "nope"])
    assert exc.value.code == 2
