"""No overfull rooms: every module of the packages stays within 800 lines.

A file that grows past it holds more than one concern; split it by concern (as
``argusdiff/replay/``, ``argusdiff/simulator/`` and ``solver/`` are) rather than raise the limit.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("argusdiff", "cache", "solver", "workers", "classifiers", "traces")
MAX_LINES = 800


def test_no_module_is_over_800_lines():
    over = {
        str(path.relative_to(ROOT)): n
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not over, f"modules over {MAX_LINES} lines (split them by concern): {over}"
