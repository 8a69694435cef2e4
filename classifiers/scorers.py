"""Text–image quality scorers on open_clip: CLIPScore and a PickScore-style scorer.

Both embed the prompt and the image with a CLIP model and take the cosine similarity ``cos``:

* :class:`CLIPScore` (Hessel et al. 2021): ``w · max(cos, 0)`` with ``w = 100`` by default (the
  torchmetrics convention; the paper's ``w = 2.5`` is a parameter).
* :class:`PickScoreScorer` (Kirstain et al. 2023): ``exp(logit_scale) · cos``, the rule PickScore
  uses with its fine-tuned CLIP-H/14. Load a PickScore checkpoint in open_clip format (a
  ``.safetensors`` or ``.pt`` state dict of the ``ViT-H-14`` architecture) to get PickScore
  values; with plain CLIP weights it is the same rule on CLIP (a "PickScore-style" score).

``model`` is an open_clip architecture name or the path of a model-config JSON (registered on
the fly; how tests use a tiny architecture); ``pretrained`` is a local weights file (read as
safetensors, or with ``torch.load(weights_only=True)``; never unpickled objects) or an open_clip
pretrained tag (which downloads, so it needs network access). ``pretrained=None`` keeps random
weights: only useful for tests. The tokenizer is open_clip's (the CLIP BPE ships in its wheel).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from argusdiff.loading import MODEL_BUILD_LOCK
from classifiers.errors import ClassifierInputError, ModelFormatError

__all__ = ["CLIPScore", "ClipEmbedder", "PickScoreScorer", "make_scorer"]


def _torch():
    import torch

    return torch


def _resolve_model_name(model: str) -> str:
    import open_clip

    p = Path(model)
    if p.suffix == ".json":
        if not p.is_file():
            raise ModelFormatError(f"open_clip model config {p} not found")
        open_clip.add_model_config(p)
        return p.stem
    if model not in open_clip.list_models():
        raise ModelFormatError(f"unknown open_clip model {model!r} (give an architecture name or a config .json)")
    return model


class ClipEmbedder:
    """An open_clip model with its image preprocessing and tokenizer."""

    def __init__(self, model: str = "ViT-H-14", pretrained: str | None = None, *, device: str = "cpu") -> None:
        import open_clip

        name = _resolve_model_name(model)
        local = pretrained is not None and Path(pretrained).exists()
        try:
            with MODEL_BUILD_LOCK:
                clip, _, preprocess = open_clip.create_model_and_transforms(
                    name, pretrained=None if local else pretrained, device=device, weights_only=True
                )
        except RuntimeError as exc:
            raise ModelFormatError(f"open_clip model {name!r} with pretrained={pretrained!r}: {exc}") from None
        if local:
            from open_clip.factory import load_state_dict

            try:
                state = load_state_dict(str(pretrained), weights_only=True)
                clip.load_state_dict(state, strict=True)
            except Exception as exc:  # unpickling refused, wrong keys or shapes
                raise ModelFormatError(f"{pretrained}: cannot load as {name!r} weights: {exc}") from None
        self.model = clip.eval().requires_grad_(False)
        self.preprocess = preprocess
        self.tokenizer = open_clip.get_tokenizer(name)
        self.name = name
        self.pretrained = pretrained
        self.device = device

    def embed_texts(self, texts: Sequence[str]) -> Any:
        torch = _torch()
        if isinstance(texts, str):
            raise ClassifierInputError("texts must be a sequence of strings, not one string")
        with torch.inference_mode():
            tokens = self.tokenizer(list(texts)).to(self.device)  # truncated at the context length
            return torch.nn.functional.normalize(self.model.encode_text(tokens).float(), dim=-1)

    def embed_images(self, images: Sequence[Any]) -> Any:
        torch = _torch()
        from classifiers.discriminator import _to_pil

        with torch.inference_mode():
            x = torch.stack([self.preprocess(_to_pil(im, i)) for i, im in enumerate(images)]).to(self.device)
            return torch.nn.functional.normalize(self.model.encode_image(x).float(), dim=-1)

    def cosine(self, prompts: Sequence[str], images: Sequence[Any], *, batch_size: int = 16) -> np.ndarray:
        """Cosine similarity of each (prompt, image) pair, shape (n,)."""
        if len(prompts) != len(images):
            raise ClassifierInputError(f"{len(prompts)} prompts but {len(images)} images")
        out = []
        for s in range(0, len(prompts), batch_size):
            t = self.embed_texts(prompts[s : s + batch_size])
            i = self.embed_images(images[s : s + batch_size])
            out.append((t * i).sum(-1).cpu().numpy())
        return np.concatenate(out).astype(np.float64) if out else np.zeros(0)


class CLIPScore:
    """CLIPScore = ``w · max(cos(text, image), 0)``."""

    metric = "clipscore"

    def __init__(self, embedder: ClipEmbedder, *, w: float = 100.0) -> None:
        self.embedder = embedder
        self.w = w

    def score(self, prompts: Sequence[str], images: Sequence[Any]) -> np.ndarray:
        return self.w * np.maximum(self.embedder.cosine(prompts, images), 0.0)


class PickScoreScorer:
    """PickScore-style preference score = ``exp(logit_scale) · cos(text, image)``."""

    metric = "pickscore"

    def __init__(self, embedder: ClipEmbedder) -> None:
        self.embedder = embedder
        self.scale = float(embedder.model.logit_scale.exp().item())

    def score(self, prompts: Sequence[str], images: Sequence[Any]) -> np.ndarray:
        return self.scale * self.embedder.cosine(prompts, images)

    def preference(self, prompt: str, images: Sequence[Any]) -> np.ndarray:
        """PickScore's preference probabilities of several images for one prompt (softmax)."""
        s = self.score([prompt] * len(images), images)
        e = np.exp(s - s.max())
        return e / e.sum()


def make_scorer(
    metric: str = "pickscore", model: str = "ViT-H-14", pretrained: str | None = None, *, device: str = "cpu"
) -> CLIPScore | PickScoreScorer:
    """A scorer by metric name (``pickscore`` or ``clipscore``)."""
    if metric not in ("pickscore", "clipscore"):
        raise ClassifierInputError(f"metric must be 'pickscore' or 'clipscore', got {metric!r}")
    embedder = ClipEmbedder(model, pretrained, device=device)
    return PickScoreScorer(embedder) if metric == "pickscore" else CLIPScore(embedder)
