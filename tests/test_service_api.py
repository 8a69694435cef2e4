"""The REST API on a live server (uvicorn) with embedded stand-in workers (TEST MODE)."""

from __future__ import annotations

import base64

import httpx
import pytest
from fixtures_service import service_settings

pytestmark = pytest.mark.integration

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def server(live_service):
    return live_service(service_settings())


def test_health_ready_openapi_metrics(server):
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{server.url}/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True and ready.json()["workers_up"] == 2
    doc = httpx.get(f"{server.url}/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    assert "/v1/images/generations" in doc["paths"] and "/v1/argusdiff/generations" in doc["paths"]
    ref = doc["paths"]["/v1/argusdiff/generations"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    native = doc["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]
    level = native["properties"]["min_quality_level"]["anyOf"][0]
    assert level["enum"] == list(server.service.profile.ids)
    text = httpx.get(f"{server.url}/metrics").text
    assert "argusdiff_plan_version" in text and "argusdiff_workers_up 2.0" in text


def test_openai_client_generates_b64_and_url(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    out = client.images.generate(prompt="a red fox in the snow", n=2, response_format="b64_json")
    assert len(out.data) == 2
    assert all(base64.b64decode(d.b64_json).startswith(PNG) for d in out.data)
    out = client.images.generate(prompt="a lighthouse at dusk", size="512x512")
    assert len(out.data) == 1 and out.data[0].url.startswith(server.url)
    img = httpx.get(out.data[0].url)
    assert img.status_code == 200 and img.headers["content-type"] == "image/png" and img.content.startswith(PNG)
    text = httpx.get(f"{server.url}/metrics").text
    assert 'argusdiff_requests_total{level="' in text


def test_native_endpoint_reports_level_timings_and_honours_min_quality(server):
    best = server.service.profile.ids[0]
    body = {"prompt": "an astronaut riding a horse", "seed": 7, "tier": "interactive", "min_quality_level": best}
    r = httpx.post(f"{server.url}/v1/argusdiff/generations", json=body, timeout=30)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["status"] == "completed" and data["id"].startswith("gen-")
    img = data["data"][0]
    assert img["level"] == best and img["seed"] == 7 and img["cache_hit"] is False
    assert {"queue_wait_s", "denoise_s"} <= set(img["timings"]) and img["worker"].startswith("local-")
    assert isinstance(img["slo_met"], bool) and img["latency_s"] >= 0


def test_async_submit_and_poll(server):
    r = httpx.post(f"{server.url}/v1/argusdiff/generations", json={"prompt": "a cat", "n": 3, "wait": False})
    assert r.status_code == 202 and r.headers["location"].endswith(r.json()["id"])
    gid = r.json()["id"]
    from argusdiff.service.worker import wait_until

    assert wait_until(lambda: httpx.get(f"{server.url}/v1/argusdiff/generations/{gid}").status_code == 200, 20)
    done = httpx.get(f"{server.url}/v1/argusdiff/generations/{gid}").json()
    assert done["status"] == "completed" and len(done["data"]) == 3
    assert httpx.get(f"{server.url}/v1/argusdiff/generations/gen-unknown").status_code == 404


def test_plan_endpoint(server):
    plan = httpx.get(f"{server.url}/v1/plan").json()
    assert plan["levels"] == list(server.service.profile.ids)
    assert set(plan["assignment"]) == {"local-0", "local-1"} and len(plan["pasm"]) == len(plan["levels"])
    assert abs(sum(plan["share"]) - 1) < 1e-6 and set(plan["workers"]) == {"local-0", "local-1"}
    assert plan["cache"]["healthy"] is True and plan["policy"] == "argus"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({}, 400, "prompt"),
        ({"prompt": ""}, 400, "prompt"),
        ({"prompt": "   "}, 400, "prompt"),
        ({"prompt": 3}, 400, "prompt"),
        ({"prompt": "x" * 5000}, 400, "prompt"),
        ({"prompt": "a", "n": 0}, 400, "n"),
        ({"prompt": "a", "n": 99}, 400, "n"),
        ({"prompt": "a", "n": True}, 400, "n"),
        ({"prompt": "a", "size": "7x7"}, 400, "size"),
        ({"prompt": "a", "response_format": "jpeg"}, 400, "response_format"),
        ({"prompt": "a", "quality": "ultra"}, 400, "quality"),
        ({"prompt": "a", "model": "dall-e-9"}, 400, "model"),
        ({"prompt": "a", "bogus": 1}, 400, "bogus"),
        ([1, 2], 400, None),
    ],
)
def test_openai_validation_names_the_field(server, body, status, param):
    r = httpx.post(f"{server.url}/v1/images/generations", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "a", "slo_s": 0}, "slo_s"),
        ({"prompt": "a", "slo_s": "fast"}, "slo_s"),
        ({"prompt": "a", "tier": "gold"}, "tier"),
        ({"prompt": "a", "seed": -1}, "seed"),
        ({"prompt": "a", "seed": 2**40}, "seed"),
        ({"prompt": "a", "min_quality_level": "nope"}, "min_quality_level"),
        ({"prompt": "a", "wait": "yes"}, "wait"),
    ],
)
def test_native_validation_names_the_field(server, body, param):
    r = httpx.post(f"{server.url}/v1/argusdiff/generations", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_malformed_bodies_routes_and_methods(server):
    url = f"{server.url}/v1/images/generations"
    assert httpx.post(url, content=b"{not json").json()["error"]["code"] == "invalid_json"
    assert httpx.post(url, content=b"").status_code == 400
    assert httpx.post(url, content=b"\xff\xfe").status_code == 400
    big = httpx.post(url, content=b"{" + b" " * 70000 + b"}")
    assert big.status_code == 413 and big.json()["error"]["code"] == "body_too_large"
    wrong = httpx.get(f"{server.url}/v1/argusdiff/generations")
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
    missing = httpx.get(f"{server.url}/v2/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert httpx.get(f"{server.url}/v1/images/nope").status_code == 404


def test_api_keys(live_service):
    server = live_service(service_settings(api_keys=["k1", "k2"]))
    url = f"{server.url}/v1/images/generations"
    body = {"prompt": "a", "response_format": "b64_json"}
    assert httpx.post(url, json=body).status_code == 401
    assert httpx.post(url, json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert httpx.post(url, json=body, headers={"Authorization": "Basic k1"}).status_code == 401
    ok = httpx.post(url, json=body, headers={"Authorization": "Bearer k2"}, timeout=30)
    assert ok.status_code == 200 and len(ok.json()["data"]) == 1
    assert httpx.get(f"{server.url}/healthz").status_code == 200  # probes need no key
    assert httpx.get(f"{server.url}/v1/plan").status_code == 401
