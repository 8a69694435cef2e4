"""ARGUS §4.1 drift retraining: the live loop in ``argusdiff serve`` (score sampled served images off
the path, flag drift, label the collected prompts at every level, retrain, swap) and the same rule in
the replay."""

from __future__ import annotations

import io
import types

import numpy as np
import pytest
from fixtures_classifiers import tiny_bert, tiny_clip_config  # noqa: F401 - fixtures
from fixtures_service import service_settings

FAMILIES = {
    "animals": "a photo of a small {c} cat asleep on a sofa, number {i}",
    "cities": "isometric city block at night with {c} neon signs, view {i}",
    "food": "a bowl of {c} ramen on a wooden table, studio light, dish {i}",
    "text": "the word {c} written in bold letters on a wall, sign {i}",
}
SEED = 7  # one seed for every request: the stand-in images differ only by level and prompt
COLOURS = ("red", "green", "blue", "golden", "grey", "violet", "orange", "white")


def family(name: str, start: int, n: int) -> list[str]:
    return [FAMILIES[name].format(c=COLOURS[i % len(COLOURS)], i=i) for i in range(start, start + n)]


def test_trigger_flags_a_drop_and_retrains_once_enough_prompts_are_collected():
    from classifiers.drift import DriftMonitor, DriftTrigger

    t = DriftTrigger(DriftMonitor(window=10, history=3, tolerance=0.02), min_samples=25)
    for i in range(30):  # three stationary windows: no drift
        assert t.add(20.0, f"a{i}") is None
    assert not t.pending and t.last_window == 20.0
    events = [t.add(15.0, f"b{i % 5}") for i in range(10)]  # a drop, but only 5 new distinct prompts
    assert events[-1] is not None and t.pending and t.last_baseline == 20.0
    assert t.collected == 35 and t.due()  # 30 + 5 distinct prompts >= 25
    assert t.prompts()[-1] == "b4" and len(t.prompts()) == 25
    t.retrained()
    assert t.retrains == 1 and not t.pending and t.collected == 0 and t.monitor.windows == 4
    # after the retrain the monitor needs a fresh history before it can fire again
    assert all(t.add(15.0, f"c{i}") is None for i in range(20))


def test_replay_drift_counts_retrains_over_the_served_stream():
    from argusdiff.simulator.drift import DriftSettings, replay_drift
    from argusdiff.simulator.engine import DROPPED, SERVED

    rng = np.random.default_rng(0)
    n = 6000
    quality = np.where(np.arange(n) < 3000, rng.normal(20, 0.5, n), rng.normal(18, 0.5, n))  # a 10 % drop
    status = np.full(n, SERVED, dtype=np.int8)
    status[::50] = DROPPED
    finish = np.arange(n, dtype=float) * 0.5
    order = rng.permutation(n)  # recorded out of order: the loop sees them by finish time
    res = types.SimpleNamespace(
        status=status[order],
        finish_s=finish[order],
        quality=quality[order],
        workload=types.SimpleNamespace(prompt_idx=(np.arange(n) % 4000)[order]),
    )
    out = replay_drift(res, DriftSettings(window=200, history=5, tolerance=0.02, min_samples=500, sample=1.0))
    assert out.scored == int((status == SERVED).sum())
    assert out.retrains == 1 and out.events >= 1
    assert 3000 * 0.5 / 60 <= out.retrain_at_min[0] <= 3400 * 0.5 / 60  # in the first drifted windows
    flat = replay_drift(res, DriftSettings(window=200, history=5, tolerance=0.2, min_samples=500, sample=1.0))
    assert flat.retrains == 0  # a 10 % drop is inside a 20 % tolerance
    half = replay_drift(res, DriftSettings(window=100, history=5, tolerance=0.02, min_samples=300, sample=0.5))
    assert half.scored < out.scored and half.retrains == 1
    assert out.as_dict()["retrains"] == 1


def _stand_in_png(prompt: str, level: str, seed: int) -> bytes:
    from workers.messages import WorkItem
    from workers.standin import StandInExecutor, solid_png

    rgb = StandInExecutor._colour(WorkItem(request_id="x", prompt=prompt, level=level, seed=seed))
    return solid_png(8, 8, rgb)


