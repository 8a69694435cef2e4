"""The registry at the oldest diffusers setup.cfg allows (0.30): float16 is honoured there.

Runs scripts/check_diffusers_floor.py, which installs the floor releases (diffusers 0.30.0,
transformers 4.44.2) into a throwaway virtual environment under ~/.cache/argusdiff (reused) and
loads the tiny SD-XL through workers.registry in it. Skips only when no package index is reachable.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


def test_registry_loads_float16_at_the_diffusers_floor():
    pytest.importorskip("diffusers")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_diffusers_floor.py")],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    if proc.returncode == 3:
        pytest.skip(f"the floor releases cannot be installed here: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok   UNet and both text encoders load in float16" in proc.stdout
    assert "ok   control: dtype= is ignored there (float32)" in proc.stdout
    assert "FAIL" not in proc.stdout
