"""Tiny SD-1.x-, SD-XL-, FLUX.1- and SD3-shaped diffusers pipelines built from configs (random
weights).

They exist so the whole serving path (registry → ``from_pretrained`` → AC capture/resume, SM,
cascade, worker loop, ``argusdiff generate``) runs offline on a CPU in seconds. Their images are
noise-like: they check the pipeline, never image quality.

The tokenizer is the real CLIP BPE (vocab and merges derived from the
``bpe_simple_vocab_16e6.txt.gz`` that ships inside the open_clip wheel), so prompts tokenize as
they do for real Stable Diffusion models. The DiT pipelines (``tiny-flux``, ``tiny-flux-schnell``,
``tiny-sd3``) keep the real models' shapes where they matter to the serving path: 16 latent
channels, a VAE that downsamples 8×, FLUX's 2×2 latent packing and guidance embedding (absent in
the [schnell]-shaped one), SD3's patch size 2 and three text encoders (two CLIP, one T5 encoder),
and flow-matching Euler schedulers with FLUX's resolution-dependent (dynamic) shift and SD3's
fixed shift 3. Departure: their T5 encoder reads the CLIP BPE tokens (T5's SentencePiece
vocabulary does not ship in any installed package); the encoder itself is a real
``T5EncoderModel``. Models are built once per folder with a fixed seed and
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

DEMO_MODELS = ("tiny-sd", "tiny-sdxl", "tiny-flux", "tiny-flux-schnell", "tiny-sd3")
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


def _dit_vae(shift_factor: float, scaling_factor: float):
    """A 16-channel VAE that downsamples 8x (four blocks), as FLUX.1's and SD3's do; the shift
    and scaling factors are those of the real VAE configs (FLUX.1: 0.1159 / 0.3611, SD3: 0.0609 /
    1.5305)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        block_out_channels=(8, 16, 16, 16),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        latent_channels=16,
        norm_num_groups=8,
        sample_size=64,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=shift_factor,
        scaling_factor=scaling_factor,
    )


def _t5(d_model: int):
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(
        T5Config(
            vocab_size=49408,
            d_model=d_model,
            d_kv=8,
            d_ff=37,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            pad_token_id=49407,
            eos_token_id=49407,
            decoder_start_token_id=0,
        )
    )


def _build_flux(kind: str):
    """FLUX.1-shaped: CLIP (pooled) + T5 text encoders, an MM-DiT with double- and single-stream
    blocks; ``tiny-flux`` embeds the guidance scale as [dev] does, ``tiny-flux-schnell`` does not
    and has fewer blocks (the smaller model of a ladder)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    dev = kind == "tiny-flux"
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,  # 16 latent channels packed 2x2
        num_layers=2 if dev else 1,
        num_single_layers=2 if dev else 1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=_TEXT_DIM,
        guidance_embeds=dev,
        axes_dims_rope=(2, 2, 4),
    )
    # FLUX.1 [dev]'s scheduler config: dynamic (resolution-dependent) shift between 0.5 and 1.15
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    tokenizer = _tokenizer()
    return FluxPipeline(
        scheduler=scheduler,
        vae=_dit_vae(0.1159, 0.3611),
        text_encoder=CLIPTextModel(_text_config(False)),
        tokenizer=tokenizer,
        text_encoder_2=_t5(32),
        tokenizer_2=tokenizer,
        transformer=transformer,
    )


def _build_sd3():
    """SD3-shaped: two CLIP encoders with projections and a T5 encoder, an MM-DiT with patch
    size 2, a flow-matching Euler scheduler with SD3's fixed shift 3.0."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection

    transformer = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=16,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=2 * _TEXT_DIM,  # the T5 width; the two CLIP widths are padded to it
        caption_projection_dim=16,
        pooled_projection_dim=2 * _TEXT_DIM,  # both CLIP encoders' pooled projections
        out_channels=16,
        pos_embed_max_size=16,
    )
    tokenizer = _tokenizer()
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=_dit_vae(0.0609, 1.5305),
        text_encoder=CLIPTextModelWithProjection(_text_config(True)),
        tokenizer=tokenizer,
        text_encoder_2=CLIPTextModelWithProjection(_text_config(True)),
        tokenizer_2=tokenizer,
        text_encoder_3=_t5(2 * _TEXT_DIM),
        tokenizer_3=tokenizer,
    )


def build_demo_pipeline(kind: str):
    """A tiny pipeline of ``kind`` (one of :data:`DEMO_MODELS`) with seeded random weights."""
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
    if kind in ("tiny-flux", "tiny-flux-schnell"):
        return _build_flux(kind)
    if kind == "tiny-sd3":
        return _build_sd3()
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
