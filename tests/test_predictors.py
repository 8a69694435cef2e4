"""Demand EWMA and the affinity histogram H."""

from __future__ import annotations

import pytest

from argusdiff.config import PredictorConfig
from argusdiff.errors import ConfigError
from argusdiff.predictors import (
    DEFAULT_PREDICTOR,
    PREDICTORS,
    AffinityHistogram,
    DemandPredictor,
    EwmaDemand,
    PredictorSpec,
    predictor_spec,
)


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


def test_ewma_arrivals():
    e = EwmaDemand(alpha=0.25, window=4)
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


def test_histogram_period_counts_keep_their_proportions_when_the_window_drops_some():
    """A period's counts (ClusterStats.affinity) recorded interleaved: when the next period pushes
    part of it out of the window, what stays keeps the period's proportions (level by level, the
    window kept only the period's last-listed levels)."""
    h = AffinityHistogram(["k0", "k10", "k25"], window=100)
    h.add_counts({"k0": 200, "k10": 100, "k25": 100})  # 400 prompts into a 100-prompt window
    assert h.counts() == (50, 25, 25)
    h.add_counts({"k0": 0, "k10": 0, "k25": 50})  # half of the window replaced
    assert h.counts() == (25, 12, 63) or h.counts() == (25, 13, 62)
    assert sum(h.counts()) == 100
    h2 = AffinityHistogram(["k0", "k10", "k25"], window=1000)
    h2.add_counts({"k0": 3, "k25": 1})  # under the window: every prompt counted
    assert h2.counts() == (3, 0, 1)
    with pytest.raises(ConfigError, match="unknown level id 'z'"):
        h2.add_counts({"z": 1})


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


# ---- the demand predictor ------------------------------------------------------------------


def _minute(per_second: list[int]) -> tuple[int, tuple[int, ...]]:
    return sum(per_second), tuple(per_second)


def test_peak_reads_the_highest_10s_rate_of_the_last_minute():
    p = DemandPredictor("peak")
    # one minute: 50 s quiet at 1 req/s, then 10 s at 5 req/s (a burst)
    total, bins = _minute([1] * 50 + [5] * 10)
    p.observe(total, 60.0, bins, 1.0)
    assert p.estimate == pytest.approx(300.0)  # 5 req/s = 300 QPM
    assert p.predicted == p.estimate  # margin 1
    # the mean reading of the same minute is the minute's rate
    e = DemandPredictor("ewma")
    e.observe(total, 60.0, bins, 1.0)
    assert e.estimate == pytest.approx(100.0)
    # a quiet minute later the burst has left the window
    total, bins = _minute([1] * 60)
    p.observe(total, 60.0, bins, 1.0)
    assert p.estimate == pytest.approx(60.0)


def test_readings_without_sub_period_bins_use_the_period_rate():
    p = DemandPredictor("peak")
    p.observe(120, 60.0)  # no bins: 120 QPM spread over the minute's six 10 s bins
    assert p.estimate == pytest.approx(120.0)


def test_quantile_and_margin():
    spec = predictor_spec("quantile:q=0.5,window=50s,bin=10s,margin=1.2")
    assert spec == PredictorSpec(kind="quantile", bin_s=10.0, window_s=50.0, q=0.5, margin=1.2)
    p = DemandPredictor(spec)
    for rate_per_s in (1, 2, 3, 4, 5):
        p.observe(rate_per_s * 10, 10.0)
    assert p.estimate == pytest.approx(180.0)  # median of 60..300 QPM
    assert p.predicted == pytest.approx(216.0)
    p.observe(100, 10.0)  # 600 QPM; the oldest bin (60) leaves the 5-bin window
    assert p.estimate == pytest.approx(240.0)


def test_incomplete_bins_wait_for_the_rest_of_the_bin():
    p = DemandPredictor("peak")  # 10 s bins
    p.observe(2, 1.0)  # 1 s of a 10 s bin: only the rate so far is known
    assert p.estimate == pytest.approx(120.0)
    for _ in range(9):
        p.observe(0, 1.0)
    assert p.estimate == pytest.approx(12.0)  # the bin closed: 2 arrivals in 10 s


def test_diffserve_artifact_reading_is_pandas_ewm_com_2_1_over_20_positive_samples():
    spec = PREDICTORS["diffserve-artifact"]
    assert spec.bin_s == 1.0 and spec.window_bins == 20 and spec.skip_idle and spec.margin == 1.05
    p = DemandPredictor(spec)
    samples = [3, 0, 5, 2, 0, 0, 7, *range(1, 25)]
    for c in samples:
        p.observe(c, 1.0, (c,), 1.0)
    # pandas: df.ewm(com=2.1).mean() (adjust=True) over the last 20 non-zero samples, per second
    kept = [c * 60.0 for c in samples if c > 0][-20:]
    a = 1.0 / 3.1
    w = [(1 - a) ** k for k in range(len(kept))][::-1]
    expect = sum(x * y for x, y in zip(kept, w, strict=True)) / sum(w)
    assert p.estimate == pytest.approx(expect)
    assert p.predicted == pytest.approx(expect * 1.05)


