"""The load-cost readings of the replay (``--load-times``, ``--resident-models``) and the papers'
load section of scripts/run_results.py (docs/results.md, "The papers' load")."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from scripts_module import load_script

from argusdiff.cli import main
from argusdiff.errors import ConfigError
from argusdiff.profile import load_profile
from argusdiff.replay import ARGUS_TABLE2_PYTORCH_S, LOAD_TIME_READINGS, ReplaySpec, prepare, with_load_times

ROOT = Path(__file__).resolve().parent.parent


def _run_results():
    return load_script("run_results")


@pytest.mark.parametrize(
    "name", ["sdxl-ac-a100", "sm-a100", "unified-a100", "cascade-sdxlltn-sdxl", "cascade-sdxs-sdv15"]
)
def test_every_a100_load_time_has_its_table2_pytorch_reading(name):
    prof = load_profile(name)
    torch = with_load_times(prof, "pytorch")
    for acc, pt in zip(prof.levels, torch.levels, strict=True):
        assert pt.load_time_s == ARGUS_TABLE2_PYTORCH_S[round(acc.load_time_s, 2)]
        assert pt.load_time_s > acc.load_time_s  # PyTorch loads slower than Accelerate (ARGUS Table 2)
        assert pt.latency_s == acc.latency_s and pt.quality == acc.quality  # only the load time changes
    assert all(lv.load_time_s == 0.0 for lv in with_load_times(prof, "zero").levels)
    assert with_load_times(prof, "profile") is prof


def test_table2_pytorch_column():
    # ARGUS Table 2 (A100): SDXL, SD1.5, Small, Tiny; Accelerate -> PyTorch
    assert ARGUS_TABLE2_PYTORCH_S == {9.42: 45.78, 5.56: 19.90, 4.86: 14.05, 2.91: 11.78}


def test_pytorch_reading_refuses_a_profile_outside_table2():
    with pytest.raises(ConfigError, match="Table 2"):
        with_load_times(load_profile("demo-cpu"), "pytorch")
    with pytest.raises(ConfigError, match="--load-times"):
        with_load_times(load_profile("demo-cpu"), "fast")


def test_the_replay_records_its_load_reading():
    spec = ReplaySpec(trace="poisson:qpm=30,duration=1m", embeddings=False, load_times="zero", max_resident_models=1)
    prep = prepare(spec)
    assert prep.provenance["load_times"].startswith("zero: ")
    assert prep.provenance["resident_models"] == 1
    assert all(lv.load_time_s == 0 for p in prep.profiles.values() for lv in p.levels)
    assert set(LOAD_TIME_READINGS) == {"profile", "pytorch", "zero"}


def test_replay_cli_checks_resident_models_up_front(capsys):
    assert main(["replay", "--trace", "poisson:qpm=30,duration=1m", "--resident-models", "0", "--quiet"]) == 2
    assert "--resident-models" in capsys.readouterr().err


def test_papers_load_is_twice_the_sdxl_k0_capacity():
    rr = _run_results()
    assert "papers" in rr.SECTIONS
    ac = load_profile("sdxl-ac-a100")
    k0 = rr.GPUS * ac.best.peak_qpm
    assert math.isclose(k0, 8 * 60 / 4.2)  # SD-XL at K = 0, 4.2 s (ARGUS §5.1), batch 1
    assert rr.PAPER_LOAD * k0 > rr.GPUS * ac.fastest.peak_qpm  # the peak exceeds even K = 25's capacity
    readings = {(r, m) for _label, r, m in rr.LOAD_SETTINGS}
    assert {("profile", 2), ("pytorch", 2), ("profile", 1), ("zero", 2)} <= readings
