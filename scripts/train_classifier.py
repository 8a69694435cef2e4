#!/usr/bin/env python
"""Offline training of the prompt -> level classifier (same as ``argusdiff train-classifier``).

Example (the synthetic AC table over DiffusionDB prompts)::

    argusdiff quality ...                # or any QualityTable CSV
    python scripts/train_classifier.py --table table.csv --profile sdxl-ac-a100 --out models/ac

Run with ``--help`` for every option.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from argusdiff.cli import main

if __name__ == "__main__":
    sys.exit(main(["train-classifier", *sys.argv[1:]]))
