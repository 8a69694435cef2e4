"""Demand EWMA and the affinity histogram H."""

from __future__ import annotations

import pytest

from argusdiff.config import PredictorConfig
from argusdiff.errors import ConfigError
from argusdiff.predictors import AffinityHistogram, EwmaDemand


def test_ewma_recursion():
    e = EwmaDemand(alpha=0.5)
    assert e.predicted == 0.0
    assert e.update(100) == 100  # starts at the first observation
    assert e.update(200) == 150
    assert e.update(0) == 75
    assert e.predicted == 75 and e.observations == 3


def test_ewma_alpha_one_follows_the_last_observation():
    e = EwmaDemand(alpha=1.0)
    for x in (5, 50, 7):
        assert e.update(x) == x
    assert e.predicted == 7


def test_ewma_window_forgets_old_bursts():
    e = EwmaDemand(alpha=0.2, window=3)
    e.update(1000)
    for _ in range(3):
        e.update(10)
    assert e.predicted == pytest.approx(10)
    unbounded = EwmaDemand(alpha=0.2)
    unbounded.update(1000)
    for _ in range(3):
        unbounded.update(10)
    assert unbounded.predicted > 400


def test_ewma_window_weights():
    e = EwmaDemand(alpha=0.5, window=2)
    e.update(100)
    assert e.update(200) == pytest.approx((0.5 * 200 + 0.25 * 100) / 0.75)


def test_ewma_arrivals_and_config():
    e = EwmaDemand.from_config(PredictorConfig(ewma_alpha=0.25, demand_window=4))
    assert e.alpha == 0.25 and e.window == 4
    assert e.update_arrivals(30, 10.0) == 180.0
    with pytest.raises(ConfigError, match="period_s"):
        e.update_arrivals(3, 0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"alpha": 0}, "ewma_alpha"),
        ({"alpha": 1.5}, "ewma_alpha"),
        ({"window": 0}, "window"),
        ({"initial_qpm": -1}, "initial_qpm"),
    ],
)
def test_ewma_bad_parameters(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        EwmaDemand(**kwargs)


def test_ewma_rejects_bad_observation():
    with pytest.raises(ConfigError, match="observed_qpm"):
        EwmaDemand().update(float("nan"))


def test_histogram_window():
    h = AffinityHistogram(["a", "b", "c"], window=4)
    assert h.shares() == pytest.approx((1 / 3, 1 / 3, 1 / 3))  # no information yet
    h.extend(["a", "a", "b", "c"])
    assert h.counts() == (2, 1, 1)
    h.add("c")  # evicts the oldest "a"
    assert h.counts() == (1, 1, 2) and len(h) == 4
    assert h.shares() == (0.25, 0.25, 0.5)
    assert h.as_mapping() == {"a": 1, "b": 1, "c": 2}
    for _ in range(10):
        h.add("b")
    assert h.counts() == (0, 4, 0)


def test_histogram_errors_and_config():
    h = AffinityHistogram.from_config(["x", "y"], PredictorConfig(affinity_window=1000))
    assert h.window == 1000
    with pytest.raises(ConfigError, match="unknown level id 'z'"):
        h.add("z")
    with pytest.raises(ConfigError, match="duplicate"):
        AffinityHistogram(["x", "x"])
    with pytest.raises(ConfigError, match="affinity_window"):
        AffinityHistogram(["x"], window=0)
    assert AffinityHistogram.shares_of({"x": 3, "y": 1}, ["x", "y"]) == (0.75, 0.25)
    assert AffinityHistogram.shares_of({}, ["x", "y"]) == (0.5, 0.5)
