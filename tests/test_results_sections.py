"""scripts/run_results.py writes only the sections it ran, each between its markers with its own
date line, timed from its start to the next section's start (not to the end of the run)."""

from __future__ import annotations

from pathlib import Path

from scripts_module import load_script

ROOT = Path(__file__).resolve().parent.parent


def _run_results():
    return load_script("run_results")


def test_a_run_of_some_sections_times_each_and_replaces_only_those(tmp_path, monkeypatch):
    rr = _run_results()
    out = tmp_path / "results.md"
    out.write_text(
        "# Results\n\nfindings\n\n<!-- tables -->\n\n"
        "<!-- section:argus:start -->\nold argus\n<!-- section:argus:end -->\n\n"
        "<!-- section:papers:start -->\nold papers\n<!-- section:papers:end -->\n\n"
        "<!-- section:stress:start -->\nold stress\n<!-- section:stress:end -->\n"
    )
    monkeypatch.setattr(rr.time, "perf_counter", lambda: 1800.0)  # the write, 30 min after the start
    blocks = {"argus": ["new argus"], "stress": ["new stress"]}
    rr.write_results(out, blocks, {"argus": 0.0, "stress": 1320.0}, ["argus", "stress"], full=False, t_all=0.0)
    text = out.read_text()
    assert "findings" in text and "old papers" in text
    assert "old argus" not in text and "old stress" not in text
    argus = text.split("<!-- section:argus:start -->")[1].split("<!-- section:argus:end -->")[0]
    stress = text.split("<!-- section:stress:start -->")[1].split("<!-- section:stress:end -->")[0]
    assert "new argus" in argus and "in 22 min" in argus  # until stress started, not the 30 min of the run
    assert "new stress" in stress and "in 8 min" in stress
