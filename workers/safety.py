"""The image safety checker of a deployment (``[safety] checker = "diffusers"``): diffusers'
``StableDiffusionSafetyChecker`` (a CLIP vision tower and 17 + 3 concept embeddings with a
threshold each) run on every finished image, on the worker's device.

A concept's score is its cosine to the image embedding minus its threshold (plus 0.01 once a
"special care" concept scored above 0, as diffusers does); an image is flagged when a concept's
score is above the request's margin: 0 for ``moderation: auto`` (the checker's own rule) and
``[safety] low_margin`` for ``moderation: low`` (less restrictive, as OpenAI's ``low``). A flagged
image is never returned: its result carries ``error_type = "ContentFiltered"`` (the API answers
400 ``content_policy_violation``).

``model`` is a folder (or hub id) with the checker's weights and its ``CLIPImageProcessor``
(``preprocessor_config.json``), e.g. a download of ``CompVis/stable-diffusion-safety-checker``.
Tests build a tiny one from a config (random CLIP weights, concept thresholds set by the test).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from workers.errors import ModelLoadError

__all__ = ["FILTERED", "SafetyChecker"]

#: ``error_type`` of a result whose image the safety checker flagged
FILTERED = "ContentFiltered"


class SafetyChecker:
    """``flagged(images, margins) -> [reason or None]`` for PIL images."""

    def __init__(self, model: str, *, device: str = "cpu", dtype: str = "float32", low_margin: float = 0.02) -> None:
        import torch
        from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
        from transformers import CLIPImageProcessor

        try:
            self.checker = StableDiffusionSafetyChecker.from_pretrained(model, torch_dtype=getattr(torch, dtype))
            self.processor = CLIPImageProcessor.from_pretrained(model)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"[safety] model {model!r}: cannot load the safety checker: {exc}") from None
        self.checker.to(device).eval()
        self.device = device
        self.low_margin = low_margin
        self._lock = threading.Lock()
        self.checked = 0
        self.flagged_count = 0

    def margin(self, moderation: str | None) -> float:
        """The score an image must exceed to be flagged, for a request's ``moderation``."""
        return self.low_margin if moderation == "low" else 0.0

    def scores(self, images: Sequence[Any]) -> Any:
        """(n, 17) concept scores of ``images`` (cosine − threshold, with the special-care
        adjustment), as diffusers computes them."""
        import torch
        from diffusers.pipelines.stable_diffusion.safety_checker import cosine_distance

        c = self.checker
        pixels = self.processor(list(images), return_tensors="pt").pixel_values.to(self.device, c.dtype)
        with self._lock, torch.inference_mode():
            embeds = c.visual_projection(c.vision_model(pixels)[1]).float()
            special = cosine_distance(embeds, c.special_care_embeds.float()) - c.special_care_embeds_weights.float()
            adjust = (special > 0).any(dim=1, keepdim=True).float() * 0.01
            return cosine_distance(embeds, c.concept_embeds.float()) - c.concept_embeds_weights.float() + adjust

    def flagged(self, images: Sequence[Any], moderation: Sequence[str | None]) -> list[str | None]:
        """Per image: None, or why it was flagged."""
        if not images:
            return []
        scores = self.scores(images).cpu().numpy()
        out: list[str | None] = []
        for row, mod in zip(scores, moderation, strict=True):
            over = [i for i, v in enumerate(row) if v > self.margin(mod)]
            out.append(f"flagged by the safety checker (concepts {over})" if over else None)
        self.checked += len(images)
        self.flagged_count += sum(1 for r in out if r is not None)
        return out
