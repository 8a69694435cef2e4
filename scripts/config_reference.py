"""Rewrite docs/config.md from argusdiff/config.py (``--check`` exits 1 when it is stale)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from argusdiff.config import reference_markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "config.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only check that docs/config.md is current")
    args = parser.parse_args()
    text = reference_markdown()
    if args.check:
        current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
        if current != text:
            print(f"{DOC} is stale: run python scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
