#!/usr/bin/env python
"""The module map of docs/architecture.md: one line per module, from its docstring's first sentence.

    python scripts/module_map.py            # print the map (markdown)
    python scripts/module_map.py --write    # rewrite the map between the markers in docs/architecture.md
    python scripts/module_map.py --check    # exit 1 when docs/architecture.md's map is not the code's

The map sits between ``<!-- module-map:start -->`` and ``<!-- module-map:end -->``;
``tests/test_module_map.py`` runs ``--check``, so a module added, moved or re-described without the
map following fails CI. Modules are read with ``ast`` (nothing is imported).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("argusdiff", "solver", "workers", "cache", "classifiers", "traces")
DOC = ROOT / "docs" / "architecture.md"
START, END = "<!-- module-map:start -->", "<!-- module-map:end -->"
MAX_CHARS = 160


def summary(path: Path) -> str:
    """The first sentence of the module's docstring, on one line (cut at MAX_CHARS)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = doc.strip().split("\n\n", 1)[0]
    text = " ".join(first.split())
    text = re.sub(r":(?:mod|class|func|meth|attr|data):`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    m = re.match(r"(.+?[a-z0-9)`\]]\.)(\s+[A-Z(`*]|$)", text)  # the first sentence (not "Eq. 1", "e.g. x")
    text = m.group(1) if m else text
    if len(text) > MAX_CHARS:
        text = text[: MAX_CHARS - 1].rsplit(" ", 1)[0] + "…"
    return text or "(no docstring)"


def modules() -> list[Path]:
    out = []
    for pkg in PACKAGES:
        # each folder's modules together, the package's own first
        for path in sorted((ROOT / pkg).rglob("*.py"), key=lambda p: (p.parent.as_posix(), p.name)):
            if "__pycache__" in path.parts:
                continue
            if path.name == "__init__.py" and not ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))):
                continue
            out.append(path)
    return out


def render() -> str:
    lines = []
    pkg = None
    for path in modules():
        rel = path.relative_to(ROOT)
        top = rel.parts[0] if len(rel.parts) == 2 else "/".join(rel.parts[:-1])
        if top != pkg:
            pkg = top
            lines.append(f"\n**{pkg}/**\n")
        lines.append(f"- `{rel.as_posix()}` — {summary(path)}")
    return "\n".join(lines).strip() + "\n"


def current() -> str | None:
    text = DOC.read_text(encoding="utf-8")
    if START not in text or END not in text:
        return None
    return text.split(START, 1)[1].split(END, 1)[0].strip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="rewrite the map in docs/architecture.md")
    g.add_argument("--check", action="store_true", help="exit 1 when the doc's map differs from the code's")
    args = ap.parse_args(argv)
    want = render()
    if args.write:
        text = DOC.read_text(encoding="utf-8")
        if START not in text:
            print(f"{DOC}: no {START} marker", file=sys.stderr)
            return 2
        head, rest = text.split(START, 1)
        tail = rest.split(END, 1)[1]
        DOC.write_text(f"{head}{START}\n\n{want}\n{END}{tail}", encoding="utf-8")
        return 0
    if args.check:
        have = current()
        if have != want:
            print("docs/architecture.md's module map is not the code's: run python scripts/module_map.py --write",
                  file=sys.stderr)  # fmt: skip
            return 1
        return 0
    sys.stdout.write(want)
    return 0


if __name__ == "__main__":
    sys.exit(main())
