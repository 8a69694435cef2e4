"""The synthetic quality table: marked synthetic, deterministic, calibrated, text-driven."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from argusdiff.profile import load_profile
from traces.prompts import builtin_prompts, load_prompts
from traces.quality import QualityTable, QualityTableError
from traces.synthetic import (
    DEFAULT_PARAMS,
    FEATURE_NAMES,
    TARGETS,
    SyntheticParams,
    calibration_report,
    fit_params,
    level_gaps,
    prompt_features,
    synthetic_quality_table,
)


@pytest.fixture(scope="module")
def ac_table(ac):
    return synthetic_quality_table(builtin_prompts(), ac, seed=0)


def test_marked_synthetic_and_round_trips(ac, ac_table, tmp_path):
    assert ac_table.synthetic is True
    assert "SYNTHETIC" in ac_table.source and "not measured" in ac_table.source
    assert ac_table.level_ids == ac.ids and ac_table.profile == ac.name
    f = tmp_path / "q.csv"
    ac_table.to_csv(f)
    back = QualityTable.from_csv(f)
    assert back.synthetic and np.allclose(back.scores, ac_table.scores)


def test_deterministic_per_prompt_text(ac):
    prompts = ["a red fox in the snow", 'a sign that says "OPEN"', "three cats on a sofa"]
    a = synthetic_quality_table(prompts, ac, seed=1)
    b = synthetic_quality_table([*reversed(prompts), "extra prompt"], ac, seed=1)
    assert np.array_equal(a.scores, b.scores[[2, 1, 0]])
    c = synthetic_quality_table(prompts, ac, seed=2)
    assert not np.array_equal(a.scores, c.scores)


def test_calibrated_to_argus_on_builtin(ac_table):
    rep = calibration_report(ac_table, target=TARGETS["ac"])
    assert 20.3 < rep["oracle_mean"] < 21.2
    assert rep["random_mean"] < rep["oracle_mean"] - 1.5
    # every level is some prompts' optimal level (ARGUS Fig. 8)
    assert min(rep["optimal_share"]) > 0.05
    # the best level is the best on average and quality falls level by level
    assert all(np.diff(rep["level_mean"]) < 0)


def test_degradation_is_super_linear_in_speed_gap(ac, ac_table):
    gaps = level_gaps(ac)
    drop = 1.0 - ac_table.relative().mean(axis=0)
    # per unit of speed gap, faster levels lose more for the median prompt
    med = np.median(1.0 - ac_table.relative(), axis=0)
    assert np.all(np.diff(med[1:] / gaps[1:]) > 0)
    assert drop[-1] > drop[1]
    # noise-free, for prompts far from the saturation cap: drop(gap) grows faster than the gap
    clean = synthetic_quality_table(builtin_prompts(), ac, params=replace(DEFAULT_PARAMS["ac"], score_noise=0.0))
    d = 1.0 - clean.scores / clean.scores[:, :1]
    ok = (d[:, -1] < 0.2) & (d[:, 1] > 1e-6)
    assert ok.sum() > 500
    assert np.all(d[ok, -1] / d[ok, 1] > gaps[-1] / gaps[1])


def test_tolerance_follows_text_features(ac_table):
    b = builtin_prompts()
    opt = ac_table.optimal_levels()
    cats = np.array(b.categories)
    mean = {c: opt[cats == c].mean() for c in set(b.categories)}
    for hard in ("text", "portrait", "spatial"):
        for easy in ("simple", "landscape", "style"):
            assert mean[hard] < mean[easy] - 1.0, (hard, easy, mean)


def test_a_text_model_can_learn_the_optimal_level(ac_table):
    """Least squares on the text features alone explains much of the optimal level on held-out prompts."""
    b = builtin_prompts()
    x = np.c_[prompt_features(b.prompts), np.ones(len(b))]
    y = ac_table.optimal_levels().astype(float)
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(b))
    tr, te = idx[:4000], idx[4000:]
    w, *_ = np.linalg.lstsq(x[tr], y[tr], rcond=None)
    pred = x[te] @ w
    r = np.corrcoef(pred, y[te])[0, 1]
    assert 0.5 < r < 0.99  # learnable, but not a deterministic function of the text


def test_features_shape_and_examples():
    f = prompt_features(['a sign that says "HI"', "a photo of a dog", "two cats to the left of a vase", "8k portrait"])
    assert f.shape == (4, len(FEATURE_NAMES))
    col = {n: i for i, n in enumerate(FEATURE_NAMES)}
    assert f[0, col["text_rendering"]] == 1 and f[1, col["text_rendering"]] == 0
    assert f[2, col["counting"]] == 1 and f[2, col["spatial_terms"]] == 1
    assert f[3, col["counting"]] == 0 and f[3, col["portrait"]] == 1  # "8k" is not a count


def test_cascade_light_level_share_in_diffserve_range():
    t = synthetic_quality_table(builtin_prompts(), load_profile("cascade-sdturbo-sdv15"))
    share_light = float((t.optimal_levels() == 1).mean())
    # DiffServe §2: for 20-40% of queries the light image is as good
    assert 0.15 < share_light < 0.45


def test_bad_params():
    with pytest.raises(QualityTableError, match="max_drop"):
        SyntheticParams(max_drop=1.5)
    with pytest.raises(QualityTableError, match="unknown feature weights"):
        SyntheticParams(weights={"colour": 1.0})
    with pytest.raises(QualityTableError, match="no prompts"):
        synthetic_quality_table([], load_profile("sm-a100"))


def test_fit_params_moves_toward_target(ac):
    prompts = builtin_prompts().sample(600, seed=3)
    params, rep = fit_params(prompts, ac, TARGETS["ac"], maxiter=60)
    assert isinstance(params, SyntheticParams)
    assert abs(rep["oracle_mean"] - 20.8) < 0.05
    assert abs(rep["random_mean"] - 17.6) < 0.5


def test_default_fit_reproduces_argus_on_diffusiondb(shared_dir, ac):
    ddb = load_prompts(shared_dir / "data" / "prompts" / "diffusiondb_2m_first_5k.txt")
    rep = calibration_report(synthetic_quality_table(ddb, ac, params=DEFAULT_PARAMS["ac"]), target=TARGETS["ac"])
    assert abs(rep["error"]["oracle"]) < 0.05
    assert abs(rep["error"]["random"]) < 0.1
    assert rep["error"]["shares_l1"] < 0.08
