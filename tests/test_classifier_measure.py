"""Quality table from a prompt set + profile: tiny demo pipelines (workers) + a tiny CLIP scorer."""

from __future__ import annotations

import io

import pytest
from fixtures_classifiers import tiny_bert, tiny_clip_config  # noqa: F401 - fixture

from classifiers.errors import TrainingDataError

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # builds and runs the tiny demo pipelines

PROMPTS = ["a red fox in the snow", "two cats on a sofa", "a city at night", "portrait of a woman", "a lake"]


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)


def test_measured_table_scores_the_generated_images(tiny_clip_config, demo_registry):  # noqa: F811
    from PIL import Image

    from classifiers.measure import measure_quality_table
    from classifiers.scorers import make_scorer
    from workers.demo import load_demo_profile
    from workers.executor import ExecutorFactory
    from workers.messages import WorkItem

    profile = load_demo_profile("demo-cpu-sm")
    scorer = make_scorer("clipscore", str(tiny_clip_config))
    factory = ExecutorFactory(profile, demo_registry)
    table = measure_quality_table(PROMPTS[:3], profile, scorer, factory, seed=5, progress=False)
    assert table.level_ids == profile.ids and table.scores.shape == (3, len(profile.ids))
    assert table.profile == profile.name and not table.synthetic and table.metric == "clipscore"
    # the score of one cell is the scorer's score of that level's image at the same seed
    j = len(profile.ids) - 1
    res = factory(profile.ids[j]).run([WorkItem(request_id="x", prompt=PROMPTS[1], level=profile.ids[j], seed=6)])
    with Image.open(io.BytesIO(res[0].image_png)) as im:
        again = scorer.score([PROMPTS[1]], [im.convert("RGB")])[0]
    assert table.scores[1, j] == pytest.approx(max(again, 1e-6), rel=1e-4, abs=1e-5)


def test_ac_levels_are_refused(tiny_clip_config, demo_registry):  # noqa: F811
    from argusdiff.profile import load_profile
    from classifiers.measure import measure_quality_table
    from classifiers.scorers import make_scorer
    from workers.executor import ExecutorFactory

    profile = load_profile("demo-cpu")
    scorer = make_scorer("clipscore", str(tiny_clip_config))
    with pytest.raises(TrainingDataError, match="approximate caching"):
        measure_quality_table(PROMPTS, profile, scorer, ExecutorFactory(profile, demo_registry), progress=False)


def test_cli_train_from_prompts(tiny_clip_config, tiny_bert, demo_models_dir, tmp_path, capsys, monkeypatch):  # noqa: F811
    import json

    from argusdiff.cli import main
    from classifiers.level import LevelClassifier
    from traces.quality import QualityTable
    from workers.demo import demo_profile_path

    monkeypatch.setenv("ARGUSDIFF_WORKERS__MODELS_DIR", demo_models_dir)
    monkeypatch.setenv("ARGUSDIFF_WORKERS__DEVICE", "cpu")
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS * 2) + "\n")
    saved = tmp_path / "measured.csv"
    argv = ["train-classifier", "--prompts", str(prompts), "--profile", str(demo_profile_path("demo-cpu-sm"))]
    argv += ["--metric", "clipscore", "--scorer-model", str(tiny_clip_config), "--save-table", str(saved)]
    argv += ["--out", str(tmp_path / "m"), "--backbone", str(tiny_bert), "--mode", "full", "--epochs", "2"]
    argv += ["--ratio", "1.0", "--limit", "8", "--max-length", "16", "--no-progress", "--json"]
    code = main(argv)
    out = capsys.readouterr()
    table = QualityTable.from_csv(saved)
    assert len(table) == 8 and table.metric == "clipscore"
    assert len(set(table.optimal_levels(1.0).tolist())) > 1  # fixed seeds: several best levels
    assert code == 0, out.err
    assert json.loads(out.out)["n_train"] + json.loads(out.out)["n_val"] == 8
    assert LevelClassifier.load(tmp_path / "m").level_ids == table.level_ids
    assert main(["train-classifier", "--prompts", str(prompts), "--out", str(tmp_path / "z")]) == 2
    assert "--profile" in capsys.readouterr().err
