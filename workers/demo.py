"""Tiny SD-1.x- and SD-XL-shaped diffusers pipelines built from configs (random weights).

They exist so the whole serving path (registry → ``from_pretrained`` → AC capture/resume, SM,
cascade, worker loop, ``argusdiff generate``) runs offline on a CPU in seconds. Their images are
noise-like: they check the pipeline, never image quality.

The tokenizer is the real CLIP BPE (vocab and merges derived from the
``bpe_simple_vocab_16e6.txt.gz`` that ships inside the open_clip wheel), so prompts tokenize as
they do for real Stable Diffusion models. Models are built once per folder with a fixed seed and
``save_pretrained``; :class:`workers.registry.ModelRegistry` then loads them with
``from_pretrained`` exactly like a hub model.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path

__all__ = [
    "DEMO_MODELS",
    "DEMO_PROFILE_DIR",
    "build_clip_tokenizer_files",
    "build_demo_pipeline",
    "clip_bpe",
    "demo_profile_path",
    "ensure_demo_model",
    "load_demo_profile",
]

DEMO_MODELS = ("tiny-sd", "tiny-sdxl")
#: Extra demo profiles (SM ladder, cascade) beside the shipped ``demo-cpu`` AC profile.
DEMO_PROFILE_DIR = Path(__file__).resolve().parent.parent / "argusdiff" / "profiles"  # shipped with the package
_VERSION = "1"  # bump when the configs below change (folders are rebuilt)
_TEXT_DIM = 32
_SEED = 0


def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def clip_bpe() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """CLIP's vocabulary (49,408 tokens) and BPE merges from open_clip's ``bpe_simple_vocab_16e6``."""
    import open_clip

    bpe = Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz"
    with gzip.open(bpe, "rt", encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    merges = [tuple(m.split()) for m in lines[1 : 49152 - 256 - 2 + 1]]
    tokens = list(_bytes_to_unicode().values())
    tokens = tokens + [v + "</w>" for v in tokens]
    tokens.extend("".join(m) for m in merges)
    tokens.extend(["<|startoftext|>", "<|endoftext|>"])
    return {tok: i for i, tok in enumerate(tokens)}, merges  # type: ignore[return-value]


def build_clip_tokenizer_files(folder: Path) -> tuple[Path, Path]:
    """Write CLIP's ``vocab.json`` and ``merges.txt`` (the classic file pair) into ``folder``."""
    vocab, merges = clip_bpe()
    folder.mkdir(parents=True, exist_ok=True)
    vocab_file, merges_file = folder / "vocab.json", folder / "merges.txt"
    vocab_file.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    merges_file.write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n", encoding="utf-8")
    return vocab_file, merges_file


def _tokenizer():
    from transformers import CLIPTokenizer

    vocab, merges = clip_bpe()
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77, pad_token="<|endoftext|>")


def _text_config(projection: bool):
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=49408,
        hidden_size=_TEXT_DIM,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        bos_token_id=49406,
        eos_token_id=49407,
        pad_token_id=49407,
        hidden_act="gelu",
        projection_dim=_TEXT_DIM if projection else 512,
    )


def _vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        block_out_channels=(16, 32),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
        norm_num_groups=8,
        sample_size=64,
    )


def build_demo_pipeline(kind: str):
    """A tiny pipeline of ``kind`` (``tiny-sd`` or ``tiny-sdxl``) with seeded random weights."""
    import torch
    from diffusers import (
        DDIMScheduler,
        EulerDiscreteScheduler,
        StableDiffusionPipeline,
        StableDiffusionXLPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    if kind not in DEMO_MODELS:
        raise ValueError(f"unknown demo model {kind!r}; demo models: {', '.join(DEMO_MODELS)}")
    torch.manual_seed(_SEED)
    tokenizer = _tokenizer()
    if kind == "tiny-sd":
        unet = UNet2DConditionModel(
            block_out_channels=(16, 32),
            layers_per_block=1,
            sample_size=32,
            in_channels=4,
            out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            cross_attention_dim=_TEXT_DIM,
            attention_head_dim=4,
            norm_num_groups=8,
        )
        scheduler = DDIMScheduler(
            beta_start=0.00085,
            beta_end=0.012,
            beta_schedule="scaled_linear",
            clip_sample=False,
            set_alpha_to_one=False,
            steps_offset=1,
        )
        return StableDiffusionPipeline(
            vae=_vae(),
            text_encoder=CLIPTextModel(_text_config(False)),
            tokenizer=tokenizer,
            unet=unet,
            scheduler=scheduler,
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
    unet = UNet2DConditionModel(
        block_out_channels=(16, 32),
        layers_per_block=1,
        sample_size=32,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        transformer_layers_per_block=(1, 1),
        projection_class_embeddings_input_dim=6 * 8 + _TEXT_DIM,
        cross_attention_dim=2 * _TEXT_DIM,
        norm_num_groups=8,
    )
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        steps_offset=1,
        timestep_spacing="leading",
        interpolation_type="linear",
    )
    return StableDiffusionXLPipeline(
        vae=_vae(),
        text_encoder=CLIPTextModel(_text_config(False)),
        text_encoder_2=CLIPTextModelWithProjection(_text_config(True)),
        tokenizer=tokenizer,
        tokenizer_2=tokenizer,
        unet=unet,
        scheduler=scheduler,
        force_zeros_for_empty_prompt=True,
    )


def ensure_demo_model(kind: str, models_dir: str | Path) -> Path:
    """The folder of demo model ``kind`` under ``models_dir``, built and saved on first use.

    Building writes to a temporary sibling folder and renames it into place, so concurrent
    workers never load a half-written model.
    """
    if kind not in DEMO_MODELS:
        raise ValueError(f"unknown demo model {kind!r}; demo models: {', '.join(DEMO_MODELS)}")
    root = Path(models_dir).expanduser()
    target = root / f"demo-{kind}-v{_VERSION}"
    if (target / "model_index.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    try:
        from argusdiff.loading import MODEL_BUILD_LOCK

        with MODEL_BUILD_LOCK:
            pipe = build_demo_pipeline(kind)
        pipe.save_pretrained(tmp / "model", safe_serialization=True)
        try:
            os.replace(tmp / "model", target)
        except OSError:
            if not (target / "model_index.json").is_file():  # not a concurrent build that won
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def demo_profile_path(name: str) -> Path | None:
    """The TOML of a workers demo profile (``demo-cpu-sm``, ``demo-cpu-cascade``), or None."""
    path = DEMO_PROFILE_DIR / f"{name}.toml"
    return path if path.is_file() else None


def load_demo_profile(name: str):
    """Load a shipped profile by name, falling back to the workers demo profiles."""
    from argusdiff.profile import PROFILE_DIR, load_profile

    path = demo_profile_path(name)
    if path is not None and not (PROFILE_DIR / f"{name}.toml").is_file():
        return load_profile(path)
    return load_profile(name)
