"""``argusdiff profile measure`` on the tiny CPU models: the profile it writes loads
(`argusdiff profile show FILE`) and plans (`argusdiff plan --profile FILE`)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from fixtures_classifiers import tiny_clip_config  # noqa: F401 - fixture

from argusdiff.cli import main

ROOT = Path(__file__).resolve().parent.parent

# Two levels far apart (8 steps vs 1 step of the tiny SD), so timing noise on a shared machine
# cannot break the profile's monotonicity.
SM_LADDER = """
name = "tiny-sm"
gpu = "cpu"
description = "two tiny SD levels for the measure test"
[[levels]]
id = "sd-8"
strategy = "sm"
model = "demo-tiny-sd"
steps = 8
latency_s = 1.0
quality = 1.0
load_time_s = 1.0
[[levels]]
id = "sd-1"
strategy = "sm"
model = "demo-tiny-sd-1step"
steps = 1
latency_s = 0.5
quality = 0.8
load_time_s = 1.0
"""


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "argusdiff", *args], capture_output=True, text=True, timeout=600, cwd=ROOT
    )


FAST = ["--repeats", "1", "--warmup", "0", "--load-repeats", "1", "--device", "cpu", "--torch-threads", "1"]


@pytest.mark.integration
@pytest.mark.slow
def test_measured_profile_loads_and_plans(tmp_path, demo_models_dir, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    src = tmp_path / "tiny-sm.toml"
    src.write_text(SM_LADDER)
    out = tmp_path / "measured.toml"
    argv = ["profile", "measure", "--profile", str(src), "--out", str(out), "--batch-sizes", "1,2", *FAST]
    assert main([*argv, "--models-dir", demo_models_dir, "--note", "test run", "--name", "tiny-sm-measured"]) == 0
    printed = capsys.readouterr()
    assert f"wrote {out}" in printed.out and "process RSS" in printed.out
    assert "measuring tiny-sm on cpu" in printed.err  # one line per measurement when stderr is not a terminal

    text = out.read_text()
    assert text.startswith("# test run\n# Measured by `argusdiff profile measure` from tiny-sm on cpu")
    data = tomllib.loads(text)
    measured = data["measured"]
    # provenance: device, driver, library versions, date, the command itself
    assert measured["device"].startswith("cpu") and measured["driver"].startswith("none")
    assert {"torch", "diffusers", "transformers", "python", "date", "dtype"} <= set(measured)
    assert measured["command"].startswith("argusdiff profile measure --profile")
    assert "GPU memory not measured" in measured["memory"]
    for model in ("demo-tiny-sd", "demo-tiny-sd-1step"):
        m = measured["models"][model]
        assert m["load_s"] > 0 and len(m["load_s_runs"]) == 1
        assert m["rss_gib"] > 0 and set(m["rss_peak_gib"]) == {"1", "2"}  # CPU run: RSS, labelled
        assert "gpu_memory_gib" not in m

    show = _cli("profile", "show", str(out))
    assert show.returncode == 0, show.stderr
    assert "tiny-sm-measured on cpu" in show.stdout and "measured: " in show.stdout and "rss_gib" in show.stdout
    shown = json.loads(_cli("profile", "show", str(out), "--json").stdout)
    assert shown["measured"]["models"]["demo-tiny-sd"]["load_s"] > 0
    levels = {lv["id"]: lv for lv in shown["levels"]}
    assert set(levels["sd-8"]["latency_s"]) == {"1", "2"}
    assert levels["sd-8"]["latency_s"]["1"] != 1.0  # measured, not the input's placeholder

    plan = _cli("plan", "--profile", str(out), "--gpus", "4", "--load-qpm", "30", "--json")
    assert plan.returncode == 0, plan.stderr
    got = json.loads(plan.stdout)
    assert got["profile"] == "tiny-sm-measured" and sum(got["counts"]) == 4


@pytest.mark.integration
@pytest.mark.slow
def test_measured_cascade_with_quality_table_plans(tmp_path, demo_models_dir, monkeypatch, tiny_clip_config):  # noqa: F811
    """The old script's job through its thin wrapper: a cascade profile and a CLIPScore table."""
    from argusdiff.profile import load_profile
    from traces.quality import QualityTable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out, table = tmp_path / "c.toml", tmp_path / "q.csv"
    wrapper = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "profile_models.py"), "--profile", "demo-cpu-cascade",
         "--out-profile", str(out), "--batch-sizes", "1", *FAST, "--models-dir", demo_models_dir, "--quiet",
         "--n-prompts", "3", "--quality-out", str(table), "--clip-model", str(tiny_clip_config)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert wrapper.returncode == 0, wrapper.stderr
    profile = load_profile(out)
    assert profile.ids == ("sd-heavy", "sd-light") and profile.cascade is not None
    q = QualityTable.from_csv(table)
    assert q.level_ids == profile.ids and len(q) == 3 and q.metric == "clipscore" and "random weights" in q.source
    assert "random CLIP weights" in tomllib.loads(out.read_text())["measured"]["quality"]
    plan = _cli("plan", "--profile", str(out), "--gpus", "4", "--load-qpm", "60", "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["light"] == "sd-light"


def _code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors
        return int(exc.code)


def test_bad_options_exit_2_naming_the_option(tmp_path, capsys):
    base = ["profile", "measure", "--profile", "demo-cpu", "--out", str(tmp_path / "x.toml")]
    for extra, needle in (
        (["--repeats", "0"], "--repeats"),
        (["--batch-sizes", "0,1"], "--batch-sizes"),
        (["--batch-sizes", "a"], "--batch-sizes"),
        (["--model", "nonsense"], "--model"),
        (["--quality-out", "q.csv", "--n-prompts", "1"], "--n-prompts"),
    ):
        assert _code([*base, *extra]) == 2, extra
        assert needle in capsys.readouterr().err
    src = tmp_path / "p.toml"
    src.write_text(SM_LADDER.replace('model = "demo-tiny-sd"\n', 'model = "no-such-model"\n', 1))
    assert main(["profile", "measure", "--profile", str(src), "--out", str(tmp_path / "y.toml")]) == 2
    assert "no-such-model" in capsys.readouterr().err
    assert not (tmp_path / "x.toml").exists() and not (tmp_path / "y.toml").exists()


@pytest.mark.integration
def test_quality_of_ac_levels_resumes_from_the_nearest_other_prompt(demo_registry, monkeypatch, tiny_clip_config):  # noqa: F811
    from classifiers.scorers import make_scorer
    from workers import profiling
    from workers.demo import load_demo_profile

    calls = []
    real_resume = __import__("workers.pipelines", fromlist=["resume"]).resume

    def spy(model, prompts, lat, k, seeds, **kw):
        calls.append((prompts[0], k))
        return real_resume(model, prompts, lat, k, seeds, **kw)

    monkeypatch.setattr("workers.pipelines.resume", spy)
    monkeypatch.setattr(profiling, "_neighbours", lambda prompts: [1, 0, 0])
    profile = load_demo_profile("demo-cpu")
    scorer = make_scorer("clipscore", str(tiny_clip_config))
    scores = profiling.measure_quality(profile, demo_registry, ["a red cube", "a red box", "a tree"], scorer)
    assert scores.shape == (3, 3)
    assert sorted(calls) == sorted([(p, k) for k in (2, 4) for p in ("a red cube", "a red box", "a tree")])


@pytest.mark.integration
@pytest.mark.slow
def test_measuring_a_deployment_profile_keeps_its_cascades(tmp_path, demo_models_dir, monkeypatch, capsys):
    """A deployment profile's [[cascades]] pairs come through a measurement unchanged."""
    from argusdiff.profile import load_profile

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "measured.toml"
    argv = ["profile", "measure", "--profile", "demo-cpu-flux-unified", "--out", str(out), "--batch-sizes", "1",
            "--models-dir", demo_models_dir, "--quiet", *FAST]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    measured, shipped = load_profile(str(out)), load_profile("demo-cpu-flux-unified")
    assert measured.cascades == shipped.cascades and measured.ids == shipped.ids
    assert measured.level("flux-fbc").feature_cache == shipped.level("flux-fbc").feature_cache
