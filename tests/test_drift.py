"""Drift monitor (fires on a shifted stream, not on a stationary one) and off-path retraining."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures_classifiers import separable_table, tiny_bert  # noqa: F401 - fixture

from classifiers.drift import ClassifierSlot, DriftMonitor, DriftRetrainer
from classifiers.errors import ClassifierInputError


def test_stationary_stream_does_not_fire():
    rng = np.random.default_rng(0)
    mon = DriftMonitor(window=200, history=5, tolerance=0.02)
    assert mon.extend(rng.normal(20.0, 1.0, 200 * 50)) == []
    assert mon.windows == 50


def test_shifted_stream_fires_at_the_shift():
    rng = np.random.default_rng(1)
    mon = DriftMonitor(window=200, history=5, tolerance=0.02)
    before = rng.normal(20.0, 1.0, 200 * 10)
    after = rng.normal(19.0, 1.0, 200 * 3)  # quality drops 5%
    events = mon.extend(np.concatenate([before, after]))
    assert events, "a 5% drop must be flagged"
    assert events[0].window == 10
    assert events[0].median < events[0].baseline
    assert events[0].baseline == pytest.approx(20.0, abs=0.2)


def test_needs_history_and_validates():
    mon = DriftMonitor(window=2, history=3, min_history=2)
    assert mon.extend([10, 10]) == []  # first window: no baseline yet
    assert mon.extend([1, 1]) == []  # second window: one earlier window < min_history
    assert mon.extend([1, 1]) != []  # baseline (10 + 1) / 2 = 5.5 > 1
    with pytest.raises(ClassifierInputError):
        DriftMonitor(window=0)
    with pytest.raises(ClassifierInputError):
        mon.add(float("nan"))


def test_drift_retrains_off_path_and_swaps_atomically(tiny_bert, tmp_path):  # noqa: F811
    import torch

    torch.set_num_threads(1)
    from classifiers.level import LevelClassifier
    from classifiers.train import TrainConfig, train_level_classifier

    table = separable_table(90)
    cfg = TrainConfig(mode="full", epochs=20, lr=1e-3, max_length=16, progress=False, backbone=str(tiny_bert))
    old = LevelClassifier.new(table.level_ids, backbone=str(tiny_bert), max_length=16)
    slot = ClassifierSlot(old)

    def train(t):
        return train_level_classifier(t, config=cfg)[0]

    logs: list[str] = []
    rt = DriftRetrainer(
        slot,
        train,
        monitor=DriftMonitor(window=10, history=3, tolerance=0.02),
        min_samples=60,
        save_dir=tmp_path / "live",
        log=logs.append,
    )
    for p, s in zip(table.prompts, table.scores, strict=True):
        rt.add_sample(p, s)
    assert rt.samples == 90
    started = [rt.observe(q) for q in [20.0] * 30 + [15.0] * 10]
    assert started.count(True) == 1 and started[-1] is True  # the drifted window triggers one retrain
    assert rt.wait(timeout=300)
    assert rt.last_error is None, rt.last_error
    assert rt.retrains == 1 and slot.version == 2
    assert slot.classifier is not old
    assert (tmp_path / "live" / "model.safetensors").is_file()
    acc = np.mean(np.array(slot.predict(list(table.prompts))) == np.array(table.level_ids)[table.optimal_levels()])
    assert acc >= 0.9
    assert any("drift" in m for m in logs)
    with pytest.raises(ClassifierInputError):
        rt.add_sample("x", [1.0])


def test_failed_retrain_keeps_the_old_model(tiny_bert):  # noqa: F811
    from classifiers.level import LevelClassifier

    old = LevelClassifier.new(("l0", "l1", "l2"), backbone=str(tiny_bert))
    slot = ClassifierSlot(old)

    def broken(t):
        raise RuntimeError("out of memory")

    rt = DriftRetrainer(slot, broken, monitor=DriftMonitor(window=1, history=1, min_history=1), min_samples=2)
    rt.add_sample("a", [1.0, 0.5, 0.2])
    rt.add_sample("b", [1.0, 0.95, 0.9])
    rt.observe(10.0)
    assert rt.observe(1.0) is True
    rt.wait(30)
    assert isinstance(rt.last_error, RuntimeError)
    assert slot.classifier is old and slot.version == 1 and rt.retrains == 0


def test_monitor_from_settings():
    from argusdiff.config import ClassifierConfig

    mon = DriftMonitor.from_config(ClassifierConfig(drift_window=50, drift_history=1, drift_tolerance=0.1))
    assert (mon.window, mon.history, mon.tolerance, mon.min_history) == (50, 1, 0.1, 1)
    assert mon.extend([10.0] * 50 + [8.0] * 50) != []  # 20 % drop > 10 % tolerance
