"""`argusdiff trace|prompts|quality` commands."""

from __future__ import annotations

import json

import pytest

from argusdiff import cli
from traces.formats import load_trace
from traces.quality import QualityTable


def _json(capsys, argv):
    assert cli.main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_trace_list(capsys):
    out = _json(capsys, ["trace", "list", "--json"])
    names = {g["name"] for g in out["generators"]}
    assert {"poisson", "bursty", "diagonal", "diurnal", "azure"} <= names
    assert "proteus" in out["file_formats"]
    examples = {g["name"]: g["example"] for g in out["generators"]}
    for name, example in examples.items():  # each generator's own example, one that generates
        if not name.startswith("shape:"):
            assert example.startswith(f"{name}:"), (name, example)
            assert cli.main(["trace", "show", example]) == 0, example
    capsys.readouterr()


def test_profiles_table_is_aligned(capsys):
    assert cli.main(["profiles"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(ln.startswith("unified-a100") for ln in lines)
    assert len({ln.index(" levels ") for ln in lines}) == 1, lines


def test_trace_show_and_gen(capsys, tmp_path):
    s = _json(capsys, ["trace", "show", "bursty:low=60,high=480,period=5m,duration=40m", "--json", "--per-minute"])
    assert s["requests"] > 5000 and len(s["qpm_per_minute"]) == 40
    out = tmp_path / "t.csv"
    g = _json(
        capsys,
        ["trace", "gen", "poisson:qpm=120,duration=10m", "--prompts", "30", "--order", "sequential", "-o", str(out),
         "--json"],
    )  # fmt: skip
    t = load_trace(out)
    assert len(t) == g["requests"] and list(t.prompt_idx[:31]) == [*range(30), 0]
    # convert a file, rescaled and windowed
    src = tmp_path / "ds.txt"
    src.write_text("".join(f"{i * 100.0},{i % 7 + 1}\n" for i in range(1200)))
    conv = tmp_path / "c.csv"
    c = _json(
        capsys, ["trace", "convert", str(src), "--mean-qpm", "300", "--window", "0", "60", "-o", str(conv), "--json"]
    )
    assert c["format"] == "diffserve" and abs(c["requests"] - 300) <= 2
    assert load_trace(conv).prompt_idx.max() <= 6


def test_trace_errors_exit_2(capsys, tmp_path):
    assert cli.main(["trace", "show", "no-such-file.txt"]) == 2
    assert "no such file and not a generator spec" in capsys.readouterr().err
    bad = tmp_path / "bad.txt"
    bad.write_text("1,2\n3,x\n")
    assert cli.main(["trace", "show", str(bad)]) == 2
    assert f"{bad}:2:" in capsys.readouterr().err
    assert cli.main(["trace", "show", "poisson:qpm=10", "--window", "5", "1"]) == 2
    assert "--window" in capsys.readouterr().err


def test_prompts_commands(capsys, tmp_path):
    out = _json(capsys, ["prompts", "list", "--json"])
    assert [s["name"] for s in out["sets"]] == ["diffusiondb", "builtin"]
    assert "the default" in out["sets"][0]["help"]
    s = _json(capsys, ["prompts", "show", "--head", "3", "--json"])
    assert s["name"] == "diffusiondb" and s["prompts"] == 4999 and len(s["head"]) == 3
    f = tmp_path / "p.txt"
    f.write_text("a\nb\n")
    assert cli.main(["prompts", "show", str(f)]) == 0
    assert "2 prompts" in capsys.readouterr().out
    assert cli.main(["prompts", "show", str(tmp_path / "none.txt")]) == 2


def test_quality_synth_show_calibrate(capsys, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(f"a red fox number {i} in the snow" for i in range(50)) + '\na sign that says "HI"\n')
    out = tmp_path / "q.csv"
    rep = _json(
        capsys, ["quality", "synth", "--profile", "sm-a100", "--prompts", str(prompts), "-o", str(out), "--json"]
    )
    assert rep["synthetic"] is True and rep["prompts"] == 51
    table = QualityTable.from_csv(out)
    assert table.synthetic and "SYNTHETIC" in table.source and table.profile == "sm-a100"
    shown = _json(capsys, ["quality", "show", str(out), "--json"])
    assert shown["optimal_share"] == rep["optimal_share"]
    cal = _json(capsys, ["quality", "calibrate", "--profile", "sdxl-ac-a100", "--json"])
    assert cal["target"]["oracle"] == 20.8 and cal["fitted"] is False
    assert cli.main(["quality", "show", str(tmp_path / "none.csv")]) == 2


@pytest.mark.parametrize("cmd", ["trace", "prompts", "quality"])
def test_missing_action_is_an_error(cmd):
    with pytest.raises(SystemExit) as info:
        cli.main([cmd])
    assert info.value.code == 2


def test_quality_calibrate_by_labels(capsys, tmp_path):
    f = tmp_path / "p.tsv"
    f.write_text(
        'Prompt\tCategory\tChallenge\na sign that says "OPEN"\tArts\tWriting & Symbols\nsky\tAbstract\tBasic\n'
    )
    rep = _json(capsys, ["quality", "calibrate", "--prompts", str(f), "--by", "challenge", "--json"])
    assert set(rep["by_category"]) == {"Writing & Symbols", "Basic"}
    assert cli.main(["quality", "calibrate", "--by", "challenge"]) == 2
    assert "no challenge labels" in capsys.readouterr().err
