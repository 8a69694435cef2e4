"""scripts/profile_models.py on the tiny demo models: a valid profile and QualityTable come out."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tiny_clip(tmp_path: Path) -> Path:
    path = tmp_path / "argusdiff-test-tiny-clip-w.json"
    cfg = {
        "embed_dim": 32,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    path.write_text(json.dumps(cfg))
    return path


def test_profile_models_writes_a_valid_profile_and_quality_table(tmp_path, monkeypatch, demo_models_dir):
    from argusdiff.profile import load_profile
    from traces.quality import QualityTable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    clip_cfg = _tiny_clip(tmp_path)
    out, table = tmp_path / "p.toml", tmp_path / "q.csv"
    rc = _script("profile_models").main(
        [
            "--profile", "demo-cpu-cascade", "--out-profile", str(out), "--batch-sizes", "1,2",
            "--repeats", "1", "--warmup", "0", "--n-prompts", "3", "--models-dir", demo_models_dir,
            "--device", "cpu", "--quality-out", str(table), "--clip-model", str(clip_cfg),
            "--note", "test run",
        ]
    )  # fmt: skip
    assert rc == 0
    profile = load_profile(out)
    # a 1-step vs 8-step ladder: robust to timing noise on a shared machine
    assert profile.ids == ("sd-heavy", "sd-light") and profile.cascade is not None
    assert all(lv.batch_sizes == (1, 2) and lv.load_time_s > 0 for lv in profile.levels)
    assert out.read_text().startswith("# test run\n# Measured by scripts/profile_models.py")
    q = QualityTable.from_csv(table)
    assert q.level_ids == profile.ids and len(q) == 3 and q.metric == "clipscore"
    assert "random weights" in q.source


def test_quality_of_ac_levels_resumes_from_the_nearest_other_prompt(tmp_path, demo_registry, monkeypatch):
    from classifiers.scorers import make_scorer
    from workers.demo import load_demo_profile

    mod = _script("profile_models")
    calls = []
    real_resume = __import__("workers.pipelines", fromlist=["resume"]).resume

    def spy(model, prompts, lat, k, seeds, **kw):
        calls.append((prompts[0], k))
        return real_resume(model, prompts, lat, k, seeds, **kw)

    monkeypatch.setattr("workers.pipelines.resume", spy)
    monkeypatch.setattr(mod, "_neighbours", lambda prompts: [1, 0, 0])
    profile = load_demo_profile("demo-cpu")
    scorer = make_scorer("clipscore", str(_tiny_clip(tmp_path)))
    scores, _ = mod.measure_quality(
        profile, demo_registry, ["a red cube", "a red box", "a tree"], ["a", "b", "c"], scorer
    )
    assert scores.shape == (3, 3)
    assert sorted(calls) == sorted([(p, k) for k in (2, 4) for p in ("a red cube", "a red box", "a tree")])