def test_state_round_trips_through_json_and_continues_identically():
    import json

    for name in PREDICTORS:
        a = DemandPredictor(name)
        for k in range(37):
            a.observe((k * 7) % 11, 1.0, ((k * 7) % 11,), 1.0)
        b = DemandPredictor.from_state(json.loads(json.dumps(a.state())))
        assert b.state() == a.state() and b.predicted == a.predicted
        for k in range(25):
            a.observe(k % 5, 1.0, (k % 5,), 1.0)
            b.observe(k % 5, 1.0, (k % 5,), 1.0)
            assert b.predicted == pytest.approx(a.predicted)
    with pytest.raises(ConfigError, match="predictor state"):
        DemandPredictor.from_state({"bins": []})


def test_predictor_specs_and_errors():
    assert predictor_spec(None) == PREDICTORS[DEFAULT_PREDICTOR]
    assert predictor_spec("peak:margin=1.1").margin == 1.1
    assert predictor_spec({"kind": "ewma", "alpha": 0.3, "bin_s": 5.0}).alpha == 0.3
    assert predictor_spec("ewma:bin=1m,window=5m").window_bins == 5
    for bad, match in (
        ("median", "unknown reading"),
        ("peak:margin=0.9", "margin"),
        ("peak:window=5s", "window"),
        ("peak:colour=red", "bad option"),
        ("peak:bin=fast", "not a duration"),
        ("quantile:q=2", "q:"),
    ):
        with pytest.raises(ConfigError, match=match):
            predictor_spec(bad)
    assert PredictorConfig().demand == DEFAULT_PREDICTOR
    with pytest.raises(ValueError, match="unknown reading"):
        PredictorConfig(demand="median")


def test_bins_a_hair_off_their_length_stay_separate_bins():
    """Regression: a live period is a few microseconds off its nominal length and so are its
    1 s bins; a bin of 0.9999999 s left the predictor's 1 s bin open, so the next bin's arrivals
    joined it and the peak reading averaged two bins (15 and 8 arrivals read as 11.5)."""
    from argusdiff.predictors import DemandPredictor, PredictorSpec

    for bin_s in (0.9999999, 1.0, 1.0000001):
        p = DemandPredictor(PredictorSpec(kind="peak", bin_s=1.0, window_s=6.0))
        p.observe(23, 2 * bin_s, bins=(15, 8), bin_s=bin_s)
        assert p.estimate == 15 * 60.0
        # sub-bins of a 10 s bin: ten of them close it, not eleven
        p = DemandPredictor(PredictorSpec(kind="peak", bin_s=10.0, window_s=60.0))
        p.observe(20, 20 * bin_s, bins=(1,) * 10 + (0,) * 9 + (1,), bin_s=bin_s)
        assert p.estimate == 10 * 6.0 and p.state()["bins"] == [60.0, 6.0]


def test_counting_bins_are_whole_fractions_of_the_readings_bin():
    """Regression: 1 s counting bins for a reading of 2.5 s bins closed each reading bin after
    3 s, so the reading drifted off the arrivals (a time-compressed replay read 220 QPM for 228)."""
    from argusdiff.predictors import PredictorSpec, bin_length_s

    for bin_s, want in ((10.0, 1.0), (60.0, 1.0), (1.0, 1.0), (0.1, 0.1), (2.5, 2.5 / 3), (1.5, 0.75)):
        got = bin_length_s(PredictorSpec(kind="peak", bin_s=bin_s, window_s=6 * bin_s))
        assert abs(got - want) < 1e-12 and got <= 1.0 and abs(bin_s / got - round(bin_s / got)) < 1e-9


def test_affinity_add_counts_in_one_step_leaves_the_state_of_the_adds_in_turn():
    import random

    rng = random.Random(1)
    ids = ["a", "b", "c"]
    for _ in range(300):
        window = rng.randint(1, 12)
        one, bulk = AffinityHistogram(ids, window), AffinityHistogram(ids, window)
        for _ in range(rng.randint(1, 6)):
            counts = {lv: rng.randint(0, 30) for lv in ids if rng.random() < 0.8}
            slots = sorted(
                ((j + 0.5) / c, k, lv) for k, lv in enumerate(ids) for c in [counts.get(lv, 0)] for j in range(c)
            )
            for _pos, _k, lv in slots:
                one.add(lv)
            bulk.add_counts(counts)
            assert list(bulk._recent) == list(one._recent)
            assert list(bulk._counts.items()) == list(one._counts.items())
            assert bulk.shares() == one.shares()
