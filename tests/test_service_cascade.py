"""Cascade deployments in the service (demo-cpu-cascade, tiny real diffusers models and a tiny
discriminator): the per-period cascade threshold of a published plan reaches the light level's
running executor without a restart, embedded and through Redis Streams (a separate
``argusdiff worker`` process)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import httpx
import pytest
from fixtures_service import free_port, stop_process

from argusdiff.service.worker import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LIGHT, HEAVY = "sd-light", "sd-heavy"


@pytest.fixture(scope="module")
def discriminator_dir(tmp_path_factory) -> str:
    import torch

    torch.set_num_threads(1)
    from classifiers.discriminator import Discriminator

    disc = Discriminator.new("test_efficientnet", image_size=32, light=LIGHT, profile="demo-cpu-cascade")
    return str(disc.save(tmp_path_factory.mktemp("disc") / "disc"))


def _settings(demo_models_dir: str, discriminator_dir: str, **service):
    from argusdiff.config import Settings

    base = {
        "workers": 2,
        "stand_in_scale": None,
        "control_period_s": 0.5,
        "heartbeat_s": 0.1,
        "worker_timeout_s": 5.0,
        "port": 0,
        "policy": "diffserve",
    }
    base.update(service)
    return Settings.model_validate(
        {
            "profile": "demo-cpu-cascade",
            "service": base,
            "solver": {"backend": "highs"},
            "workers": {"models_dir": demo_models_dir, "device": "cpu", "torch_threads": 1, "poll_s": 0.05},
            "classifier": {"discriminator": discriminator_dir},
        }
    )


def _force_threshold(service) -> dict:
    """Wrap the live policy's ``plan()``: when ``box["t"]`` is set, the plans the control loop
    publishes carry that threshold (a stand-in for the demand-driven MILP choosing another one)."""
    policy = service.control.policy
    real_plan = policy.plan
    box: dict = {}

    def plan(stats):
        p = real_plan(stats)
        if "t" in box:
            p = dataclasses.replace(p, thresholds={LIGHT: box["t"]})
        return p

    policy.plan = plan
    return box


def _published_threshold(service) -> float | None:
    plan = service.store.read_plan()
    return None if plan is None else plan.thresholds.get(LIGHT)


def test_plan_threshold_reaches_running_cascade_executor_embedded(demo_models_dir, discriminator_dir, live_service):
    server = live_service(_settings(demo_models_dir, discriminator_dir), ready=True)
    svc = server.service
    box = _force_threshold(svc)

    def light_worker():
        return next((w for w in svc.workers if w.level == LIGHT), None)

    assert wait_until(lambda: light_worker() is not None, 60, 0.05), [w.level for w in svc.workers]
    # the threshold the policy planned is the one the running executor applies
    assert wait_until(lambda: light_worker().applied_threshold() == _published_threshold(svc), 30, 0.05)

    for t in (0.0, 1.0, 0.25):  # each differs from the threshold applied before it
        assert light_worker().applied_threshold() != t
        box["t"] = t
        assert wait_until(lambda t=t: _published_threshold(svc) == t, 30, 0.05)
        w = light_worker()
        assert w is not None
        assert wait_until(lambda t=t, w=w: w.applied_threshold() == t, 30, 0.05)
        # the heartbeat (and so /v1/plan) reports the threshold applied
        assert wait_until(lambda t=t, w=w: svc.control.alive.get(w.worker_id, {}).get("threshold") == t, 30, 0.05)
        body = httpx.get(f"{server.url}/v1/plan", timeout=10).json()
        assert body["workers"][w.worker_id]["threshold"] == t
        if t in (0.0, 1.0):
            # the executor really judges with it: 1.0 defers every light image, 0.0 accepts it
            r = httpx.post(
                f"{server.url}/v1/argusdiff/generations",
                json={"prompt": f"a lighthouse at dusk {t}", "seed": 3},
                timeout=120,
            )
            assert r.status_code == 200, r.text
            assert r.json()["data"][0]["level"] == (HEAVY if t == 1.0 else LIGHT)


def test_plan_threshold_reaches_cascade_worker_process_through_redis(
    demo_models_dir, discriminator_dir, live_service, redis_server
):
    server = live_service(
        _settings(demo_models_dir, discriminator_dir, workers=0, redis_url=redis_server.url), ready=False
    )
    svc = server.service
    box = _force_threshold(svc)
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        ARGUSDIFF_SERVICE__HEARTBEAT_S="0.1",
        ARGUSDIFF_SERVICE__WORKER_TIMEOUT_S="5.0",
        ARGUSDIFF_WORKERS__POLL_S="0.05",
        ARGUSDIFF_WORKERS__MODELS_DIR=demo_models_dir,
        ARGUSDIFF_WORKERS__DEVICE="cpu",
        ARGUSDIFF_WORKERS__TORCH_THREADS="1",
        ARGUSDIFF_CLASSIFIER__DISCRIMINATOR=discriminator_dir,
    )
    wid = f"cascade-w{free_port()}"
    cmd = [sys.executable, "-m", "argusdiff", "worker", "--redis", redis_server.url, "--id", wid]
    proc = subprocess.Popen(
        [*cmd, "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def info() -> dict:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            return svc.control.alive.get(wid, {})

        # one worker: the plan puts it on the light level (every query starts there)
        assert wait_until(lambda: info().get("level") == LIGHT, 120, 0.1), info()
        assert wait_until(lambda: info().get("threshold") == _published_threshold(svc), 30, 0.05), info()
        for t in (0.75, 0.0):
            assert info().get("threshold") != t
            box["t"] = t
            assert wait_until(lambda t=t: _published_threshold(svc) == t, 30, 0.05)
            # the worker process read the plan from Redis and its executor applies the threshold
            assert wait_until(lambda t=t: info().get("threshold") == t, 30, 0.05), info()
        r = httpx.post(f"{server.url}/v1/argusdiff/generations", json={"prompt": "a red kite", "seed": 5}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["data"][0]["level"] == LIGHT  # threshold 0: the light image is accepted
    finally:
        stop_process(proc)
