#!/usr/bin/env python
"""Load a model through workers.registry on the oldest diffusers setup.cfg allows, and check the
weights come out in the dtype asked for.

    python scripts/check_diffusers_floor.py [--venv DIR]

diffusers accepts ``dtype=`` in ``from_pretrained`` only since 0.40; before, it ignores it and
loads float32 (SD-XL at twice the memory). The registry passes the keyword the installed version
understands. This script proves it at the floor:

1. makes a throwaway virtual environment (``--venv``, default
   ``~/.cache/argusdiff/diffusers-floor``, reused) with only the floor releases in it
   (:data:`FLOOR`), installed from the package index without dependencies; everything else
   (torch, numpy, safetensors, ...) comes from the interpreter running this script, through a
   ``.pth`` file;
2. builds the tiny SD-XL demo model with this interpreter and adds the ``vocab.json`` /
   ``merges.txt`` tokenizer files transformers 4.x reads;
3. in the floor environment, loads it with ``ModelRegistry(dtype="float16")`` and checks the UNet
   and both text encoders are float16; as a control, a bare ``from_pretrained(dtype=float16)`` on
   the same folder (what the registry used to do) gives float32 there; then runs the
   approximate-caching round trip (capture after K steps, resume) in float32 and checks it is
   bit-exact.

Exit 0 when every check passes, 1 when one fails, 3 when the floor releases cannot be installed
(no package index).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The floor of setup.cfg's ``models`` extra, and the hub client and tokenizers of its time.
FLOOR = ("diffusers==0.30.0", "transformers==4.44.2", "huggingface_hub==0.24.6", "tokenizers==0.19.1")

CHECK = r"""
import json, sys
# the host's peft (a [models] dependency) is newer than the floor's huggingface_hub: diffusers 0.30
# imports it when it is present, so the floor runs as an install without peft would
sys.modules["peft"] = None
import diffusers, torch, transformers
from workers.registry import ModelRegistry, dtype_keyword
models_dir, folder = sys.argv[1], sys.argv[2]
out = {"diffusers": diffusers.__version__, "transformers": transformers.__version__, "keyword": dtype_keyword()}
reg = ModelRegistry(device="cpu", dtype="float16", models_dir=models_dir)
pipe = reg.load("demo-tiny-sdxl").pipe
out["registry"] = [str(m.dtype) for m in (pipe.unet, pipe.text_encoder, pipe.text_encoder_2)]
bare = diffusers.StableDiffusionXLPipeline.from_pretrained(folder, dtype=torch.float16)
out["bare_dtype_kwarg"] = str(bare.unet.dtype)
from workers.pipelines import generate, resume
reg32 = ModelRegistry(device="cpu", models_dir=models_dir)
model = reg32.load("demo-tiny-sdxl")
full = generate(model, ["a red cube"], [5], capture=(4,), decode_images=False)
again = resume(model, ["a red cube"], full.captured[4], 4, [5], decode_images=False)
out["ac_bit_exact"] = bool(torch.equal(torch.as_tensor(full.latents), torch.as_tensor(again.latents)))
print(json.dumps(out))
"""


def _python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def make_floor_env(venv_dir: Path) -> Path:
    """The floor environment's python (created and filled on first use)."""
    py = _python(venv_dir)
    marker = venv_dir / "argusdiff-floor.json"
    host = sysconfig.get_paths()["purelib"]
    wanted = {"floor": list(FLOOR), "host": host}
    if py.exists() and marker.is_file() and json.loads(marker.read_text()) == wanted:
        return py
    venv.EnvBuilder(with_pip=True, clear=True).create(venv_dir)
    proc = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", *FLOOR],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise OSError(f"cannot install {' '.join(FLOOR)}: {proc.stderr.strip()[-500:]}")
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Everything but the floor releases comes from this interpreter's environment (after them).
    (Path(site) / "zz-argusdiff-host.pth").write_text(host + "\n")
    marker.write_text(json.dumps(wanted))
    return py


def build_model(models_dir: Path) -> Path:
    """The tiny SD-XL demo folder, with the tokenizer files transformers 4.x reads."""
    sys.path.insert(0, str(ROOT))
    from workers.demo import build_clip_tokenizer_files, ensure_demo_model

    folder = ensure_demo_model("tiny-sdxl", models_dir)
    for sub in ("tokenizer", "tokenizer_2"):
        if not (folder / sub / "vocab.json").is_file():
            build_clip_tokenizer_files(folder / sub)
    return folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", default=str(Path.home() / ".cache" / "argusdiff" / "diffusers-floor"))
    args = ap.parse_args(argv)
    try:
        py = make_floor_env(Path(args.venv).expanduser())
    except OSError as exc:
        print(f"floor environment: {exc}", file=sys.stderr)
        return 3
    with tempfile.TemporaryDirectory(prefix="argusdiff-floor-") as tmp:
        folder = build_model(Path(tmp))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run(
            [str(py), "-c", CHECK, tmp, str(folder)], capture_output=True, text=True, env=env, timeout=600
        )
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return 1
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print(json.dumps(got, indent=2))
    checks = {
        "the floor release is the one installed": got["diffusers"] == FLOOR[0].split("==")[1],
        "the registry passes torch_dtype there": got["keyword"] == "torch_dtype",
        "UNet and both text encoders load in float16": got["registry"] == ["torch.float16"] * 3,
        "control: dtype= is ignored there (float32)": got["bare_dtype_kwarg"] == "torch.float32",
        "AC capture/resume is bit-exact": got["ac_bit_exact"],
    }
    for what, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
