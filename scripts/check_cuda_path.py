#!/usr/bin/env python
"""Check the worker path on a device with the tiny demo models: what an operator runs on a GPU
machine before trusting it.

    python scripts/check_cuda_path.py --device cuda --dtype float16 --out /tmp/cuda-check

Checks, each printed as ``ok`` or ``FAIL``:

1. **generate**: the tiny SD-XL runs a batch of 2 on the device in the asked dtype (the UNet's
   parameters really are in that dtype and on that device); latents and images are finite;
2. **AC capture/resume**: a full N = 8 run capturing the latent after K = 4, then a resume from
   that latent, gives the same final latent bit for bit, with N − K UNet steps (approximate
   caching's exactness claim, docs/workers.md);
3. **cascade**: one-step light model → discriminator (timm's tiny ``test_efficientnet``, random
   weights, on the device) → heavy model inline: threshold 0 accepts every light image, threshold
   1 defers every one to the heavy model, and the deferred images are the heavy model's;
4. **profile measure**: ``argusdiff profile measure`` on ``demo-cpu-cascade`` with this device and
   dtype writes a profile that ``argusdiff profile show`` loads and ``argusdiff plan`` plans; on
   CUDA its ``[measured]`` table has the GPU memory per model and the driver;
5. **DiT generate**: the tiny FLUX.1- and SD3-shaped pipelines run a batch of 2 on the device in
   the asked dtype (the transformer's parameters in that dtype, on that device), one transformer
   call per step, finite latents and images;
6. **DiT resume**: flow matching's capture after K = 4 of N = 8 and resume from it give the full
   run's final latent bit for bit, for FLUX.1's packed latents (with its resolution-dependent
   shift) and SD3's.

7. **feature cache**: the tiny FLUX.1 with diffusers' First Block Cache (``demo-cpu-flux``'s
   ``flux-fbc`` level) skips attention work, changes the result, and once the hook is removed the
   model gives the uncached run's latents bit for bit.

8. **DiT edit**: an image edit on each tiny DiT, img2img (FluxImg2ImgPipeline,
   StableDiffusion3Img2ImgPipeline) at strength 0.75 of N = 8 (6 transformer calls) and inpainting
   with a mask (FluxInpaintPipeline, StableDiffusion3InpaintPipeline: 8), finite 64×64 images; on
   the tiny FLUX.1 the edit with ``flux-fbc``'s First Block Cache skips attention work.

``--only NAME,...`` runs some of the checks (``--list`` names them); a test runs the DiT checks
with ``--device cpu``.

A JSON report goes to ``--out``/report.json. Exit 0 when every check passes, 1 otherwise. On a
CPU (``--device cpu``) it exercises the same code without CUDA kernels.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _check_generate(registry, device: str, dtype: str) -> dict:
    import numpy as np
    import torch

    from workers.pipelines import generate

    model = registry.load("demo-tiny-sdxl")
    gen = generate(model, ["a red cube", "a blue sphere"], [1, 2])
    unet = next(model.pipe.unet.parameters())
    return {
        "ok": str(unet.dtype) == f"torch.{dtype}"
        and unet.device.type == torch.device(device).type
        and bool(torch.isfinite(gen.latents.float()).all())
        and len(gen.images) == 2
        and all(bool(np.isfinite(np.asarray(img, dtype=np.float32)).all()) for img in gen.images),
        "unet_dtype": str(unet.dtype),
        "unet_device": str(unet.device),
        "image_size": list(gen.images[0].size),
        "denoise_s": round(gen.denoise_s, 4),
    }


def _check_ac(registry) -> dict:
    import torch

    from workers.pipelines import generate, resume

    model = registry.load("demo-tiny-sdxl")
    full = generate(model, ["a red cube"], [7], steps=8, capture=(4,), decode_images=False)
    again = resume(model, ["a red cube"], full.captured[4], 4, [7], steps=8, decode_images=False)
    same = bool(torch.equal(full.latents, again.latents))
    diff = float((full.latents.float() - again.latents.float()).abs().max())
    return {"ok": same and again.unet_calls == full.unet_calls // 2, "bit_exact": same, "max_abs_diff": diff,
            "unet_calls_full": full.unet_calls, "unet_calls_resume": again.unet_calls}  # fmt: skip


DIT_MODELS = ("demo-tiny-flux", "demo-tiny-sd3")


def _check_dit_generate(registry, device: str, dtype: str) -> dict:
    import numpy as np
    import torch

    from workers.pipelines import denoiser, generate

    out: dict = {"ok": True}
    for name in DIT_MODELS:
        model = registry.load(name)
        gen = generate(model, ["a red cube", "a blue sphere"], [1, 2], steps=4)
        param = next(denoiser(model.pipe).parameters())
        ok = (
            str(param.dtype) == f"torch.{dtype}"
            and param.device.type == torch.device(device).type
            and gen.unet_calls == 4
            and bool(torch.isfinite(gen.latents.float()).all())
            and len(gen.images) == 2
            and all(bool(np.isfinite(np.asarray(img, dtype=np.float32)).all()) for img in gen.images)
        )
        out["ok"] = out["ok"] and ok
        out[name] = {"ok": ok, "transformer_dtype": str(param.dtype), "transformer_device": str(param.device),
                     "latent_shape": list(gen.latents.shape), "transformer_calls": gen.unet_calls,
                     "denoise_s": round(gen.denoise_s, 4)}  # fmt: skip
    return out


def _check_dit_resume(registry) -> dict:
    import torch

    from workers.pipelines import generate, resume

    out: dict = {"ok": True}
    for name in DIT_MODELS:
        model = registry.load(name)
        full = generate(model, ["a red cube"], [7], steps=8, capture=(4,), decode_images=False)
        again = resume(model, ["a red cube"], full.captured[4], 4, [7], steps=8, decode_images=False)
        same = bool(torch.equal(full.latents, again.latents))
        ok = same and again.unet_calls == full.unet_calls // 2
        out["ok"] = out["ok"] and ok
        out[name] = {"ok": ok, "bit_exact": same,
                     "max_abs_diff": float((full.latents.float() - again.latents.float()).abs().max()),
                     "calls_full": full.unet_calls, "calls_resume": again.unet_calls}  # fmt: skip
    return out


def _check_feature_cache(registry) -> dict:
    import torch

    from workers.demo import load_demo_profile
    from workers.pipelines import generate

    level = load_demo_profile("demo-cpu-flux").level("flux-fbc")
    model = registry.load(level.model)
    plain = generate(model, ["a red cube"], [3], steps=level.steps, decode_images=False)
    cached = generate(model, ["a red cube"], [3], steps=level.steps, feature_cache=level.feature_cache)
    after = generate(model, ["a red cube"], [3], steps=level.steps, decode_images=False)
    rate = cached.feature_cache_hit_rate
    restored = bool(torch.equal(after.latents, plain.latents))
    changed = not torch.equal(cached.latents, plain.latents)
    return {"ok": rate is not None and rate > 0 and restored and changed and len(cached.images) == 1,
            "feature_cache": dict(level.feature_cache), "hit_rate": rate, "restored_bit_exact": restored,
            "changed_result": changed, "denoise_s": round(cached.denoise_s, 4),
            "denoise_s_uncached": round(plain.denoise_s, 4)}  # fmt: skip


def _check_dit_edit(registry) -> dict:
    import numpy as np
    from PIL import Image

    from workers.demo import load_demo_profile
    from workers.edits import edit

    image = Image.new("RGB", (64, 64), (200, 30, 30))
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (0, 0, 32, 32))
    out: dict = {"ok": True}
    for name in DIT_MODELS:
        model = registry.load(name)
        img2img, calls_img2img, *_ = edit(model, "make it blue", image, 5, strength=0.75, steps=8)
        inpaint, calls_inpaint, *_ = edit(model, "a window", image, 5, mask=mask, strength=1.0, steps=8)
        finite = all(bool(np.isfinite(np.asarray(i, dtype=np.float32)).all()) for i in (img2img, inpaint))
        ok = (calls_img2img, calls_inpaint) == (6, 8) and finite and img2img.size == inpaint.size == (64, 64)
        out["ok"] = out["ok"] and ok
        out[name] = {"ok": ok, "calls_img2img": calls_img2img, "calls_inpaint": calls_inpaint}
    level = load_demo_profile("demo-cpu-flux").level("flux-fbc")
    *_, rate = edit(registry.load(level.model), "make it blue", image, 5, strength=0.75, steps=level.steps,
                    feature_cache=level.feature_cache)  # fmt: skip
    out["ok"] = out["ok"] and rate is not None and rate > 0
    out["feature_cache_hit_rate"] = rate
    return out


def _check_cascade(registry, device: str) -> dict:
    from classifiers.discriminator import Discriminator
    from workers.cascade import CascadeExecutor
    from workers.demo import load_demo_profile
    from workers.messages import WorkItem

    profile = load_demo_profile("demo-cpu-cascade")
    light, heavy = profile.level(profile.cascade.light), profile.level(profile.cascade.heavy)
    judge = Discriminator.new("test_efficientnet", image_size=32, device=device)
    items = [WorkItem(request_id=f"r{i}", prompt=p, level=light.id, seed=i) for i, p in enumerate(["a cat", "a dog"])]
    accept = CascadeExecutor(light, heavy, registry, judge=judge, threshold=0.0, inline_heavy=True).run(items)
    defer = CascadeExecutor(light, heavy, registry, judge=judge, threshold=1.0, inline_heavy=True).run(items)
    conf = [r.confidence for r in accept + defer]
    return {
        "ok": all(r.ok and not r.deferred and r.level == light.id for r in accept)
        and all(r.ok and r.deferred and r.level == heavy.id for r in defer)
        and all(c is not None and 0.0 <= c <= 1.0 for c in conf),
        "accepted_levels": [r.level for r in accept],
        "deferred_levels": [r.level for r in defer],
        "confidence": [round(float(c), 4) for c in conf if c is not None],
    }


def _check_measure(out: Path, device: str, dtype: str, models_dir: str) -> dict:
    import contextlib
    import io

    from argusdiff.cli import main

    path = out / "measured.toml"
    argv = ["profile", "measure", "--profile", "demo-cpu-cascade", "--out", str(path), "--device", device,
            "--dtype", dtype, "--models-dir", models_dir, "--batch-sizes", "1,2,4", "--repeats", "3",
            "--quiet"]  # fmt: skip
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
        show = main(["profile", "show", str(path)]) if rc == 0 else None
        plan = main(["plan", "--profile", str(path), "--gpus", "4", "--load-qpm", "60"]) if rc == 0 else None
    measured = tomllib.loads(path.read_text())["measured"] if path.is_file() else {}
    models = measured.get("models", {})
    memory_key = "gpu_memory_gib" if device.startswith("cuda") else "rss_gib"
    return {
        "ok": rc == 0 and show == 0 and plan == 0 and all(memory_key in m for m in models.values()) and bool(models),
        "exit_codes": {"measure": rc, "show": show, "plan": plan},
        "profile": str(path),
        "device": measured.get("device"),
        "driver": measured.get("driver"),
        "memory": {name: m.get(memory_key) for name, m in models.items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:1, cpu (default: cuda)")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    ap.add_argument("--out", default="cuda-check", help="folder for report.json and the measured profile")
    ap.add_argument("--models-dir", help="where the demo models are built (default: a folder under --out)")
    ap.add_argument("--only", help="comma-separated checks to run (default: all; --list names them)")
    ap.add_argument("--list", action="store_true", help="print the checks' names and exit")
    args = ap.parse_args(argv)
    names = ("generate", "ac_capture_resume", "cascade", "profile_measure", "dit_generate", "dit_resume",
             "feature_cache", "dit_edit")  # fmt: skip
    if args.list:
        print("\n".join(names))
        return 0
    chosen = names if not args.only else tuple(x.strip() for x in args.only.split(",") if x.strip())
    unknown = [x for x in chosen if x not in names]
    if unknown:
        ap.error(f"--only: unknown check(s) {', '.join(unknown)} (checks: {', '.join(names)})")
    import torch

    from workers.registry import ModelRegistry

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible to torch: nothing to check (pass --device cpu to run the checks on the CPU)")
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models_dir = args.models_dir or str(out / "models")
    registry = ModelRegistry(device=args.device, dtype=args.dtype, models_dir=models_dir, max_loaded=4)
    report: dict = {"device": args.device, "dtype": args.dtype, "torch": torch.__version__}
    if args.device.startswith("cuda"):
        report["gpu"] = torch.cuda.get_device_name(torch.device(args.device).index or 0)
    checks = {
        "generate": lambda: _check_generate(registry, args.device, args.dtype),
        "ac_capture_resume": lambda: _check_ac(registry),
        "cascade": lambda: _check_cascade(registry, args.device),
        "profile_measure": lambda: _check_measure(out, args.device, args.dtype, models_dir),
        "dit_generate": lambda: _check_dit_generate(registry, args.device, args.dtype),
        "dit_resume": lambda: _check_dit_resume(registry),
        "feature_cache": lambda: _check_feature_cache(registry),
        "dit_edit": lambda: _check_dit_edit(registry),
    }
    checks = {name: checks[name] for name in chosen}
    for name, check in checks.items():
        try:
            report[name] = check()
        except Exception as exc:  # a failing check is reported, the others still run
            report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(f"{'ok  ' if report[name]['ok'] else 'FAIL'} {name}: {json.dumps(report[name])}", flush=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"report: {out / 'report.json'}")
    return 0 if all(report[name]["ok"] for name in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
