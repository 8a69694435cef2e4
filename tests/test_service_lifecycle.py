"""The request lifecycle on a live server: truthful readiness, client disconnects (mid-body,
waiting, streaming), slow bodies, waits on lost work, bounded shutdown, bounded result memory,
and URLs that never come from the request's Host header."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from fixtures_service import free_port, service_settings, stop_process

from argusdiff.service.worker import wait_until

pytestmark = pytest.mark.integration

SLOW = {"min_quality_level": "sd-xl", "slo_s": 600}  # sm-a100's best level: 4.2 s at stand-in scale 1


def metric(server, name: str, **labels: str) -> float:
    """The value of one sample of ``/metrics`` (0 when absent)."""
    text = httpx.get(f"{server.url}/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head == (f"{name}{{{want}}}" if want else name):
            return float(value)
    return 0.0


def raw(server, body: bytes, *, path: str = "/v1/argusdiff/generations", length: int | None = None) -> socket.socket:
    """A socket that sent a POST with ``body`` (and ``Content-Length: length``)."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def post_in_thread(url: str, body: dict) -> tuple[threading.Thread, list]:
    out: list = []

    def go() -> None:
        try:
            out.append(httpx.post(url, json=body, timeout=120))
        except httpx.HTTPError as exc:
            out.append(exc)

    t = threading.Thread(target=go)
    t.start()
    return t, out


def queued_in_thread(server, url: str, body: dict, inflight: int, tries: int = 5) -> tuple[threading.Thread, list]:
    """:func:`post_in_thread` until the router holds ``inflight`` images in flight. A request the
    service answers at once (a 429 while the plan has moved the only worker off the request's
    quality floor for a control period, say) is sent again, as a client honouring Retry-After
    would, up to ``tries`` times; the last answer is shown if it never queues."""

    def queued() -> bool:
        return len(server.service.router.inflight) >= inflight

    for _ in range(tries):
        t, out = post_in_thread(url, body)
        wait_until(lambda t=t: queued() or not t.is_alive(), 30)
        if queued():
            return t, out
        t.join(5)
        time.sleep(0.5)
    raise AssertionError(f"never {inflight} in flight; the last answer: {_shown(out)}")


def _shown(out: list) -> str:
    if not out:
        return "none"
    r = out[0]
    return f"{r.status_code} {r.text[:300]}" if isinstance(r, httpx.Response) else repr(r)


