"""Write a diffusers SD-1.x-style pipeline as one original-layout (LDM) checkpoint file.

Stable Diffusion checkpoints published as a single ``.safetensors`` (the CompVis / A1111 layout)
name their tensors ``model.diffusion_model.*`` (UNet), ``first_stage_model.*`` (VAE) and
``cond_stage_model.transformer.*`` (CLIP text encoder). Nothing can be downloaded here, so the
tests make such a file from the tiny demo pipeline: this is the inverse of the renaming diffusers'
``from_single_file`` applies (``diffusers.loaders.single_file_utils.convert_ldm_*_checkpoint``),
for UNets with ``layers_per_block`` resnets per block and a VAE with a mid-block attention.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_RESNET = (
    ("norm1", "in_layers.0"),
    ("conv1", "in_layers.2"),
    ("norm2", "out_layers.0"),
    ("conv2", "out_layers.3"),
    ("time_emb_proj", "emb_layers.1"),
    ("conv_shortcut", "skip_connection"),
)
_UNET_TOP = {
    "time_embedding.linear_1": "time_embed.0",
    "time_embedding.linear_2": "time_embed.2",
    "conv_in": "input_blocks.0.0",
    "conv_norm_out": "out.0",
    "conv_out": "out.2",
}


def _resnet(rest: str) -> str:
    for new, old in _RESNET:
        if rest.startswith(new + "."):
            return old + rest[len(new) :]
    return rest


def unet_key(key: str, layers: int, up_attention: set[int]) -> str:
    """The LDM name of a diffusers UNet tensor."""
    for new, old in _UNET_TOP.items():
        if key.startswith(new + "."):
            return old + key[len(new) :]
    if m := re.match(r"down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", key):
        i, j, rest = int(m[1]), int(m[2]), m[3]
        return f"input_blocks.{1 + i * (layers + 1) + j}.0.{_resnet(rest)}"
    if m := re.match(r"down_blocks\.(\d+)\.attentions\.(\d+)\.(.*)", key):
        i, j, rest = int(m[1]), int(m[2]), m[3]
        return f"input_blocks.{1 + i * (layers + 1) + j}.1.{rest}"
    if m := re.match(r"down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.*)", key):
        return f"input_blocks.{(int(m[1]) + 1) * (layers + 1)}.0.op.{m[2]}"
    if m := re.match(r"mid_block\.resnets\.(\d+)\.(.*)", key):
        return f"middle_block.{2 * int(m[1])}.{_resnet(m[2])}"
    if m := re.match(r"mid_block\.attentions\.0\.(.*)", key):
        return f"middle_block.1.{m[1]}"
    if m := re.match(r"up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", key):
        i, j, rest = int(m[1]), int(m[2]), m[3]
        return f"output_blocks.{i * (layers + 1) + j}.0.{_resnet(rest)}"
    if m := re.match(r"up_blocks\.(\d+)\.attentions\.(\d+)\.(.*)", key):
        i, j, rest = int(m[1]), int(m[2]), m[3]
        return f"output_blocks.{i * (layers + 1) + j}.1.{rest}"
    if m := re.match(r"up_blocks\.(\d+)\.upsamplers\.0\.conv\.(.*)", key):
        i = int(m[1])
        slot = 2 if i in up_attention else 1
        return f"output_blocks.{i * (layers + 1) + layers}.{slot}.conv.{m[2]}"
    raise KeyError(f"no LDM name for UNet tensor {key!r}")


def vae_key(key: str, n_blocks: int) -> str:
    """The LDM name of a diffusers AutoencoderKL tensor."""
    key = key.replace("conv_norm_out", "norm_out")
    if m := re.match(r"encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", key):
        return f"encoder.down.{m[1]}.block.{m[2]}.{m[3].replace('conv_shortcut', 'nin_shortcut')}"
    if m := re.match(r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.*)", key):
        return f"encoder.down.{m[1]}.downsample.conv.{m[2]}"
    if m := re.match(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", key):
        return f"decoder.up.{n_blocks - 1 - int(m[1])}.block.{m[2]}.{m[3].replace('conv_shortcut', 'nin_shortcut')}"
    if m := re.match(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.conv\.(.*)", key):
        return f"decoder.up.{n_blocks - 1 - int(m[1])}.upsample.conv.{m[2]}"
    if m := re.match(r"(encoder|decoder)\.mid_block\.resnets\.(\d+)\.(.*)", key):
        return f"{m[1]}.mid.block_{int(m[2]) + 1}.{m[3].replace('conv_shortcut', 'nin_shortcut')}"
    if m := re.match(r"(encoder|decoder)\.mid_block\.attentions\.0\.(.*)", key):
        rest = m[2]
        for new, old in (("group_norm", "norm"), ("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("to_out.0", "proj_out")):
            if rest.startswith(new + "."):
                rest = old + rest[len(new) :]
        return f"{m[1]}.mid.attn_1.{rest}"
    return key  # conv_in, conv_out, norm_out, quant_conv, post_quant_conv keep their names


def ldm_state_dict(pipe: Any) -> dict[str, Any]:
    """All tensors of an SD-1.x-style pipeline (UNet, VAE, one CLIP text encoder), LDM names."""
    out: dict[str, Any] = {}
    cfg = pipe.unet.config
    layers = int(cfg.layers_per_block)
    up_attention = {i for i, t in enumerate(cfg.up_block_types) if "CrossAttn" in t}
    for key, value in pipe.unet.state_dict().items():
        out["model.diffusion_model." + unet_key(key, layers, up_attention)] = value
    n_blocks = len(pipe.vae.config.down_block_types)
    for key, value in pipe.vae.state_dict().items():
        out["first_stage_model." + vae_key(key, n_blocks)] = value
    for key, value in pipe.text_encoder.state_dict().items():
        name = key if key.startswith("text_model.") else "text_model." + key  # transformers >= 5.6 flattened it
        out["cond_stage_model.transformer." + name] = value
    return out


def write_single_file(pipe: Any, path: str | Path) -> Path:
    """Save ``pipe`` as one LDM-layout ``.safetensors`` file."""
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in ldm_state_dict(pipe).items()}
    save_file(state, str(path))
    return Path(path)
