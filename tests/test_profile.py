"""Profiles: shipped ones load; bad ones fail naming the file, the level and the field."""

from __future__ import annotations

import copy
import csv

import pytest

from argusdiff.domain import Strategy
from argusdiff.errors import ProfileError
from argusdiff.profile import list_profiles, load_profile, parse_profile

SHIPPED = ["sdxl-ac-a100", "sm-a100", "cascade-sdturbo-sdv15", "cascade-sdxs-sdv15", "cascade-sdxlltn-sdxl"]


def test_shipped_profiles_are_listed_and_load():
    assert set(SHIPPED) <= set(list_profiles())
    for name in list_profiles():
        profile = load_profile(name)
        assert profile.name == name
        if profile.unified:  # one plan over several kinds of path: ordered by quality only
            q = profile.qualities()
            assert list(q) == sorted(q, reverse=True), "levels are ordered best first"
        else:
            qpm = profile.peak_qpms()
            assert list(qpm) == sorted(qpm), "levels are ordered slowest first"
        assert profile.levels[0].quality == 1.0


def test_ac_profile_follows_the_stated_latency_model():
    p = load_profile("sdxl-ac-a100")
    assert [lv.skip for lv in p.levels] == [0, 5, 10, 15, 20, 25]
    assert p.best.latency(1) == pytest.approx(4.2)  # ARGUS §5.1
    for lv in p.levels:
        assert lv.strategy is Strategy.AC
        assert lv.latency(1) == pytest.approx(0.2 + (50 - lv.skip) * 0.08)
    assert p.default_slo_s() == pytest.approx(12.6)  # 3 × the slowest level


def test_cascade_profiles_copy_the_artifact_tables(shared_dir):
    """The numbers copied into the profiles equal the DiffServe artifact's files."""
    pairs = {
        "cascade-sdturbo-sdv15": ("sdturbo", "f_sdturbo_sdv15"),
        "cascade-sdxs-sdv15": ("sdxs", "f_sdxs_sdv15"),
        "cascade-sdxlltn-sdxl": ("sdxlltn", "f_sdxs_sdv15"),
    }

    def read(name):
        with open(shared_dir / "data/diffserve" / name, encoding="utf-8") as fh:
            return list(csv.DictReader(fh))

    grid = read("f_t_grid.csv")
    for name, (tag, column) in pairs.items():
        profile = load_profile(name)
        c = profile.cascade
        assert c is not None
        assert list(c.thresholds) == [float(r["t"]) for r in grid]
        assert list(c.deferral) == [float(r[column]) for r in grid]
        rows = [r for r in read(f"stable_diffusion_runtimes_{tag}.csv") if r["Accel"] == "onnxruntime_cpu"]
        for r in rows:
            level = profile.level(c.light if r["Model"] == "sdturbo" else c.heavy)
            ms = float(r["avg_runtime"])
            batch = int(r["batchsize"])
            if ms >= 100000:
                assert batch not in level.latency_s  # infeasible in the artifact
            else:
                assert level.latency_s[batch] == pytest.approx(ms / 1000)


def test_cascade_f_interpolates():
    c = load_profile("cascade-sdturbo-sdv15").cascade
    assert c.f(0.0) == 0.0
    assert c.f(1.0) == 1.0
    assert c.f(0.1) == pytest.approx(0.449)
    assert c.f(0.0025) == pytest.approx((0.0 + 0.143) / 2)


BASE = {
    "name": "t",
    "gpu": "test",
    "levels": [
        {
            "id": "slow",
            "strategy": "ac",
            "model": "m",
            "steps": 50,
            "skip": 0,
            "latency_s": {"1": 2.0},
            "quality": 1.0,
            "load_time_s": 1.0,
        },
        {
            "id": "fast",
            "strategy": "ac",
            "model": "m",
            "steps": 50,
            "skip": 10,
            "latency_s": {"1": 1.0},
            "quality": 0.9,
            "load_time_s": 1.0,
        },
    ],
}


def _bad(mutate):
    data = copy.deepcopy(BASE)
    mutate(data)
    with pytest.raises(ProfileError) as info:
        parse_profile(data, source="bad.toml")
    return str(info.value)


