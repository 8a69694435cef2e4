"""Admission in the live service, with stand-in workers (TEST MODE): the phantom-load regression
(a refused ``n > 1`` request left its earlier images counted as load forever) and overload at
twice capacity (refused with 429 + Retry-After, the queue held to what can finish by the deadline,
normal service once the burst ends). Count and state assertions only."""

from __future__ import annotations

import asyncio
import math
import threading

import httpx
import pytest
from fixtures_service import service_settings

from argusdiff.service.worker import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _settings(profile: str, policy: str, scale: float, admission: dict | None = None, **service):
    from argusdiff.config import Settings

    base = service_settings(profile, policy=policy, stand_in_scale=scale, **service).model_dump()
    if admission is not None:
        base["admission"] = admission
    return Settings.model_validate(base)


async def _open_loop(url: str, body: dict, count: int, rate: float) -> list[httpx.Response]:
    """``count`` requests sent at ``rate`` per second whatever the answers (open loop)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        tasks = []
        for k in range(count):
            delay = t0 + k / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(client.post(url, json={**body, "prompt": f"{body['prompt']} {k}"})))
        return list(await asyncio.gather(*tasks))


def _in_flight(server) -> dict[str, int]:
    return httpx.get(f"{server.url}/v1/plan", timeout=10).json()["in_flight"]


@pytest.mark.parametrize("admission", [False, True], ids=["policy-only", "with-admission"])
def test_refused_multi_image_requests_leave_no_phantom_load(live_service, admission):
    """The issue's reproduction, scaled down: diffserve on demo-cpu-cascade, stand-in workers at
    0.5, an open-loop burst of 120 n=4 requests at 40 req/s. DiffServe drops images predicted to miss 1.5 x SLO;
    when it dropped image i > 0 the router answered 429 with images 0..i-1 still counted as load,
    which never cleared: `in_flight` stuck above 0 and every later request refused for good."""
    server = live_service(_settings("demo-cpu-cascade", "diffserve", 0.5, {"enabled": admission}))
    url = f"{server.url}/v1/argusdiff/generations"
    body = {"prompt": "a watercolor fox", "n": 4, "wait": False}
    responses = asyncio.run(_open_loop(url, body, count=120, rate=40.0))
    codes = [r.status_code for r in responses]
    assert set(codes) <= {202, 429}, codes
    refused = [r for r in responses if r.status_code == 429]
    assert refused and codes.count(202) > 0  # the burst overloaded the light level
    assert all(r.json()["error"]["code"] == "overloaded" and int(r.headers["retry-after"]) >= 1 for r in refused)
    # the policy's own drops happened (the path of the bug): DiffServe's 1.5 x SLO rule
    assert any("1.5 x SLO" in r.json()["error"]["message"] for r in refused)
    # once the accepted images are done, nothing stays in flight
    assert wait_until(lambda: sum(_in_flight(server).values()) == 0, 60, 0.1), _in_flight(server)
    router = server.service.router
    assert not router.inflight and sum(router.level_load.values()) == 0
    # and an idle service answers normally again
    r = httpx.post(url, json={"prompt": "a quiet harbour", "n": 4}, timeout=60)
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == 4


def test_overload_at_twice_capacity_refuses_the_excess_and_recovers(live_service):
    """argus on sm-a100 with 2 stand-in workers at 0.05 x the profiled latencies, requests with a
    3 x SD-XL SLO, sent at twice the most the cluster can serve (both workers at its fastest level):
    the excess is refused at once (429 overloaded with a Retry-After from the backlog), no level
    ever holds more than can finish by the deadline, and the service serves normally afterwards."""
    from argusdiff.profile import load_profile

    scale = 0.05
    profile = load_profile("sm-a100")
    slo = 3 * profile.best.latency(1) * scale
    fastest = min(lv.latency(1) for lv in profile.levels) * scale
    capacity = 2 / fastest  # requests per second, both workers at the fastest level
    server = live_service(_settings("sm-a100", "argus", scale))
    router = server.service.router
    adm = router.admission.config
    # the most a level may hold (at most 2 workers, one at a time): a request is admitted behind
    # q on the least loaded worker while (q // 2 + 1) x latency <= deadline_factor x SLO, so the
    # level holds at most 2 x floor(budget / latency) with the last one admitted
    budget = adm.deadline_factor * slo
    bound = {lv.id: 2 * math.floor(budget / (lv.latency(1) * scale) + 1e-9) for lv in profile.levels}
    peak: dict[str, int] = {}
    stop = threading.Event()

    def watch() -> None:  # samples the router's in-flight count per level during the burst
        while not stop.is_set():
            try:
                load = dict(router.level_load)
            except RuntimeError:  # changed while copied
                continue
            for lv, k in load.items():
                peak[lv] = max(peak.get(lv, 0), k)
            stop.wait(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    url = f"{server.url}/v1/argusdiff/generations"
    body = {"prompt": "a lighthouse in a storm", "slo_s": slo}
    try:
        responses = asyncio.run(_open_loop(url, body, count=int(2 * capacity * 4), rate=2 * capacity))
    finally:
        stop.set()
        watcher.join(5)
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 429}, codes
    refused = [r for r in responses if r.status_code == 429]
    served = [r for r in responses if r.status_code == 200]
    assert refused and served
    retry = [int(r.headers["retry-after"]) for r in refused]
    assert all(r.json()["error"]["code"] == "overloaded" for r in refused)
    assert all(1 <= s <= adm.max_retry_after_s for s in retry)
    # admission refused them (not the policy: argus drops nothing), at once and by its deadline test
    text = httpx.get(f"{server.url}/metrics").text
    assert 'argusdiff_refused_total{reason="definitely late"}' in text
    assert all("definitely late" in r.json()["error"]["message"] for r in refused)
    # no level held more than what can finish by the deadline (the state admission guarantees)
    assert peak and all(k <= bound[lv] for lv, k in peak.items()), (peak, bound)
    # the burst is over: nothing stays in flight, and requests are served normally again
    assert wait_until(lambda: sum(_in_flight(server).values()) == 0, 30, 0.05), _in_flight(server)
    after = [httpx.post(url, json={**body, "prompt": f"after {k}"}, timeout=30) for k in range(5)]
    assert [r.status_code for r in after] == [200] * 5
