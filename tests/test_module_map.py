"""docs/architecture.md's module map is the code's: one line per module, from its docstring
(scripts/module_map.py)."""

from __future__ import annotations

from pathlib import Path

from scripts_module import load_script

ROOT = Path(__file__).resolve().parent.parent


def _script():
    return load_script("module_map")


def test_the_architecture_docs_list_every_module_as_the_code_describes_it():
    mm = _script()
    want = mm.render()
    assert mm.current() == want, "run: python scripts/module_map.py --write"
    listed = {line.split("`")[1] for line in want.splitlines() if line.startswith("- `")}
    on_disk = {p.relative_to(ROOT).as_posix() for p in mm.modules()}
    assert listed == on_disk and len(listed) > 100


def test_the_summary_is_the_first_sentence_on_one_line(tmp_path):
    mm = _script()
    f = tmp_path / "m.py"
    doc = "Solve one allocation (ARGUS Eq. 1), e.g. for :class:`~argusdiff.domain.Plan`. More\ntext.\n\nDetail."
    f.write_text(f'"""{doc}"""\n')
    assert mm.summary(f) == "Solve one allocation (ARGUS Eq. 1), e.g. for `argusdiff.domain.Plan`."
    f.write_text("x = 1\n")
    assert mm.summary(f) == "(no docstring)"


def _defined(path: Path, chain: list[str]) -> bool:
    """Whether ``chain`` (e.g. ["Router", "submit"]) names a class/function/assignment in ``path``."""
    import ast

    body = ast.parse(path.read_text(encoding="utf-8")).body
    for name in chain:
        found = None
        for node in body:
            names = []
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            if name in names:
                found = node
                break
        if found is None:
            return False
        body = getattr(found, "body", [])
    return True


def test_the_tour_names_functions_that_exist():
    """Every dotted name the newcomer's tour cites (``package.module.Name.attr``) is defined."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    tour = text.split("## A newcomer's tour", 1)[1].split("\n## ", 1)[0]
    cited = set(re.findall(r"`((?:argusdiff|solver|workers|cache|classifiers|traces)\.[\w.]+)`", tour))
    assert len(cited) > 15
    missing = []
    for dotted in sorted(cited):
        parts = dotted.split(".")
        for k in range(len(parts), 0, -1):
            base = ROOT.joinpath(*parts[:k])
            path = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
            if path.exists():
                if not _defined(path, parts[k:]):
                    missing.append(dotted)
                break
        else:
            missing.append(dotted)
    assert not missing, missing
