"""The DiT cascade and deployment profiles: demo-cpu-flux-cascade's [schnell] -> [dev] pair on the
tiny FLUX.1-shaped pipelines (the discriminator judges the light image; a deferral is redone by the
heavy model), and demo-cpu-flux-unified (AC, First Block Cache, a smaller model and that cascade in
one profile) planned by ``argusdiff plan`` and replayed by ``argusdiff replay``."""

from __future__ import annotations

import json

import pytest

from argusdiff.cli import main
from workers.demo import load_demo_profile
from workers.messages import WorkItem

LIGHT, HEAVY = "schnell", "dev"


@pytest.fixture(scope="module")
def tiny_discriminator():
    from classifiers.discriminator import Discriminator

    return Discriminator.new("test_efficientnet", image_size=32, light=LIGHT, profile="demo-cpu-flux-cascade")


def _cascade(registry, judge, threshold, **kw):
    from workers.cascade import CascadeExecutor

    profile = load_demo_profile("demo-cpu-flux-cascade")
    return CascadeExecutor(profile.level(LIGHT), profile.level(HEAVY), registry, judge=judge, threshold=threshold, **kw)


@pytest.mark.integration
def test_schnell_to_dev_cascade_judges_the_light_image(demo_registry, tiny_discriminator):
    items = [WorkItem(f"r{i}", p, LIGHT, seed=i) for i, p in enumerate(["a cat", "a dog", "a boat"])]
    accept = _cascade(demo_registry, tiny_discriminator, 0.0)
    res = accept.run(items)
    assert all(r.ok and r.level == LIGHT and not r.deferred and 0 <= r.confidence <= 1 for r in res)
    assert all(r.unet_calls == 2 and r.handoff is None for r in res)  # the light model's 2 steps
    defer = _cascade(demo_registry, tiny_discriminator, 1.0)
    res = defer.run(items)
    # serving: the light image comes back with a hand-off; the router's policy sends it to [dev]
    assert all(r.handoff is not None and r.handoff.level == HEAVY and r.image_png for r in res)
    assert defer.stats == {"accepted": 0, "deferred": 3}
    inline = _cascade(demo_registry, tiny_discriminator, 1.0, inline_heavy=True)
    res = inline.run(items[:1])[0]
    assert res.ok and res.deferred and res.level == HEAVY and res.unet_calls == 2 + 8
    with pytest.raises(ValueError, match="compatible"):  # no SDEdit refinement between the DiTs
        _cascade(demo_registry, tiny_discriminator, 0.5, inline_heavy=True, refine_strength=0.5)


def test_the_dit_profiles_load_with_their_sources(capsys):
    from argusdiff.profile import load_profile

    cascade = load_profile("demo-cpu-flux-cascade")
    assert (cascade.cascade.light, cascade.cascade.heavy) == (LIGHT, HEAVY)
    unified = load_profile("demo-cpu-flux-unified")
    assert [(c.light, c.heavy) for c in unified.cascades] == [("schnell-1step", "flux-k0")]
    kinds = {lv.id: (lv.strategy.value, bool(lv.feature_cache), lv.skip) for lv in unified.levels}
    assert kinds["flux-fbc"] == ("ac", True, 0) and kinds["flux-k4"] == ("ac", False, 4)
    assert kinds["schnell"][0] == "sm" and kinds["schnell-1step"][0] == "cascade"
    for p in (cascade, unified):
        assert {"latency_s", "load_time_s", "quality"} <= set(p.sources)
        assert main(["profile", "show", p.name]) == 0
        out = capsys.readouterr().out
        assert all(lv.id in out for lv in p.levels) and "cascade" in out


def test_plan_puts_dit_paths_in_one_plan(capsys):
    def plan(qpm: int) -> dict:
        args = ["plan", "--profile", "demo-cpu-flux-unified", "--gpus", "3", "--load-qpm", str(qpm), "--json"]
        assert main(args) == 0
        return {p["id"]: p for p in json.loads(capsys.readouterr().out)["paths"]}

    light = plan(1000)
    assert light["flux-k0"]["workers"] == 3  # light load: the best path everywhere
    mid = plan(5000)  # AC and the feature cache share the loaded [dev]-shaped model
    assert mid["flux-fbc"]["workers"] >= 1 and sum(p["workers"] for p in mid.values()) == 3
    assert {p["strategy"] for p in mid.values() if p["workers"]} == {"ac"}
    heavy = plan(9000)  # past what [dev] serves: the [schnell]-shaped model, cascade and smaller model
    assert heavy["schnell-1step"]["workers"] >= 1 and heavy["schnell-1step"]["heavy"] == "flux-k0"
    assert all(heavy[p]["workers"] == 0 for p in ("flux-k0", "flux-fbc", "flux-k2", "flux-k4"))


def test_replay_runs_the_dit_deployment_profile(capsys):
    args = ["replay", "--profile", "demo-cpu-flux", "--cascade-profile", "demo-cpu-flux-cascade",
            "--unified-profile", "demo-cpu-flux-unified", "--policies", "argus+,diffserve",
            "--trace", "poisson:qpm=3000,duration=2m", "--gpus", "3", "--no-embeddings",
            "--no-plots", "--no-bound", "--quiet", "--json"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)["policies"]
    unified = out["argus+"]
    assert unified["profile"] == "demo-cpu-flux-unified" and unified["requests"] > 0
    from argusdiff.profile import load_profile

    assert set(unified["level_mix"]) <= set(load_profile("demo-cpu-flux-unified").ids)
    assert unified["served"] + unified["dropped"] == unified["requests"]
    cascade = out["diffserve"]
    assert cascade["profile"] == "demo-cpu-flux-cascade" and set(cascade["level_mix"]) <= {LIGHT, HEAVY}
