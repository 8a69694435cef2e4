"""HTTP conventions clients expect of a text-to-image endpoint: the ``/health`` alias, 405 (not 404)
for a GET on a POST-only route, 415 for a body that is not JSON, a lone surrogate in a JSON key
named in the message, a burst of 429s told to come back spread over the backlog, and the CLI
refusing what the API refuses."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fixtures_service import service_settings

from argusdiff.cli import main

pytestmark = pytest.mark.integration


@pytest.fixture
def server(live_service):
    return live_service(service_settings())


def test_health_alias_405_and_415(server):
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    for path in ("/v1/images/generations", "/v1/images/edits", "/v1/argusdiff/generations"):
        r = httpx.get(f"{server.url}{path}")
        assert r.status_code == 405, (path, r.text)
        assert r.json()["error"]["code"] == "method_not_allowed" and "POST" in r.headers["allow"]
    url = f"{server.url}/v1/images/generations"
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = httpx.post(url, content=b'{"prompt": "a fox"}', headers={"Content-Type": ctype})
        assert r.status_code == 415, (ctype, r.text)
        err = r.json()["error"]
        assert err["code"] == "unsupported_media_type" and err["param"] == "Content-Type"
        assert "application/json" in err["message"]
    ok = httpx.post(url, content=b'{"prompt": "a fox", "response_format": "b64_json"}',
                    headers={"Content-Type": "application/json; charset=utf-8"}, timeout=30)  # fmt: skip
    assert ok.status_code == 200, ok.text
    text = httpx.get(f"{server.url}/metrics").text
    assert 'argusdiff_http_responses_total{route="images_generations",status="415"}' in text


def test_a_lone_surrogate_in_a_json_key_is_named(server):
    for path in ("/v1/images/generations", "/v1/argusdiff/generations"):
        raw = b'{"prompt": "a fox", "sty\\ud800le": 1}'
        r = httpx.post(f"{server.url}{path}", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "sty\\ud800le" and "sty\\ud800le" in err["message"] and "surrogate" in err["message"]


def test_a_burst_of_refusals_is_spread_over_the_backlog(live_service):
    """sm-a100 at the profiled latencies (stand-ins x 1): a burst far over what the levels can
    finish by the deadline. The refused requests are told to come back spread over the time the
    backlog needs, not all after the same second."""
    from argusdiff.config import Settings

    base = service_settings("sm-a100", stand_in_scale=1.0, drain_timeout_s=0.5).model_dump()
    base["admission"] = {"queue_cap": 2}
    server = live_service(Settings.model_validate(base))

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            out = []
            for k in range(30):  # one after another: the order of the refusals is known
                out.append(await client.post(f"{server.url}/v1/argusdiff/generations",
                                             json={"prompt": f"a fox {k}", "wait": False}))  # fmt: skip
            return out

    responses = asyncio.run(burst())
    refused: dict[str, list[int]] = {}  # per level (a plan change mid-burst may route to another)
    for r in responses:
        if r.status_code == 429:
            level = r.json()["error"]["message"].split(" at ", 1)[1].split(")", 1)[0]
            refused.setdefault(level, []).append(int(r.headers["retry-after"]))
    longest = max(refused.values(), key=len)
    assert len(longest) >= 8, refused
    cap = server.service.router.admission.config.max_retry_after_s
    for seconds in refused.values():
        assert min(seconds) >= 1 and max(seconds) <= cap, refused
    # each refusal at a level is told one image interval later than the one before: the burst's
    # retries spread out (the first and the last of it are seconds apart), not all after 1 s
    assert longest[-1] > longest[0] + 1, refused


def test_cli_refuses_what_the_api_refuses(capsys):
    for prompt in ("", "   ", "a\x00b"):
        assert main(["generate", prompt, "--out", "/tmp/never.png"]) == 2
        err = capsys.readouterr().err
        assert "prompt" in err and "Traceback" not in err
    base = ["plan", "--profile", "unified-a100", "--gpus", "8", "--load-qpm", "180", "--tiers"]
    for mix in ("interactive=2", "interactive=0.2,standard=0.5", "interactive=0.5,interactive=0.5"):
        assert main([*base, mix]) == 2, mix
        assert "--tiers" in capsys.readouterr().err
