"""The distributed service: router + control loop in one process, `argusdiff worker` processes
(stand-in TEST MODE executors) over a real redis-server; fault tests."""

from __future__ import annotations

import os
import signal

import httpx
import pytest
from fixtures_service import service_settings

from argusdiff.service.worker import wait_until

pytestmark = pytest.mark.integration


def _settings(url: str, **kw):
    return service_settings(redis_url=url, workers=0, **kw)


def _wait_workers(server, n: int, timeout: float = 30.0) -> None:
    def ok() -> bool:
        plan = server.service.router.plan
        joined = plan is not None and sum(lv is not None for lv in plan.assignment.values()) >= n
        return joined and len(server.service.serving) >= n  # and they serve their levels (ready)

    assert wait_until(ok, timeout), f"fewer than {n} workers joined the plan and serve a level"


def _poll(server, gid: str, timeout: float = 60.0) -> dict:
    def done() -> bool:
        try:
            return httpx.get(f"{server.url}/v1/argusdiff/generations/{gid}", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    assert wait_until(done, timeout, interval=0.05), f"{gid} did not complete"
    return httpx.get(f"{server.url}/v1/argusdiff/generations/{gid}").json()


def test_openai_client_through_redis_workers(redis_any, live_service, worker_procs):
    openai = pytest.importorskip("openai")
    server = live_service(_settings(redis_any.url), ready=False)
    worker_procs(redis_any.url, "w1")
    worker_procs(redis_any.url, "w2")
    _wait_workers(server, 2)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    out = client.images.generate(prompt="a castle on a hill", n=3, response_format="b64_json")
    assert len(out.data) == 3

    def workers_follow_plan() -> bool:
        plan = httpx.get(f"{server.url}/v1/plan").json()
        return set(plan["workers"]) == {"w1", "w2"} and all(
            info["level"] == plan["assignment"][w] for w, info in plan["workers"].items()
        )

    assert wait_until(workers_follow_plan, 20, 0.1)


def test_killed_worker_mid_request_completes_elsewhere(redis_any, live_service, worker_procs):
    # every request takes ~1 s on a stand-in worker (sm-a100 levels, scale 0.25-ish)
    server = live_service(_settings(redis_any.url), ready=False)
    procs = {w: worker_procs(redis_any.url, w, scale=0.5) for w in ("w1", "w2")}
    _wait_workers(server, 2)
    queue = server.service.dispatch.queue
    best = server.service.profile.ids[0]
    r = httpx.post(
        f"{server.url}/v1/argusdiff/generations",
        json={"prompt": "a slow painting", "wait": False, "min_quality_level": best},
    )
    assert r.status_code == 202
    gid = r.json()["id"]
    level = r.json()["levels"][0]
    holder: list[str] = []

    def taken() -> bool:
        pending = queue.pending_by_consumer(level)
        holder[:] = [w for w, n in pending.items() if n]
        return bool(holder)

    assert wait_until(taken, 20), "no worker took the request"
    victim = holder[0]
    os.kill(procs[victim].pid, signal.SIGKILL)
    done = _poll(server, gid, timeout=60)
    assert done["data"][0]["worker"] != victim
    assert server.service.control.requeued >= 1
    plan = httpx.get(f"{server.url}/v1/plan").json()
    assert victim not in plan["assignment"]


def test_redis_outage_gives_503_and_loses_nothing(redis_server, live_service, worker_procs):
    server = live_service(_settings(redis_server.url), ready=False)
    worker_procs(redis_server.url, "w1", scale=0.05)
    worker_procs(redis_server.url, "w2", scale=0.05)
    _wait_workers(server, 2)
    url = f"{server.url}/v1/argusdiff/generations"
    accepted = []
    for i in range(10):
        r = httpx.post(url, json={"prompt": f"prompt {i}", "wait": False})
        assert r.status_code == 202
        accepted.append(r.json()["id"])
    redis_server.stop()
    statuses = []
    for _ in range(5):
        r = httpx.post(url, json={"prompt": "during the outage", "wait": False}, timeout=10)
        statuses.append(r.status_code)
        if r.status_code == 503:
            assert r.headers["retry-after"].isdigit() and r.json()["error"]["code"] == "queue_unavailable"
    assert 503 in statuses and all(s in (202, 503) for s in statuses)
    # a 202 during the outage would be a request accepted without being stored: there must be none
    assert 202 not in statuses
    # reading an accepted generation during the outage: 503 with Retry-After as well, never a 500
    r = httpx.get(f"{url}/{accepted[0]}", timeout=10)
    assert r.status_code == 503 and r.headers["retry-after"].isdigit(), r.text
    assert httpx.get(f"{server.url}/readyz").status_code == 503
    redis_server.start()  # same port, AOF restores the streams
    assert wait_until(lambda: httpx.get(f"{server.url}/readyz").status_code == 200, 30, 0.1)
    for gid in accepted:
        assert _poll(server, gid)["status"] == "completed"
    r = httpx.post(url, json={"prompt": "after the outage"}, timeout=30)
    assert r.status_code == 200


def test_router_restart_loses_no_accepted_request(redis_server, live_service, worker_procs):
    first = live_service(_settings(redis_server.url), ready=False)
    worker_procs(redis_server.url, "w1", scale=0.1)
    _wait_workers(first, 1)
    url = f"{first.url}/v1/argusdiff/generations"
    ids = [httpx.post(url, json={"prompt": f"p{i}", "wait": False}).json()["id"] for i in range(8)]
    version = first.service.control.plan.version
    first.stop()
    second = live_service(_settings(redis_server.url), ready=False)
    _wait_workers(second, 1)
    assert second.service.control.plan.version > version  # plan versions continue after a restart
    for gid in ids:
        assert _poll(second, gid)["status"] == "completed"
