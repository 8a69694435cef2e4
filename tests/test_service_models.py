"""The service on real (tiny, random-weight) diffusers models: ``argusdiff serve`` with no
arguments answers the official openai client; a failing latent-cache store (a real S3 server that
is stopped) switches approximate caching to smaller models with no failed request."""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from fixtures_service import free_port, service_settings, stop_process

from argusdiff.service.worker import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

S3_SCRIPT = Path(__file__).resolve().parent.parent.parent / "shared" / "tools" / "s3-server.sh"

FALLBACK = """
name = "demo-cpu-sm"
gpu = "cpu"
description = "test fallback: smaller-model ladder over the tiny demo pipelines"
slo_s = 2.0

[[levels]]
id = "sm-xl"
strategy = "sm"
model = "demo-tiny-sdxl"
steps = 8
latency_s = { 1 = 0.25 }   # demo-cpu's K = 0 level (same pipeline)
quality = 1.0
load_time_s = 0.35

[[levels]]
id = "sm-sd"
strategy = "sm"
model = "demo-tiny-sd"
steps = 8
latency_s = { 1 = 0.2 }    # nominal: the SD-1.x-shaped tiny pipeline is no slower
quality = 0.9
load_time_s = 0.35
"""


def test_serve_without_arguments_answers_the_openai_client(demo_models_dir, tmp_path):
    openai = pytest.importorskip("openai")
    from PIL import Image

    port = free_port()
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        ARGUSDIFF_WORKERS__MODELS_DIR=demo_models_dir,
        ARGUSDIFF_WORKERS__DEVICE="cpu",
        ARGUSDIFF_WORKERS__TORCH_THREADS="1",
        ARGUSDIFF_CACHE__PATH=str(tmp_path / "cache"),
        ARGUSDIFF_SERVICE__PORT=str(port),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "argusdiff", "serve", "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(ready, 180, 0.2)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=180)
        out = client.images.generate(prompt="a watercolor of a harbour", response_format="b64_json")
        image = Image.open(io.BytesIO(base64.b64decode(out.data[0].b64_json)))
        assert image.size == (64, 64)
        plan = httpx.get(f"{url}/v1/plan").json()
        assert plan["levels"] == ["xl-k0", "xl-k2", "xl-k4"] and plan["strategy"] == "ac"
        metrics = httpx.get(f"{url}/metrics").text
        assert 'outcome="ok"' in metrics
    finally:
        stop_process(proc)
    assert proc.returncode in (0, -15)


@pytest.fixture
def private_s3():
    """An S3 server of this test alone (so it can be stopped mid-test)."""
    if not S3_SCRIPT.is_file():
        pytest.skip(f"{S3_SCRIPT} is absent")
    folder = tempfile.mkdtemp(prefix="argusdiff-svc-s3-")
    proc = subprocess.run(["bash", str(S3_SCRIPT), "start", folder], capture_output=True, text=True, timeout=600)
    env = {}
    for line in proc.stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            k, v = line[len("export ") :].split("=", 1)
            env[k] = v.strip("'\"")
    if proc.returncode != 0 or "S3_ENDPOINT_URL" not in env:
        pytest.skip(f"cannot start an S3 server: {(proc.stderr or proc.stdout).strip()[-300:]}")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)

    def stop() -> None:
        subprocess.run(["bash", str(S3_SCRIPT), "stop", folder], capture_output=True, timeout=120)

    def start() -> None:
        subprocess.run(["bash", str(S3_SCRIPT), "start", folder], capture_output=True, timeout=600, check=True)

    env["stop"] = stop
    env["start"] = start
    try:
        yield env
    finally:
        stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_cache_store_failure_switches_ac_to_sm_without_failing_requests(
    demo_models_dir, tmp_path, private_s3, live_service
):
    from argusdiff.config import Settings

    fallback = tmp_path / "demo-cpu-sm.toml"
    fallback.write_text(FALLBACK)
    base = service_settings(
        "demo-cpu",
        stand_in_scale=None,
        workers=2,
        fallback_profile=str(fallback),
        control_period_s=0.5,
        cache_error_threshold=0.2,
        cache_window=10,
        cache_probe_period_s=1.0,
        request_timeout_s=120,
    ).model_dump()
    base["workers"].update(models_dir=demo_models_dir, device="cpu", torch_threads=1, poll_s=0.05)
    base["cache"].update(
        path=str(tmp_path / "cache"),
        store="s3",
        s3_bucket="argusdiff-svc-test",
        s3_endpoint_url=private_s3["S3_ENDPOINT_URL"],
        timeout_s=2.0,
    )
    server = live_service(Settings.model_validate(base))
    url = f"{server.url}/v1/argusdiff/generations"
    statuses = []
    for i in range(4):  # healthy cache: AC
        r = httpx.post(url, json={"prompt": f"a red boat number {i % 2}", "seed": i}, timeout=120)
        statuses.append(r.status_code)
    assert server.service.router.plan.strategy.value == "ac"
    private_s3["stop"]()  # the blob store fails
    t0 = time.monotonic()
    i = 0
    while time.monotonic() - t0 < 90:
        r = httpx.post(url, json={"prompt": f"a red boat number {i % 2}", "seed": i}, timeout=120)
        statuses.append(r.status_code)
        i += 1
        if server.service.router.plan.strategy.value == "sm" and i >= 4:
            break
    assert server.service.router.plan.strategy.value == "sm", "the plan did not switch to SM"
    # after the switch requests are served by the SM levels
    r = httpx.post(url, json={"prompt": "a blue kite", "seed": 99}, timeout=120)
    statuses.append(r.status_code)
    assert r.json()["data"][0]["level"] in ("sm-xl", "sm-sd")
    assert set(statuses) == {200}, statuses
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'argusdiff_strategy_switches_total{to="sm"} 1.0' in metrics
    assert 'argusdiff_strategy{strategy="sm"} 1.0' in metrics
    assert 'argusdiff_cache_lookups_total{result="error"}' in metrics
    # the store comes back: background probes find it healthy and the plan returns to AC
    private_s3["start"]()
    assert wait_until(lambda: server.service.router.plan.strategy.value == "ac", 60, 0.1)
    r = httpx.post(url, json={"prompt": "a green tram", "seed": 5}, timeout=120)
    assert r.status_code == 200 and r.json()["data"][0]["level"].startswith("xl-")
