"""``argusdiff serve`` on a DiT profile (demo-cpu-flux: the tiny random-weight FLUX.1-shaped
pipelines in embedded workers) through the real HTTP service: the native and OpenAI generation
routes answer, and ARGUS's own plans route a prompt to an approximate-caching level (resumed from
the latent its first run stored), the First Block Cache level and the smaller [schnell]-shaped
model as the demand it plans for grows. The denoiser's forward calls are counted per request."""

from __future__ import annotations

import base64
import io

import httpx
import pytest
from fixtures_service import demo_model_settings

from argusdiff.service.worker import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = "a lighthouse on a cliff in a storm, oil painting"


@pytest.fixture
def transformer_calls(monkeypatch):
    """Forward calls of every FLUX transformer in this process (the embedded workers' too)."""
    from diffusers import FluxTransformer2DModel

    calls: list[int] = []
    original = FluxTransformer2DModel.forward

    def forward(module, *args, **kwargs):
        calls.append(1)
        return original(module, *args, **kwargs)

    monkeypatch.setattr(FluxTransformer2DModel, "forward", forward)
    return calls


def _plan_for(server, demand: dict, qpm: float | None) -> dict[str, str]:
    """Have ARGUS plan for ``qpm`` (None: the demand it measures) and wait until every worker runs
    its planned level; returns the assignment."""
    svc = server.service
    demand["qpm"] = qpm
    version = svc.router.plan.version

    def settled() -> bool:
        plan = svc.router.plan
        if plan is None or plan.version <= version + 1:  # a plan made with the new demand
            return False
        alive = svc.control.alive
        return all(
            alive.get(w, {}).get("level") == lv and not alive.get(w, {}).get("loading")
            for w, lv in plan.assignment.items()
        )

    assert wait_until(settled, 120, 0.05), (svc.router.plan, svc.control.alive)
    return dict(svc.router.plan.assignment)


def test_serve_routes_between_ac_feature_cache_and_smaller_model_levels(
    demo_models_dir, live_service, tmp_path, transformer_calls
):
    from PIL import Image

    settings = demo_model_settings(demo_models_dir, tmp_path / "cache", policy="argus", workers=2,
                                   profile="demo-cpu-flux")  # fmt: skip
    server = live_service(settings, ready=False)
    svc = server.service
    assert wait_until(lambda: svc.router.plan is not None and svc.control.alive, 180, 0.1)
    # the demand ARGUS plans for: a stand-in for a load generator (its plans, routing and the
    # workers are the service's own)
    policy = svc.control.policy
    measured = policy.demand_qpm
    demand: dict = {"qpm": None}
    policy.demand_qpm = lambda stats: measured(stats) if demand["qpm"] is None else demand["qpm"]

    url = f"{server.url}/v1/argusdiff/generations"

    def native(prompt: str, seed: int) -> dict:
        transformer_calls.clear()
        r = httpx.post(url, json={"prompt": prompt, "seed": seed}, timeout=120)
        assert r.status_code == 200, r.text
        image = r.json()["data"][0]
        png = Image.open(io.BytesIO(base64.b64decode(image["b64_json"])))
        assert png.size == (64, 64)
        image["calls"] = len(transformer_calls)
        return image

    # light demand: every worker at the full 8-step run; the first run stores latents after K = 2, 4
    assert set(_plan_for(server, demand, None).values()) == {"flux-k0"}
    first = native(PROMPT, 1)
    assert (first["level"], first["cache_hit"], first["calls"]) == ("flux-k0", False, 8)
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    out = client.images.generate(prompt="a red boat", response_format="b64_json")
    assert Image.open(io.BytesIO(base64.b64decode(out.data[0].b64_json))).size == (64, 64)

    # 4000 QPM on two workers: both at K = 4 (2 x 2189 QPM); the same prompt resumes after 4 of 8
    assert set(_plan_for(server, demand, 4000.0).values()) == {"flux-k4"}
    again = native(PROMPT, 2)
    assert (again["level"], again["cache_hit"], again["k_used"], again["calls"]) == ("flux-k4", True, 4, 4)

    # 3350 QPM: both workers on the First Block Cache level (2 x 1688 QPM): all 8 steps, with the
    # diffusers hook on the loaded model (no load) skipping part of the attention work
    assert set(_plan_for(server, demand, 3350.0).values()) == {"flux-fbc"}
    fbc = native("a quiet harbour at dawn", 3)
    assert (fbc["level"], fbc["cache_hit"], fbc["calls"]) == ("flux-fbc", False, 8)
    assert 0.0 <= fbc["timings"]["feature_cache_hit_rate"] <= 1.0

    # 5000 QPM: only the smaller model keeps up (2 x 2673 QPM): the workers load it
    assert set(_plan_for(server, demand, 5000.0).values()) == {"schnell"}
    small = native("a quiet harbour at dawn", 4)
    assert (small["level"], small["calls"]) == ("schnell", 2)
    transformer_calls.clear()
    out = client.images.generate(prompt="a red boat", response_format="b64_json", n=2)
    assert len(out.data) == 2 and len(transformer_calls) in (2, 4)  # one batch of two, or two runs

    def plan_levels() -> set:
        return {w["level"] for w in httpx.get(f"{server.url}/v1/plan", timeout=10).json()["workers"].values()}

    # the workers' view comes from their heartbeats: on a loaded machine one may be a beat late
    assert wait_until(lambda: plan_levels() == {"schnell"}, 60, 0.2), plan_levels()
