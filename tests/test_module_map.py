"""docs/architecture.md's module map is the code's: one line per module, from its docstring
(scripts/module_map.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("module_map", ROOT / "scripts" / "module_map.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
