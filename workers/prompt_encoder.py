"""Prompt embeddings from the serving model's own CLIP text encoder (``[cache] encoder = "clip"``).

NIRVANA indexes prompts by the diffusion model's CLIP text embedding; argusdiff's default is the
MiniLM sentence encoder (:mod:`traces.embeddings`), which needs no model of the deployment. With
``clip``, an AC worker embeds with the text encoder of the pipeline it has loaded anyway (no second
model in GPU memory), and the router's cache-similarity view loads only that text encoder and its
tokenizer from the same model folder, so both sides produce the same vectors:

* SD-XL (pipelines with ``text_encoder_2``): the projected pooled embedding of the OpenCLIP
  bigG encoder (``CLIPTextModelWithProjection.text_embeds``, 1280-d for SD-XL base);
* SD-1.x/2.x: the pooled output of ``text_encoder`` (``CLIPTextModel.pooler_output``: 768-d for
  SD-1.5, 1024-d for SD-2.x).

Rows are L2-normalised float32; prompts are truncated at the tokenizer's 77 tokens, as the
pipeline does. ``[cache] embedding_dim`` must equal :attr:`ClipPromptEncoder.dim`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from argusdiff.errors import ConfigError
from argusdiff.loading import MODEL_BUILD_LOCK

__all__ = ["ENCODERS", "ClipPromptEncoder", "check_dim"]

#: values of ``[cache] encoder``
ENCODERS = ("minilm", "clip")


class ClipPromptEncoder:
    """``encoder(prompts) -> (n, dim)`` float32, rows L2-normalised."""

    def __init__(self, tokenizer: Any, text_encoder: Any, *, projected: bool) -> None:
        self.tokenizer = tokenizer
        self.text_encoder = text_encoder
        self.projected = projected
        self._lock = threading.Lock()  # a module shared with a pipeline: one forward at a time

    @classmethod
    def from_pipeline(cls, pipe: Any) -> ClipPromptEncoder:
        """The encoder of a loaded diffusers pipeline (SD-XL: its second text encoder)."""
        if getattr(pipe, "text_encoder_2", None) is not None and getattr(pipe, "tokenizer_2", None) is not None:
            return cls(pipe.tokenizer_2, pipe.text_encoder_2, projected=True)
        if getattr(pipe, "text_encoder", None) is None or getattr(pipe, "tokenizer", None) is None:
            raise ConfigError(f"{type(pipe).__name__} has no CLIP text encoder: use [cache] encoder = 'minilm'")
        return cls(pipe.tokenizer, pipe.text_encoder, projected=False)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, family: str, device: str = "cpu") -> ClipPromptEncoder:
        """Only the text encoder and tokenizer of the model at ``path`` (a diffusers folder or
        hub id), as :meth:`from_pipeline` would take them from the loaded pipeline."""
        from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

        sdxl = family == "sdxl"
        sub = "_2" if sdxl else ""
        model_cls = CLIPTextModelWithProjection if sdxl else CLIPTextModel
        try:
            with MODEL_BUILD_LOCK:
                tokenizer = CLIPTokenizer.from_pretrained(str(path), subfolder=f"tokenizer{sub}")
                encoder = model_cls.from_pretrained(str(path), subfolder=f"text_encoder{sub}")
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load the CLIP text encoder of {str(path)!r}: {exc}") from None
        return cls(tokenizer, encoder.to(device).eval(), projected=sdxl)

    @property
    def dim(self) -> int:
        cfg = self.text_encoder.config
        return int(cfg.projection_dim if self.projected else cfg.hidden_size)

    def __call__(self, prompts: Sequence[str]) -> np.ndarray:
        import torch

        prompts = list(prompts)
        if not prompts:
            return np.zeros((0, self.dim), dtype=np.float32)
        tok = self.tokenizer(
            prompts,
            padding="max_length",
            max_length=self.tokenizer.model_max_length,
            truncation=True,
            return_tensors="pt",
        )
        device = next(self.text_encoder.parameters()).device
        with self._lock, torch.inference_mode():
            out = self.text_encoder(tok.input_ids.to(device))
            vec = out.text_embeds if self.projected else out.pooler_output
            vec = torch.nn.functional.normalize(vec.float(), p=2, dim=-1)
        return vec.cpu().numpy().astype(np.float32, copy=False)


def check_dim(encoder_dim: int, configured: int, what: str) -> None:
    """A clear error when ``[cache] embedding_dim`` does not fit the prompt encoder."""
    if encoder_dim != configured:
        raise ConfigError(
            f"[cache] embedding_dim is {configured}, but {what} makes {encoder_dim}-d embeddings: "
            f"set embedding_dim = {encoder_dim} (a new cache path; an index keeps its size)"
        )
