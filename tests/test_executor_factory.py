"""The one executor factory, the one AC capture rule and the one level catalogue."""

from __future__ import annotations

import pytest

from argusdiff.domain import ApproxLevel, CascadeSpec, Profile, Strategy, level_catalogue
from argusdiff.errors import ConfigError
from workers.executor import ExecutorFactory
from workers.messages import WorkItem


def _lv(id: str, strategy: Strategy, model: str, *, steps: int = 8, skip: int = 0, quality: float = 1.0) -> ApproxLevel:
    return ApproxLevel(
        id=id,
        strategy=strategy,
        model=model,
        steps=steps,
        skip=skip,
        latency_s={1: 0.5 - 0.05 * skip},
        quality=quality,
        load_time_s=2.0,
    )


AC = Profile(
    name="ac",
    gpu="cpu",
    levels=(
        _lv("xl-k0", Strategy.AC, "demo-tiny-sdxl"),
        _lv("xl-k2", Strategy.AC, "demo-tiny-sdxl", skip=2, quality=0.95),
        _lv("xl-k4", Strategy.AC, "demo-tiny-sdxl", skip=4, quality=0.9),
        # the same model at another N, and another model: their latents never resume an xl-k* run
        _lv("xl16-k6", Strategy.AC, "demo-tiny-sdxl", steps=16, skip=6, quality=0.85),
        _lv("sd-k3", Strategy.AC, "demo-tiny-sd", skip=3, quality=0.8),
    ),
)
SM = Profile(
    name="sm",
    gpu="cpu",
    levels=(_lv("xl-k0", Strategy.SM, "other"), _lv("sd", Strategy.SM, "demo-tiny-sd", quality=0.7)),
)


def test_level_catalogue_is_the_profile_then_what_the_fallback_adds():
    levels = level_catalogue(AC, SM)
    assert list(levels) == [*AC.ids, "sd"]
    assert levels["xl-k0"] is AC.level("xl-k0")  # the profile's level wins over the fallback's
    assert level_catalogue(AC, None) == {lv.id: lv for lv in AC.levels}


def test_ac_capture_ks_takes_the_levels_of_the_same_model_and_steps():
    from workers.ac import ac_capture_ks

    assert ac_capture_ks(AC, AC.level("xl-k0")) == (2, 4)
    assert ac_capture_ks(AC, AC.level("xl16-k6")) == (6,)
    assert ac_capture_ks(AC, AC.level("sd-k3")) == (3,)
    assert ac_capture_ks(level_catalogue(AC, SM).values(), AC.level("xl-k2")) == (2, 4)


def test_the_factory_gives_ac_workers_the_one_capture_rule(tmp_path):
    from workers.ac import ApproxCacheExecutor
    from workers.registry import ModelRegistry
    from workers.sm import ModelExecutor

    factory = ExecutorFactory(AC, ModelRegistry(models_dir=tmp_path), fallback=SM)
    ex = factory("xl-k0")
    assert isinstance(ex, ApproxCacheExecutor) and ex.capture_ks == (2, 4)
    assert factory("sd-k3").capture_ks == (3,)
    assert type(factory("sd")) is ModelExecutor  # a fallback level
    with pytest.raises(ConfigError, match="'nope' is not in profile 'ac'"):
        factory("nope")


def test_the_factory_builds_the_registry_and_the_judge_once_and_only_when_needed(tmp_path):
    from workers.cascade import CascadeExecutor
    from workers.registry import ModelRegistry
    from workers.sm import ModelExecutor

    pair = CascadeSpec(
        light="light", heavy="heavy", discriminator_latency_s=0.1, thresholds=(0.2, 0.5, 0.8), deferral=(0.1, 0.4, 0.9)
    )
    cascade = Profile(
        name="cascade",
        gpu="cpu",
        levels=(
            _lv("heavy", Strategy.CASCADE, "demo-tiny-sdxl"),
            _lv("light", Strategy.CASCADE, "demo-tiny-sd", quality=0.8),
        ),
        cascade=pair,
    )
    built: list[str] = []

    def load_registry():
        built.append("registry")
        return ModelRegistry(models_dir=tmp_path)

    def load_judge():
        built.append("judge")
        return lambda image: 1.0

    factory = ExecutorFactory(cascade, load_registry=load_registry, load_judge=load_judge)
    assert built == []
    assert type(factory("heavy")) is ModelExecutor and built == ["registry"]
    light = factory("light")
    assert isinstance(light, CascadeExecutor) and light.threshold == 0.5  # the middle of the grid
    factory("light")
    assert built == ["registry", "judge"]
    # no judge: the light level runs as a plain model executor
    assert type(ExecutorFactory(cascade, ModelRegistry(models_dir=tmp_path))("light")) is ModelExecutor


def test_stand_ins_need_no_registry_and_pay_a_model_load_once():
    from workers.standin import StandInExecutor

    slept: list[float] = []
    factory = ExecutorFactory(AC, fallback=SM, stand_in_scale=0.5, max_loaded_models=1)
    first, other, again = factory("xl-k0"), factory("sd"), factory("sd")
    assert all(isinstance(x, StandInExecutor) for x in (first, other, again))
    # the first model loads before the worker takes work; a switch costs the scaled load time
    assert (first._load_s, other._load_s, again._load_s) == (0.0, 1.0, 0.0)
    again._sleep = slept.append
    (res,) = again.run([WorkItem("r", "a cat", "sd", seed=1)])
    assert res.ok and res.level == "sd" and res.timings["stand_in"] == 1.0
    assert slept == [0.0, pytest.approx(0.25)]  # its (resident) model load, then the latency (0.5 s) x the scale
    with pytest.raises(ConfigError, match="has no model registry"):
        ExecutorFactory(AC)("xl-k0")
