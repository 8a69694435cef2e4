#!/usr/bin/env python
"""Moved into the package: ``argusdiff profile measure`` (see ``argusdiff profile measure --help``
and docs/profiles.md, "Measuring a profile"). This wrapper forwards its arguments, reading the old
``--out-profile FILE`` as ``--out FILE``.

    python scripts/profile_models.py --profile demo-cpu --out-profile /tmp/demo-cpu.toml --batch-sizes 1,2,4
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    from argusdiff.cli import main as cli

    args = list(sys.argv[1:] if argv is None else argv)
    args = ["--out" if a == "--out-profile" else a.replace("--out-profile=", "--out=", 1) for a in args]
    return cli(["profile", "measure", *args])


if __name__ == "__main__":
    sys.exit(main())