def test_readiness_tells_the_truth_when_no_worker_can_load_its_model(live_service, tmp_path, monkeypatch):
    """sdxl-ac-a100 with no weights and no hub: /readyz 503 with the reason, requests a fast 503."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    settings = service_settings("sdxl-ac-a100", workers=1, stand_in_scale=None, request_timeout_s=300)
    data = settings.model_dump()
    data["workers"].update(models_dir=str(tmp_path / "models"), device="cpu")
    data["cache"].update(path=str(tmp_path / "cache"))
    server = live_service(type(settings).model_validate(data), ready=False)
    assert wait_until(lambda: server.service.waiting_workers.get("local-0", {}).get("last_error"), 120)
    ready = httpx.get(f"{server.url}/readyz")
    body = ready.json()
    assert ready.status_code == 503 and body["ready"] is False and body["workers_serving"] == 0
    assert "local-0" in body["reason"] and "cannot serve level" in body["reason"], body["reason"]
    r = httpx.post(f"{server.url}/v1/images/generations", json={"prompt": "a fox"}, timeout=60)
    assert r.status_code == 503 and r.headers["retry-after"], r.text
    err = r.json()["error"]
    assert err["code"] == "no_worker_ready" and "cannot serve level" in err["message"]
    assert server.service.router.accepted == 0  # nothing was queued to wait for 300 s


def test_a_client_gone_mid_body_is_a_499_without_an_error_log(live_service, caplog):
    server = live_service(service_settings())
    with caplog.at_level(logging.INFO):
        raw(server, b'{"prompt": "a', length=100).close()
        assert wait_until(lambda: metric(server, "argusdiff_http_responses_total", route="generations",
                                         status="499") == 1, 10)  # fmt: skip
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    assert metric(server, "argusdiff_http_responses_total", route="generations", status="500") == 0


def test_a_slow_body_gets_408(live_service):
    server = live_service(service_settings(body_timeout_s=0.3))
    sock = raw(server, b'{"prompt": ', length=100)
    sock.settimeout(30)
    reply = b""
    while chunk := sock.recv(4096):  # the server closes the connection after its answer
        reply += chunk
    sock.close()
    reply = reply.decode()
    assert reply.startswith("HTTP/1.1 408") and "body_timeout" in reply


def test_a_client_gone_while_queued_cancels_its_work(live_service):
    server = live_service(service_settings(workers=1, stand_in_scale=1.0))
    url = f"{server.url}/v1/argusdiff/generations"
    first, out = post_in_thread(url, {"prompt": "the worker is busy with this", **SLOW})
    router = server.service.router
    assert wait_until(lambda: len(router.inflight) == 1, 10)
    sock = raw(server, json.dumps({"prompt": "nobody waits for this", **SLOW}).encode())
    assert wait_until(lambda: len(router.inflight) == 2, 10)
    sock.close()  # gone while its item waits behind the first
    assert wait_until(lambda: metric(server, "argusdiff_requests_total", level="sd-xl", outcome="cancelled") == 1, 10)
    assert metric(server, "argusdiff_http_responses_total", route="generations", status="499") == 1
    first.join(60)
    assert out[0].status_code == 200
    assert wait_until(lambda: not router.inflight, 10) and router.completed == 1  # the cancelled one never ran


def test_a_client_gone_while_its_image_is_generated_stops_it(live_service):
    server = live_service(service_settings(workers=1, stand_in_scale=1.0))
    router, dispatch = server.service.router, server.service.dispatch
    sock = raw(server, json.dumps({"prompt": "started, then abandoned", **SLOW}).encode())
    assert wait_until(lambda: len(router.inflight) == 1, 10)
    rid = next(iter(router.inflight))
    assert wait_until(lambda: server.service.dispatch.queue.qsize("sd-xl") == 0, 10)  # a worker took it
    sock.close()
    assert wait_until(lambda: router.completed == 1, 30)  # stopped at its next step (tests/test_cancel.py) ...
    assert dispatch.results.get(rid) is None and rid not in dispatch._deliveries  # ... and nothing kept
    assert metric(server, "argusdiff_http_responses_total", route="generations", status="499") == 1
    assert metric(server, "argusdiff_requests_total", level="sd-xl", outcome="cancelled") == 1
    assert server.service.workers[0].worker.stats.cancelled == 1


def test_urls_never_come_from_the_host_header(live_service):
    server = live_service(service_settings())
    r = httpx.post(f"{server.url}/v1/images/generations", json={"prompt": "a"}, headers={"Host": "evil.example:666"})
    url = r.json()["data"][0]["url"]
    assert url.startswith(f"{server.url}/v1/images/") and "evil" not in url
    assert httpx.get(url).status_code == 200
    public = live_service(service_settings(public_url="https://images.example.com/base/"))
    r = httpx.post(f"{public.url}/v1/images/generations", json={"prompt": "a"}, headers={"Host": "evil.example"})
    assert r.json()["data"][0]["url"].startswith("https://images.example.com/base/v1/images/gen-")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"prompt": "a", "slo_s": 1' + b"0" * 400 + b"}", "slo_s"),
        (b'{"prompt": "a\\ud800b"}', "prompt"),
    ],
)
def test_hostile_values_are_400_naming_the_field(live_service, body, param):
    server = live_service(service_settings())
    r = httpx.post(f"{server.url}/v1/argusdiff/generations", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.post(f"{server.url}/v1/images/generations", content=body.replace(b', "slo_s"', b', "n"'))
    assert r.status_code == 400, r.text


def test_results_in_memory_are_capped_and_kept_images_outlive_eviction(live_service, tmp_path):
    server = live_service(service_settings(result_memory_mb=0.01, image_path=str(tmp_path / "images")))
    dispatch = server.service.dispatch
    native = f"{server.url}/v1/argusdiff/generations"
    later = httpx.post(native, json={"prompt": "collected later", "wait": False}).json()["id"]
    for i in range(25):
        assert httpx.post(native, json={"prompt": f"image {i}"}, timeout=30).status_code == 200
    assert dispatch.results.bytes <= dispatch.results.max_bytes and dispatch.results.evicted >= 10
    assert metric(server, "argusdiff_result_memory_bytes") <= dispatch.results.max_bytes
    done = httpx.get(f"{native}/{later}").json()  # nobody waited: its image went to the image store
    assert done["status"] == "completed" and done["data"][0]["b64_json"]
    assert os.listdir(tmp_path / "images") == [f"{later}-0.png"]
    url = httpx.post(f"{server.url}/v1/images/generations", json={"prompt": "u", "output_format": "jpeg"}).json()
    img = httpx.get(url["data"][0]["url"])
    assert img.headers["content-type"] == "image/jpeg" and img.content[:2] == b"\xff\xd8"


def test_shutdown_is_bounded_by_drain_timeout(tmp_path):
    port = free_port()
    env = dict(os.environ, ARGUSDIFF_SERVICE__DRAIN_TIMEOUT_S="1", ARGUSDIFF_SERVICE__CONTROL_PERIOD_S="0.5",
               ARGUSDIFF_SERVICE__HEARTBEAT_S="0.1",
               ARGUSDIFF_SERVICE__IMAGE_PATH=str(tmp_path / "images"))  # fmt: skip
    cmd = [sys.executable, "-m", "argusdiff", "serve", "--profile", "sm-a100", "--workers", "1",
           "--stand-in-workers", "10", "--port", str(port), "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            try:
                return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(ready, 60, 0.1)
        waiting, out = post_in_thread(f"{url}/v1/argusdiff/generations", {"prompt": "42 s of work", **SLOW})
        assert wait_until(lambda: httpx.get(f"{url}/v1/plan").json()["in_flight"].get("sd-xl") == 1, 10)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)  # far below the 300 s request timeout and the 42 s of work
        waiting.join(10)
        assert out and out[0].status_code == 503 and out[0].json()["error"]["code"] == "shutting_down"
        stderr = proc.stderr.read()
        # uvicorn re-raises the signal it handled once it has shut down: exit status -SIGTERM
        assert proc.returncode in (0, -signal.SIGTERM) and "Traceback" not in stderr, stderr[-2000:]
    finally:
        if proc.poll() is None:
            stop_process(proc)


def _wipe(redis_server) -> None:
    """Restart Redis without its data, as a restart without AOF does."""
    redis_server.stop()
    for name in os.listdir(redis_server.workdir):
        if re.match(r"appendonly|dump\.rdb", name):
            path = redis_server.workdir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    redis_server.start()


def test_a_wait_on_work_redis_lost_ends_with_503(redis_server, live_service, worker_procs):
    server = live_service(service_settings(redis_url=redis_server.url, workers=0), ready=False)
    worker_procs(redis_server.url, "w1", scale=1.0)
    assert wait_until(lambda: server.service.serving, 30)
    url = f"{server.url}/v1/argusdiff/generations"
    first, _ = queued_in_thread(server, url, {"prompt": "running when Redis loses everything", **SLOW}, 1)
    second, out = queued_in_thread(server, url, {"prompt": "queued when Redis loses everything", **SLOW}, 2)
    _wipe(redis_server)
    second.join(60)  # not request_timeout_s (300 s)
    assert out and out[0].status_code == 503, out
    assert out[0].json()["error"]["code"] == "work_lost"
    first.join(60)
    assert metric(server, "argusdiff_requests_total", level="sd-xl", outcome="lost") >= 1
