"""No overfull rooms: every module of the packages stays within 800 lines, and every function of
the folders in ``SHORT_FUNCTIONS`` within 100.

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


#: folders whose functions stay within MAX_FUNCTION_LINES (issue 25: no function over ~100 lines)
SHORT_FUNCTIONS = ("argusdiff/simulator", "solver")
MAX_FUNCTION_LINES = 100


def test_no_function_is_over_100_lines():
    import ast

    over = {
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}": n
        for folder in SHORT_FUNCTIONS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES
    }
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines (split them): {over}"