@pytest.mark.parametrize(
    ("mutate", "needles"),
    [
        (lambda d: d["levels"][1]["latency_s"].update({"1": -1.0}), ["bad.toml", "fast", "latency_s"]),
        (lambda d: d["levels"][1].update(quality=1.2), ["bad.toml", "fast", "quality"]),
        (lambda d: d["levels"][1].update(quality=0.0), ["bad.toml", "fast", "quality"]),
        (lambda d: d["levels"][1].update(id="slow"), ["bad.toml", "slow", "duplicates"]),
        (lambda d: d["levels"][1].update(skip=50), ["bad.toml", "fast", "skip"]),
        (lambda d: d["levels"][1].update(strategy="quantum"), ["bad.toml", "fast", "strategy"]),
        (lambda d: d["levels"][1].update(load_time_s=-3), ["bad.toml", "fast", "load_time_s"]),
        (lambda d: d["levels"][1]["latency_s"].update({"1": 5.0}), ["bad.toml", "fast", "monotonicity"]),
        (lambda d: d["levels"][0].update(quality=0.5), ["bad.toml", "fast", "quality", "monotonicity"]),
        (lambda d: d["levels"][0].pop("model"), ["bad.toml", "slow", "model"]),
        (lambda d: d["levels"][0].update(colour="red"), ["bad.toml", "slow", "colour"]),
        (lambda d: d["levels"][0].update(steps=0), ["bad.toml", "slow", "steps"]),
        (lambda d: d["levels"][0]["latency_s"].update({"x": 1.0}), ["bad.toml", "slow", "latency_s"]),
        (lambda d: d["levels"][0]["latency_s"].update({"4": 1.0}), ["bad.toml", "slow", "latency_s", "decreases"]),
        (lambda d: d["levels"][1].update(strategy="sm"), ["bad.toml", "fast", "skip"]),
        (lambda d: d.update(levels=[]), ["bad.toml", "levels"]),
        (
            lambda d: d.update(
                cascade={
                    "light": "fast",
                    "heavy": "nope",
                    "discriminator_latency_s": 0.01,
                    "thresholds": [0, 1],
                    "deferral": [0, 1],
                }
            ),
            ["bad.toml", "cascade", "heavy"],
        ),
        (
            lambda d: d.update(
                cascade={
                    "light": "fast",
                    "heavy": "slow",
                    "discriminator_latency_s": 0.01,
                    "thresholds": [0, 1],
                    "deferral": [1, 0.5],
                }
            ),
            ["bad.toml", "cascade", "deferral"],
        ),
        (
            lambda d: d.update(
                cascade={
                    "light": "slow",
                    "heavy": "fast",
                    "discriminator_latency_s": 0.01,
                    "thresholds": [0, 1],
                    "deferral": [0, 1],
                }
            ),
            ["bad.toml", "cascade", "light"],
        ),
    ],
)
def test_bad_profiles_name_file_level_and_field(mutate, needles):
    message = _bad(mutate)
    for needle in needles:
        assert needle in message, (needle, message)


def test_bad_toml_and_missing_files(tmp_path):
    bad = tmp_path / "broken.toml"
    bad.write_text("name = [", encoding="utf-8")
    with pytest.raises(ProfileError, match=r"broken.toml.*TOML"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="unknown profile"):
        load_profile("no-such-profile")
    with pytest.raises(ProfileError, match="no such profile file"):
        load_profile(tmp_path / "missing.toml")


def test_latency_interpolates_between_profiled_batches():
    level = load_profile("cascade-sdturbo-sdv15").level("sdturbo")
    assert level.latency(1) == pytest.approx(0.1)
    assert level.latency(3) == pytest.approx((0.15 + 0.22) / 2)
    assert level.latency(64) == pytest.approx(1.56 * 2)
    assert level.throughput_qpm(32) == pytest.approx(60 * 32 / 1.56)


def test_time_scaled_profile_scales_every_time_and_throughput(sm):
    fast = sm.time_scaled(0.05)
    for lv, f in zip(sm.levels, fast.levels, strict=True):
        assert f.latency(1) == pytest.approx(lv.latency(1) * 0.05)
        assert f.load_time_s == pytest.approx(lv.load_time_s * 0.05)
        assert f.peak_qpm == pytest.approx(lv.peak_qpm / 0.05)
    assert fast.default_slo_s() == pytest.approx(sm.default_slo_s() * 0.05)


def test_cascade_profiles_name_their_diffserve_pair():
    """Which measured confidences a pair replays with is profile data, not a match on level ids."""
    shipped = {
        name: load_profile(name).cascade.diffserve_pair for name in ("cascade-sdturbo-sdv15", "cascade-sdxs-sdv15")
    }
    assert shipped == {"cascade-sdturbo-sdv15": "sdturbo", "cascade-sdxs-sdv15": "sdxs"}
    assert load_profile("cascade-sdxlltn-sdxl").cascade.diffserve_pair == "sdxlltn"
    unified = load_profile("unified-a100")
    assert {c.light: c.diffserve_pair for c in unified.cascade_specs} == {
        "sdxl-lightning": "sdxlltn",
        "sdturbo": "sdturbo",
        "sdxs": "sdxs",
    }
    assert load_profile("demo-cpu-cascade").cascade.diffserve_pair is None
    cascade = {
        "light": "fast",
        "heavy": "slow",
        "discriminator_latency_s": 0.01,
        "thresholds": [0, 1],
        "deferral": [0, 1],
    }
    message = _bad(lambda d: d.update(cascade={**cascade, "diffserve_pair": 3}))
    assert "cascade" in message and "diffserve_pair" in message