@pytest.mark.integration
def test_a_prompt_shift_retrains_and_swaps_the_classifier_with_no_failed_request(
    tiny_bert,  # noqa: F811
    tiny_clip_config,  # noqa: F811
    live_service,
):
    """argus on demo-cpu with stand-in workers and a tiny classifier: the served prompts move to a
    family the (tiny, random-weight) PickScore-style scorer rates lower; the loop flags the drop,
    labels the collected prompts at every level, retrains, swaps the classifier in, and every
    request before, during and after the swap is served."""
    import httpx
    import torch
    from PIL import Image

    from argusdiff.profile import load_profile
    from argusdiff.service.worker import wait_until
    from classifiers.level import BatchedClassifier, LevelClassifier
    from classifiers.scorers import make_scorer

    torch.manual_seed(0)
    scorer = make_scorer("pickscore", str(tiny_clip_config), None)
    profile = load_profile("demo-cpu")

    def family_score(name: str) -> float:
        prompts = family(name, 0, 24)
        images = [
            Image.open(io.BytesIO(_stand_in_png(p, lv, SEED))).convert("RGB") for p in prompts for lv in profile.ids
        ]
        return float(np.median(scorer.score([p for p in prompts for _ in profile.ids], images)))

    ranked = sorted(FAMILIES, key=family_score)
    low, high = ranked[0], ranked[-1]
    # a drop the monitor must see: the low family scores under a quarter of the high one, far
    # beyond the 50 % tolerance that keeps one family's window-to-window noise from firing
    assert family_score(high) > 0 and family_score(low) < 0.25 * family_score(high), ranked

    base = service_settings("demo-cpu", workers=2, policy="argus", seed=100)
    drift = {
        "drift_sample": 1.0,
        "drift_window": 8,
        "drift_history": 2,
        "drift_tolerance": 0.5,
        "drift_min_samples": 12,
        "scorer_model": str(tiny_clip_config),
        "backbone": str(tiny_bert),
        "max_length": 32,
        "precision": "float32",
        "ratio": 0.99,  # the tiny scorer's levels differ by a few percent: labels that differ
    }
    settings = base.model_copy(update={"classifier": base.classifier.model_copy(update=drift)})
    clf = LevelClassifier.new(profile.ids, backbone=str(tiny_bert), max_length=32, seed=0)
    batched = BatchedClassifier(clf, max_wait_s=0.005)
    server = live_service(settings, classifier=batched)
    service = server.service
    assert service.drift is not None
    service.drift._scorer = scorer  # the seeded tiny scorer (random weights)
    url = f"{server.url}/v1/argusdiff/generations"
    statuses: list[int] = []

    def ask(prompts: list[str]) -> None:
        for p in prompts:
            r = httpx.post(url, json={"prompt": p, "seed": SEED}, timeout=60)
            statuses.append(r.status_code)

    ask(family(high, 0, 24))  # three windows of the high-scoring family: the baseline
    assert wait_until(lambda: service.drift.scored == 24, 60), (statuses, str(service.drift.status()["drift"]))
    assert service.drift.retrains == 0 and service.drift.trigger.events == 0
    shifted = 0
    while service.drift.retrains == 0 and shifted < 96:  # the shift, until the loop has retrained
        ask(family(low, shifted, 8))
        shifted += 8
        done = 24 + shifted
        wait_until(lambda done=done: service.drift.scored == done and not service.drift.retraining, 120)
    assert service.drift.retrains == 1, service.drift.status()
    assert batched.version == 2 and batched.classifier is not clf
    ask(family(low, 200, 8))  # served by the new classifier
    assert statuses == [200] * len(statuses)  # no request failed, before, during or after the swap

    plan = httpx.get(f"{server.url}/v1/plan", timeout=10).json()
    assert plan["classifier"]["version"] == 2 and plan["classifier"]["retrains"] == 1
    drift = plan["classifier"]["drift"]
    assert drift["events"] >= 1 and drift["window_quality"] is not None and drift["last_error"] is None
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert "argusdiff_classifier_retrains_total 1.0" in metrics
    assert "argusdiff_classifier_version 2.0" in metrics
    assert "argusdiff_drift_window_quality" in metrics


def test_replay_reports_the_drift_loop_of_classifier_policies(monkeypatch, capsys):
    """``argusdiff replay`` applies the ``[classifier] drift_*`` settings to the policies that route
    by the classifier and says how often they retrained (table footer and summary.json)."""
    import json

    from argusdiff.cli import main

    monkeypatch.setenv("ARGUSDIFF_CLASSIFIER__DRIFT_WINDOW", "50")
    monkeypatch.setenv("ARGUSDIFF_CLASSIFIER__DRIFT_MIN_SAMPLES", "40")
    monkeypatch.setenv("ARGUSDIFF_CLASSIFIER__DRIFT_SAMPLE", "1")
    args = ["replay", "--trace", "poisson:qpm=60,duration=10m", "--no-embeddings", "--quiet"]
    assert main([*args, "--policies", "argus,diffserve", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["policies"]
    drift = summary["argus"]["drift"]
    assert drift["window"] == 50 and drift["min_samples"] == 40 and drift["sample"] == 1.0
    assert drift["scored"] == summary["argus"]["served"]
    assert drift["windows"] == drift["scored"] // 50
    assert drift["retrains"] == len(drift["retrain_at_min"]) <= drift["events"]
    assert "drift" not in summary["diffserve"]  # no classifier, no loop
    assert main([*args, "--policies", "argus"]) == 0
    assert f"retrains argus {drift['retrains']} (of {drift['windows']} windows)" in capsys.readouterr().out
