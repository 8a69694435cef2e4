"""notebooks/replay_analysis.ipynb runs on a small replay's output folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from argusdiff.cli import main

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "replay_analysis.ipynb"


def test_notebook_runs_on_a_small_replay(tmp_path, monkeypatch):
    out = tmp_path / "replay"
    rc = main(
        [
            "replay",
            "--trace",
            "poisson:qpm=30,duration=4m",
            "--policies",
            "argus,clipper-ht",
            "--no-embeddings",
            "--quiet",
            "--no-plots",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    monkeypatch.setenv("REPLAY_DIR", str(out))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    assert (out / "notebook_timeline.png").is_file()
    assert (out / "notebook_tradeoff.png").is_file()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "argus" in text and "clipper-ht" in text
    assert os.environ["REPLAY_DIR"] == str(out)
